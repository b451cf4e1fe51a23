/**
 * shared_feed.js — the dashboard's operator feed, one `EventSource` per browser.
 *
 * The dashboard tabs elect a leader (./leader_election.js) that holds the EventSource and
 * posts its named events to the others over a BroadcastChannel. docs/protocol.md, "Many
 * tabs, one stream".
 */
import { LeaderElection, newTabId, safeCall } from "./leader_election.js";

/**
 * The operator feed (an `EventSource` of named events) shared by the dashboard tabs.
 *
 * Options: key, open() → EventSource-like (called on the leader), events (the event names
 * to forward), closeOn (event names after which the leader closes its source for good),
 * onMessage(type, data), onOpen(), onError(), onRoleChange(role),
 * onConnectionWait(waiting), connectWaitMs (5000), createChannel, createElection.
 * The leader forwards each named event's `data` and its open/error states; a follower
 * that becomes leader opens its own EventSource (missed activity is gone, the next
 * `stats` repairs the counts, as on any EventSource reconnect).
 */
export class SharedFeed {
  constructor(options) {
    this._options = options;
    this._tabId = options.tabId ?? newTabId();
    const BC = globalThis.BroadcastChannel;
    this._createChannel = options.createChannel ?? (typeof BC === "function" ? (name) => new BC(name) : null);
    this._createElection = options.createElection ?? ((electionOptions) => new LeaderElection(electionOptions));
    this._source = null;
    this._channel = null;
    this._election = null;
    this._role = "idle";
    this._closed = false;
    this._waitTimer = null;
    this._waiting = false;
    this._lastState = null;
    this._lastEvents = new Map();
  }

  get role() {
    return this._role;
  }

  get mode() {
    return this._election !== null ? this._election.mode : "none";
  }

  start() {
    if (this._role !== "idle") return this;
    const name = `qwenweb-feed:${this._options.key}`;
    if (this._createChannel === null) {
      this._lead();
      return this;
    }
    this._channel = this._createChannel(name);
    this._channel.onmessage = (event) => this._onMessage(event.data);
    this._setRole("electing");
    this._post({ k: "hello", from: this._tabId });
    this._election = this._createElection({
      name,
      tabId: this._tabId,
      onElected: () => this._lead(),
      onDeposed: () => this._unlead(),
    });
    this._election.start();
    return this;
  }

  close() {
    if (this._closed) return;
    this._closed = true;
    this._unlead();
    if (this._election !== null) this._election.resign();
    if (this._channel !== null) {
      this._post({ k: "bye", from: this._tabId });
      this._channel.onmessage = null;
      this._channel.close();
    }
  }

  _setRole(role) {
    if (this._role === role) return;
    this._role = role;
    safeCall(this._options.onRoleChange, role);
  }

  _post(message) {
    if (this._channel === null) return;
    try {
      this._channel.postMessage(message);
    } catch {
      // closed
    }
  }

  _wait(waiting) {
    if (this._waiting === waiting) return;
    this._waiting = waiting;
    safeCall(this._options.onConnectionWait, waiting);
  }

  _lead() {
    if (this._closed) return;
    this._setRole("leader");
    const source = this._options.open();
    this._source = source;
    const relay = (kind, extra = {}) => {
      if (this._source !== source) return false;
      if (kind === "open" || kind === "error") this._lastState = kind;
      this._post({ k: kind, from: this._tabId, ...extra });
      return true;
    };
    const clearWait = () => {
      clearTimeout(this._waitTimer);
      this._waitTimer = null;
      this._wait(false);
      relay("wait", { waiting: false });
    };
    this._waitTimer = setTimeout(() => {
      if (this._source !== source || source.readyState === 1) return;
      this._wait(true);
      relay("wait", { waiting: true });
    }, this._options.connectWaitMs ?? 5000);
    source.addEventListener("open", () => {
      clearWait();
      if (relay("open")) safeCall(this._options.onOpen);
    });
    source.addEventListener("error", () => {
      if (relay("error")) safeCall(this._options.onError);
    });
    for (const type of this._options.events) {
      source.addEventListener(type, (event) => {
        if (this._source !== source) return;
        if (type === "stream-open") {
          clearWait();
          this._lastState = "open";
        }
        this._lastEvents.set(type, event.data);
        this._post({ k: "event", from: this._tabId, type, data: event.data });
        safeCall(this._options.onMessage, type, event.data);
        if ((this._options.closeOn ?? []).includes(type)) source.close(); // refused: no retry
      });
    }
  }

  _unlead() {
    clearTimeout(this._waitTimer);
    const source = this._source;
    this._source = null;
    if (source !== null) source.close();
    if (!this._closed && this._role === "leader") this._setRole("follower");
  }

  _onMessage(message) {
    if (this._closed || message === null || typeof message !== "object" || message.from === this._tabId) return;
    if (this._role === "leader") {
      if (message.k !== "hello") return;
      // A new tab: its state, and the latest of each event kept (e.g. `stats`).
      if (this._lastState !== null) this._post({ k: this._lastState, from: this._tabId });
      for (const type of this._options.replayLatest ?? []) {
        if (this._lastEvents.has(type)) this._post({ k: "event", from: this._tabId, type, data: this._lastEvents.get(type) });
      }
      return;
    }
    if (this._role === "electing") this._setRole("follower");
    switch (message.k) {
      case "event":
        safeCall(this._options.onMessage, message.type, message.data);
        break;
      case "open":
        this._wait(false);
        safeCall(this._options.onOpen);
        break;
      case "error":
        safeCall(this._options.onError);
        break;
      case "wait":
        this._wait(Boolean(message.waiting));
        break;
      default:
        break;
    }
  }
}
