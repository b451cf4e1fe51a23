/**
 * leader_election.js — which tab of a browser holds a shared connection.
 *
 * Used by ./shared_stream.js (the session page's event stream) and ./shared_feed.js (the
 * dashboard's operator feed): one tab is elected per name; when it resigns, closes or dies,
 * another one is. Web Locks (`navigator.locks.request(name)`) where the page is a secure
 * context; where it is not (`navigator.locks` is undefined on plain http:// to anything but
 * loopback), a lease in localStorage (`{owner, until}`, renewed every `renewMs`, `leaseMs`
 * long) checked over a BroadcastChannel: a tab takes an expired lease only when the holder
 * answers no ping within `confirmMs` (a hidden tab's timers are throttled, its message
 * handler is not), then confirms it won. Two leaders after a race are resolved by tab id:
 * the larger one is deposed. docs/protocol.md, "Many tabs, one stream".
 *
 * Exports: `LeaderElection`, `electionMode(env)`, `newTabId()`, `safeCall(fn, ...args)`.
 * No DOM dependency: runs in the browser and under Node 20 with injected fakes.
 */

const LEASE_MS = 3000;
const RENEW_MS = 1000;
const CONFIRM_MS = 250;

/** "locks" where `env` is a secure context with the Web Locks API, else "lease". */
export function electionMode(env = globalThis) {
  return env.isSecureContext && env.navigator && env.navigator.locks ? "locks" : "lease";
}

/** A random id for this tab (unique enough to tell tabs of one browser apart). */
export function newTabId(random = Math.random) {
  return `${Date.now().toString(36)}-${random().toString(36).slice(2, 10)}`;
}

export function safeCall(fn, ...args) {
  if (typeof fn !== "function") return;
  try {
    fn(...args);
  } catch (error) {
    console.error("shared stream callback failed:", error);
  }
}

/**
 * Elects one leader among the tabs that use the same `name`.
 *
 * Options: name (string), onElected(), onDeposed() (lease mode: another tab holds the
 * lease now; the election goes on and may elect this tab again), tabId, mode ("locks" |
 * "lease", default `electionMode()`), locks (default navigator.locks), storage (default
 * localStorage), channel (a BroadcastChannel-like object for the lease's pings; default a
 * new BroadcastChannel(`${name}:election`)), addStorageListener(fn) → remove(), now,
 * setInterval, clearInterval, setTimeout, leaseMs, renewMs, confirmMs.
 * Never throws after construction; callbacks that throw are logged.
 */
export class LeaderElection {
  constructor(options) {
    const env = globalThis;
    this._name = String(options.name);
    this._onElected = options.onElected;
    this._onDeposed = options.onDeposed;
    this._tabId = options.tabId ?? newTabId();
    this._mode = options.mode ?? electionMode(env);
    this._locks = options.locks ?? env.navigator?.locks;
    this._storage = options.storage ?? env.localStorage;
    this._channel = options.channel ?? null;
    this._addStorageListener =
      options.addStorageListener ??
      ((fn) => {
        if (typeof env.addEventListener !== "function") return () => {};
        env.addEventListener("storage", fn);
        return () => env.removeEventListener("storage", fn);
      });
    this._now = options.now ?? (() => Date.now());
    this._setInterval = options.setInterval ?? ((fn, ms) => env.setInterval(fn, ms));
    this._clearInterval = options.clearInterval ?? ((handle) => env.clearInterval(handle));
    this._setTimeout = options.setTimeout ?? ((fn, ms) => env.setTimeout(fn, ms));
    this._leaseMs = options.leaseMs ?? LEASE_MS;
    this._renewMs = options.renewMs ?? RENEW_MS;
    this._confirmMs = options.confirmMs ?? CONFIRM_MS;
    this._key = `${this._name}:lease`;
    this._leader = false;
    this._started = false;
    this._stopped = false;
    this._claiming = false;
    this._ponged = false;
    this._release = null;
    this._abort = null;
    this._interval = null;
    this._removeStorageListener = null;
    this._ownChannel = false;
  }

  /** "locks" or "lease". */
  get mode() {
    return this._mode;
  }

  get isLeader() {
    return this._leader;
  }

  get tabId() {
    return this._tabId;
  }

  /** Start competing (once). */
  start() {
    if (this._started || this._stopped) return this;
    this._started = true;
    if (this._mode === "locks") this._startLocks();
    else this._startLease();
    return this;
  }

  /** Give up: release the leadership, or stop waiting for it. Final. Never throws. */
  resign() {
    if (this._stopped) return;
    this._stopped = true;
    const wasLeader = this._leader;
    this._leader = false;
    if (this._mode === "locks") {
      if (this._release !== null) this._release();
      else if (this._abort !== null) this._abort.abort();
      return;
    }
    if (this._interval !== null) this._clearInterval(this._interval);
    if (this._removeStorageListener !== null) this._removeStorageListener();
    if (wasLeader) {
      const lease = this._read();
      try {
        if (lease !== null && lease.owner === this._tabId) this._storage.removeItem(this._key);
      } catch {
        // storage refused (quota, privacy mode): the lease simply expires
      }
      this._post({ e: "resign", from: this._tabId });
    }
    if (this._channel !== null) {
      this._channel.onmessage = null;
      if (this._ownChannel) this._channel.close();
    }
  }

  // -- Web Locks ---------------------------------------------------------------------

  _startLocks() {
    this._abort = new AbortController();
    this._locks
      .request(this._name, { signal: this._abort.signal }, () => {
        if (this._stopped) return undefined;
        this._leader = true;
        // Held until resign() (or until the tab goes away: the browser releases it).
        const held = new Promise((resolve) => {
          this._release = resolve;
        });
        safeCall(this._onElected);
        return held;
      })
      .catch(() => {}); // AbortError: resign() while waiting
  }

  // -- the localStorage lease --------------------------------------------------------

  _startLease() {
    if (this._channel === null && typeof globalThis.BroadcastChannel === "function") {
      this._channel = new globalThis.BroadcastChannel(`${this._name}:election`);
      this._ownChannel = true;
    }
    if (this._channel !== null) this._channel.onmessage = (event) => this._onMessage(event.data);
    this._removeStorageListener = this._addStorageListener((event) => {
      if (event.key === this._key || event.key === null) this._tick();
    });
    this._interval = this._setInterval(() => this._tick(), this._renewMs);
    this._tick();
  }

  _post(message) {
    if (this._channel === null) return;
    try {
      this._channel.postMessage(message);
    } catch {
      // a closed channel: nobody to tell
    }
  }

  _onMessage(message) {
    if (this._stopped || message === null || typeof message !== "object") return;
    if (message.from === this._tabId) return;
    switch (message.e) {
      case "ping":
        if (this._leader) {
          this._write();
          this._post({ e: "pong", from: this._tabId });
        }
        break;
      case "pong":
        this._ponged = true;
        break;
      case "leader":
        // Two leaders after a race: the larger id steps down.
        if (this._leader && message.from < this._tabId) this._depose();
        break;
      case "resign":
        this._tick();
        break;
      default:
        break;
    }
  }

  _read() {
    try {
      const value = JSON.parse(this._storage.getItem(this._key) ?? "null");
      if (value && typeof value.owner === "string" && typeof value.until === "number") return value;
    } catch {
      // unreadable: as if absent
    }
    return null;
  }

  _write() {
    try {
      this._storage.setItem(this._key, JSON.stringify({ owner: this._tabId, until: this._now() + this._leaseMs }));
      return true;
    } catch {
      return false;
    }
  }

  _depose() {
    this._leader = false;
    safeCall(this._onDeposed);
  }

  _tick() {
    if (this._stopped) return;
    const lease = this._read();
    const now = this._now();
    const heldByOther = lease !== null && lease.owner !== this._tabId && lease.until > now;
    if (this._leader) {
      if (heldByOther && lease.owner < this._tabId) {
        this._depose();
        return;
      }
      this._write();
      return;
    }
    if (heldByOther || this._claiming) return;
    // Expired or absent: ask whether the holder is alive (a hidden tab's timers may be
    // throttled; its message handler is not), then claim and confirm.
    this._claiming = true;
    this._ponged = false;
    const holderMayLive = lease !== null && lease.owner !== this._tabId;
    if (holderMayLive) this._post({ e: "ping", from: this._tabId });
    this._setTimeout(
      () => {
        if (this._stopped) {
          this._claiming = false;
          return;
        }
        if (this._ponged) {
          this._claiming = false;
          return;
        }
        const current = this._read();
        if (current !== null && current.owner !== this._tabId && current.until > this._now()) {
          this._claiming = false; // someone else claimed first
          return;
        }
        if (!this._write()) {
          // No usable localStorage (privacy settings, quota): no way to agree with the
          // other tabs, so this one holds its own stream (followers skip duplicate ids).
          this._claiming = false;
          this._leader = true;
          safeCall(this._onElected);
          return;
        }
        this._setTimeout(
          () => {
            this._claiming = false;
            if (this._stopped) return;
            const confirmed = this._read();
            if (confirmed !== null && confirmed.owner === this._tabId && !this._leader) {
              this._leader = true;
              this._write();
              this._post({ e: "leader", from: this._tabId });
              safeCall(this._onElected);
            }
          },
          this._confirmMs,
        );
      },
      holderMayLive ? this._confirmMs : 0,
    );
  }
}
