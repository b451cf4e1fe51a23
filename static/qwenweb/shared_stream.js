/**
 * shared_stream.js — one stream per browser per session, shared by every tab of it.
 *
 * Over HTTP/1.1 a browser opens at most 6 connections per server; one event stream per tab
 * used them all up at the 6th tab. Here the tabs of one session (same origin, same browser
 * profile) elect a leader (./leader_election.js); only the leader holds a
 * `SessionEventStream` (./sse.js) and it posts every frame, state change, retry and
 * connection wait over a `BroadcastChannel`; the other tabs (followers) show what it
 * posts. When the leader closes or dies, another tab is elected and opens its own stream
 * with the last id and epoch it applied: the server replays what came after (EB-7), so no
 * tab misses an event or sees one twice. docs/protocol.md, "Many tabs, one stream".
 *
 * A tab's own controls (Drop, Pause) detach it onto a stream of its own; once that stream
 * caught up (`replay_complete`, a heartbeat) and the tab is not paused, it competes again
 * and either leads with that stream or follows and closes it (`rejoin()`).
 *
 * `class SharedStream(options)` has the `SessionEventStream` interface (`start()`,
 * `close()`, `drop()`, `pause()`, `resume()`, `adoptCursor()`, `state`, `lastEventId`,
 * `epoch`, `reconnectCount`, `retryMs`, `currentDelayMs`, `paused`) plus `listen()`,
 * `detach(reason)`, `rejoin()`, `role` ("idle", "electing", "leader", "follower", "own"),
 * `mode` ("locks", "lease", "none") and `tabs` (tabs known to share, the leader's count).
 *
 * Frames on the channel are `{k: "frame", from, frame: {type, data, lastEventId, id},
 * epoch}`; followers skip a frame whose id is at or below their cursor, so a second
 * leader of a race, or a replay after handover, is never applied twice.
 *
 * No DOM dependency: runs in the browser and under Node 20 with injected fakes
 * (`node --test tests/js/`).
 */
import { LeaderElection, newTabId, safeCall } from "./leader_election.js";
import { SessionEventStream } from "./sse.js";

// -- the session stream ------------------------------------------------------------------

function toInteger(value) {
  if (typeof value === "number") return Number.isSafeInteger(value) ? value : null;
  if (typeof value !== "string" || !/^[0-9]{1,16}$/.test(value)) return null;
  const number = Number(value);
  return Number.isSafeInteger(number) ? number : null;
}

function tryParseJson(data) {
  try {
    return JSON.parse(data);
  } catch {
    return undefined;
  }
}

/** Why a tab left the sharing, for which it shares again once its stream caught up. */
const REJOINING = new Set(["drop", "pause"]);
/** After Resume, share again by then at the latest (ms), caught up or not. */
const REJOIN_AFTER_RESUME_MS = 5000;

/** What of a state info can travel over the channel (never an Error object). */
function portableInfo(info = {}) {
  const out = {};
  for (const name of ["reason", "status", "detail", "delayMs", "epoch"]) {
    if (info[name] !== undefined) out[name] = typeof info[name] === "object" ? String(info[name]) : info[name];
  }
  if (info.error !== undefined) out.detail = out.detail ?? String(info.error);
  return out;
}

/**
 * @typedef {object} SharedStreamOptions
 * @property {string} key  What the tabs share: one stream per key (e.g. the session id).
 * @property {object} streamOptions  The `SessionEventStream` options of this tab (url,
 *   getToken, fetch, maxQueued, timers …) without the callbacks and the cursor.
 * @property {string} [lastEventId]  Cursor to start from (also settable in `start()`).
 * @property {string|null} [epoch]
 * @property {boolean} [own]  Never share: a stream of this tab's own from the start.
 * @property {(role: string, info: {reason?: string, tabs?: number}) => void} [onRoleChange]
 *   Also called on the leader, with reason "tabs", when the number of tabs changes.
 * @property {Function} [onEvent] @property {Function} [onStateChange]
 * @property {Function} [onRetryScheduled] @property {Function} [onResyncRequired]
 * @property {Function} [onComment] @property {Function} [onConnectionWait]
 *   As for `SessionEventStream`; a follower gets the leader's, `info.shared` set.
 * @property {Function} [StreamClass]  Default `SessionEventStream`.
 * @property {(fn: Function, ms: number) => unknown} [setTimeout]  Default the global one.
 * @property {Function} [createChannel]  name → BroadcastChannel-like; default a BroadcastChannel.
 * @property {Function} [createElection]  options → LeaderElection-like; default a LeaderElection.
 */

/**
 * One tab's view of the session's shared stream. See the module comment.
 *
 * Life: `listen()` (optional: join the channel early, hold the frames that arrive, e.g.
 * while the page loads its snapshot), `start({lastEventId, epoch})` (compete; frames held
 * with an id at or below that cursor are dropped), then leader or follower until `close()`
 * or `detach()` (own stream). Never throws after construction.
 */
export class SharedStream {
  /** @param {SharedStreamOptions} options */
  constructor(options) {
    if (!options || typeof options.key !== "string" || options.key === "") {
      throw new TypeError("SharedStream: key is required");
    }
    this._options = options;
    this._StreamClass = options.StreamClass ?? SessionEventStream;
    this._tabId = options.tabId ?? newTabId();
    const BC = globalThis.BroadcastChannel;
    this._createChannel = options.createChannel ?? (typeof BC === "function" ? (name) => new BC(name) : null);
    this._createElection = options.createElection ?? ((electionOptions) => new LeaderElection(electionOptions));
    this._cursor = options.lastEventId ?? "";
    this._epoch = options.epoch ?? null;
    this._role = "idle";
    this._state = "idle";
    this._stats = { reconnectCount: 0, retryMs: null, currentDelayMs: null };
    this._stream = null;
    this._channel = null;
    this._election = null;
    this._listening = false;
    this._started = false;
    this._closed = false;
    this._held = [];
    this._paused = false;
    this._followers = new Set();
    this._leaderId = null;
    this._waiting = false;
    this._lastInfo = {};
    this._detached = null; // why this tab reads a stream of its own ("drop", "pause", …)
    this._setTimeout = options.setTimeout ?? ((fn, ms) => globalThis.setTimeout(fn, ms));
  }

  // -- the SessionEventStream interface --

  get state() {
    return this._state;
  }

  get lastEventId() {
    return this._cursor;
  }

  get epoch() {
    return this._epoch;
  }

  get reconnectCount() {
    return this._stream !== null ? this._stream.reconnectCount : this._stats.reconnectCount;
  }

  get retryMs() {
    return this._stream !== null ? this._stream.retryMs : (this._stats.retryMs ?? 3000);
  }

  get currentDelayMs() {
    return this._stream !== null ? this._stream.currentDelayMs : this._stats.currentDelayMs;
  }

  get paused() {
    return this._paused;
  }

  /** "idle", "electing", "leader", "follower" or "own". */
  get role() {
    return this._role;
  }

  /** Tabs known to share this stream, this one included (exact on the leader). */
  get tabs() {
    return this._role === "leader" ? this._followers.size + 1 : this._role === "own" ? 1 : this._stats.tabs ?? 1;
  }

  /** Whether `start()` was called. */
  get started() {
    return this._started;
  }

  /** How leadership is decided here: "locks", "lease", or "none" (own stream). */
  get mode() {
    return this._election !== null ? this._election.mode : "none";
  }

  /** Join the channel now and hold frames until `start()`. Idempotent. */
  listen() {
    if (this._listening || this._closed || this._options.own || this._createChannel === null) return this;
    this._listening = true;
    this._joinChannel();
    return this;
  }

  _joinChannel() {
    try {
      this._channel = this._createChannel(`qwenweb-stream:${this._options.key}`);
      this._channel.onmessage = (event) => this._onMessage(event.data);
    } catch {
      this._channel = null;
    }
  }

  /**
   * Start: take the cursor, compete for the stream (or open an own one).
   * @param {{lastEventId?: string, epoch?: string|null}} [cursor]
   */
  start(cursor = {}) {
    if (this._started || this._closed) return this;
    this._started = true;
    if (cursor.lastEventId !== undefined) this._cursor = cursor.lastEventId;
    if (cursor.epoch !== undefined) this._epoch = cursor.epoch;
    if (this._options.own || this._createChannel === null) {
      this._openOwn(this._options.own ? "own" : "no_broadcast_channel");
      return this;
    }
    this.listen();
    if (this._channel === null) {
      this._openOwn("no_broadcast_channel");
      return this;
    }
    const held = this._held;
    this._held = [];
    this._setRole("electing", {});
    this._setState("connecting", { reason: "shared_waiting", shared: true });
    for (const message of held) this._onMessage(message);
    this._compete();
    return this;
  }

  /** Say hello to the tabs and stand for leader (the stream's holder). */
  _compete() {
    this._post({ k: "hello", from: this._tabId });
    this._election = this._createElection({
      name: `qwenweb-stream:${this._options.key}`,
      tabId: this._tabId,
      onElected: () => this._becomeLeader(),
      onDeposed: () => this._deposed(),
    });
    this._election.start();
  }

  /** Stop for good: close the stream, leave the channel, hand over. Idempotent. */
  close() {
    if (this._closed) return;
    this._closed = true;
    const stream = this._stream;
    this._stream = null;
    if (stream !== null) stream.close();
    this._post({ k: "bye", from: this._tabId, leader: this._role === "leader" });
    if (this._election !== null) this._election.resign();
    if (this._channel !== null) {
      this._channel.onmessage = null;
      this._channel.close();
    }
    this._setState("stopped", { reason: "closed" });
  }

  /** Detach onto an own stream, then drop its connection (SC-13). */
  drop() {
    this.detach("drop");
    if (this._stream !== null) this._stream.drop();
  }

  /** Detach onto an own stream, then stop reading it (EB-21). */
  pause() {
    this._paused = true;
    if (!this._started) return; // start() will open an own stream, paused
    const kept = this._stream; // the leader's (or an own) stream stays; a follower gets one, paused
    this.detach("pause");
    if (kept !== null && this._stream === kept) kept.pause();
  }

  resume() {
    this._paused = false;
    if (this._stream !== null) this._stream.resume();
    // Under steady traffic no heartbeat says the backlog is read: share again after a while
    // anyway (ids missed meanwhile are repaired by the page, SC-14).
    if (this._role === "own" && REJOINING.has(this._detached)) {
      this._setTimeout(() => this.rejoin(), REJOIN_AFTER_RESUME_MS);
    }
  }

  /**
   * Take the cursor of the snapshot a resync rebuilt the view from (SC-12), unless the
   * cursor is already past it in the same epoch: the cursor never moves back within an
   * epoch. This tab's stream (leader or own) resumes from it next time. Never throws.
   * @param {string} lastEventId @param {string|null} epoch
   */
  adoptCursor(lastEventId, epoch) {
    const next = toInteger(lastEventId);
    const current = toInteger(this._cursor);
    if (epoch === this._epoch && next !== null && current !== null && next <= current) return;
    this._cursor = lastEventId;
    this._epoch = epoch;
    if (this._stream !== null) this._stream.adoptCursor(lastEventId, epoch);
  }

  /**
   * Leave the sharing: this tab gets a stream of its own from its cursor (a leader keeps
   * the one it holds); the others elect a new leader. `reason` is reported with the role
   * change ("drop", "pause", "maxQueued", …). Idempotent; nothing after close().
   */
  detach(reason) {
    if (this._closed || this._role === "own") return;
    if (!this._started) {
      this._options = { ...this._options, own: true };
      return;
    }
    const wasLeader = this._role === "leader";
    this._detached = reason;
    if (this._election !== null) this._election.resign();
    this._post({ k: "bye", from: this._tabId, leader: wasLeader });
    if (this._channel !== null) {
      this._channel.onmessage = null;
      this._channel.close();
      this._channel = null;
    }
    if (this._stream !== null) {
      // A leader (or a tab that rejoined with its stream) keeps the stream it holds.
      this._setRole("own", { reason });
      return;
    }
    this._openOwn(reason);
  }

  /**
   * Share again after a Drop or a Pause: called when this tab's own stream caught up
   * (`replay_complete` after its reconnect, or a heartbeat: the server had nothing queued),
   * and 5 s after a Resume at the latest.
   * The tab competes again with the stream it holds: elected, it keeps that stream as the
   * shared one (no new request); another tab leading, it follows and closes its own (one
   * server stream per browser again). Nothing while paused, for a tab that never shares
   * (`own`, a maxQueued of its own) or after close(). Idempotent.
   */
  rejoin() {
    if (this._closed || this._role !== "own" || this._options.own || this._paused) return;
    if (!REJOINING.has(this._detached) || this._createChannel === null) return;
    this._joinChannel();
    if (this._channel === null) return;
    this._detached = null;
    this._setRole("electing", { reason: "rejoin" });
    this._compete();
  }

  // -- internals --

  _call(name, ...args) {
    safeCall(this._options[name], ...args);
  }

  _setRole(role, info) {
    if (this._role === role) return;
    this._role = role;
    this._call("onRoleChange", role, info);
  }

  _setState(state, info) {
    this._state = state;
    this._lastInfo = info;
    this._call("onStateChange", state, info);
  }

  _post(message) {
    if (this._channel === null) return;
    try {
      this._channel.postMessage(message);
    } catch {
      // closed: nobody listens
    }
  }

  /** Make the `SessionEventStream` of this tab (leader or own) from the cursor. */
  _makeStream(broadcast) {
    const stream = new this._StreamClass({
      ...this._options.streamOptions,
      lastEventId: this._cursor,
      epoch: this._epoch,
      onEvent: (frame) => {
        if (this._stream !== stream) return;
        this._advance(frame, stream.epoch);
        this._call("onEvent", frame);
        if (broadcast()) {
          const { type, data, lastEventId, id } = frame;
          this._post({ k: "frame", from: this._tabId, frame: { type, data, lastEventId, id }, epoch: stream.epoch });
        }
        if (frame.type === "replay_complete" && this._stream === stream) this.rejoin();
      },
      onStateChange: (state, info) => {
        if (this._stream !== stream) return;
        this._setState(state, info);
        if (broadcast()) this._postState();
      },
      onRetryScheduled: (delayMs, info) => {
        if (this._stream !== stream) return;
        this._call("onRetryScheduled", delayMs, info);
        if (broadcast()) this._post({ k: "retry", from: this._tabId, delayMs, info: portableInfo(info) });
      },
      onResyncRequired: (frame) => this._stream === stream && this._call("onResyncRequired", frame),
      onComment: (text) => {
        if (this._stream !== stream) return;
        this._call("onComment", text);
        if (broadcast()) this._post({ k: "comment", from: this._tabId });
        if (this._stream === stream) this.rejoin(); // a heartbeat: the server had nothing queued
      },
      onConnectionWait: (waiting, info) => {
        if (this._stream !== stream) return;
        this._waiting = waiting;
        this._call("onConnectionWait", waiting, info);
        if (broadcast()) this._post({ k: "wait", from: this._tabId, waiting, info });
      },
    });
    this._stream = stream;
    return stream;
  }

  _postState() {
    const stream = this._stream;
    this._post({
      k: "state",
      from: this._tabId,
      state: this._state,
      info: portableInfo(this._lastInfo),
      stats: {
        reconnectCount: stream !== null ? stream.reconnectCount : 0,
        retryMs: stream !== null ? stream.retryMs : null,
        currentDelayMs: stream !== null ? stream.currentDelayMs : null,
        tabs: this._followers.size + 1,
      },
      waiting: this._waiting,
    });
  }

  _openOwn(reason) {
    this._detached = reason;
    const stream = this._makeStream(() => this._role === "leader" && this._stream === stream);
    this._setRole("own", { reason });
    if (this._paused) stream.pause();
    stream.start();
  }

  _becomeLeader() {
    if (this._closed || this._role === "own") return;
    this._followers.clear();
    const kept = this._stream;
    if (kept !== null && !["stopped", "ended"].includes(kept.state)) {
      // Rejoined with the stream this tab held: it becomes the shared one, no new request.
      this._setRole("leader", { reason: "rejoin" });
      this._post({ k: "who", from: this._tabId });
      this._postState();
      return;
    }
    this._setRole("leader", {});
    const stream = this._makeStream(() => this._role === "leader" && this._stream === stream);
    this._post({ k: "who", from: this._tabId });
    if (this._paused) stream.pause();
    stream.start();
  }

  _deposed() {
    // Lease mode: another tab holds the stream now. Ours ends quietly; follow that tab.
    const stream = this._stream;
    this._stream = null;
    if (stream !== null) stream.close();
    if (!this._closed && this._role === "leader") {
      this._setRole("follower", { reason: "deposed" });
      this._setState("connecting", { reason: "shared_waiting", shared: true });
    }
  }

  /** Another tab leads: follow it; a stream kept from before a rejoin ends (one per browser). */
  _follow() {
    const kept = this._stream;
    this._stream = null;
    if (kept !== null) kept.close();
    this._setRole("follower", {});
  }

  /** Move the cursor to `frame`'s if it carries a later id. Returns false for a duplicate. */
  _advance(frame, epoch) {
    if (frame.id === null || frame.id === undefined) return true;
    const next = toInteger(frame.lastEventId);
    const current = toInteger(this._cursor);
    if (next !== null && current !== null && next <= current) return false;
    this._cursor = frame.lastEventId;
    if (epoch !== undefined && epoch !== null) this._epoch = epoch;
    return true;
  }

  _onMessage(message) {
    if (this._closed || message === null || typeof message !== "object" || message.from === this._tabId) return;
    if (!this._started) {
      if (message.k === "frame") this._held.push(message);
      return;
    }
    if (this._role === "leader") {
      const before = this._followers.size;
      if (message.k === "hello" || message.k === "here") {
        this._followers.add(message.from);
        this._postState();
      } else if (message.k === "bye") {
        this._followers.delete(message.from);
      }
      if (this._followers.size !== before) this._call("onRoleChange", "leader", { reason: "tabs", tabs: this.tabs });
      return;
    }
    if (this._role === "own") return;
    switch (message.k) {
      case "frame": {
        if (this._role === "electing") this._follow();
        this._leaderId = message.from;
        const frame = { ...message.frame, json: tryParseJson(message.frame.data) };
        if (!this._advance(frame, message.epoch)) return;
        this._call("onEvent", frame);
        if (frame.type === "state_resync_required") this._call("onResyncRequired", frame);
        break;
      }
      case "state":
        if (this._role === "electing") this._follow();
        this._leaderId = message.from;
        this._stats = message.stats ?? this._stats;
        if (Boolean(message.waiting) !== this._waiting) {
          this._waiting = Boolean(message.waiting);
          this._call("onConnectionWait", this._waiting, { waitedMs: 0, shared: true });
        }
        this._setState(message.state, { ...message.info, shared: true });
        break;
      case "retry":
        this._stats = { ...this._stats, currentDelayMs: message.delayMs };
        this._call("onRetryScheduled", message.delayMs, { ...message.info, shared: true });
        break;
      case "comment":
        this._call("onComment", "");
        break;
      case "wait":
        this._waiting = Boolean(message.waiting);
        this._call("onConnectionWait", this._waiting, { ...message.info, shared: true });
        break;
      case "who":
        this._post({ k: "here", from: this._tabId });
        break;
      case "bye":
        if (message.leader && message.from === this._leaderId) {
          // The leader left: the election picks the next one (maybe this tab).
          this._leaderId = null;
          if (this._waiting) {
            this._waiting = false;
            this._call("onConnectionWait", false, { waitedMs: 0, shared: true });
          }
          this._setState("connecting", { reason: "shared_handover", shared: true });
        }
        break;
      default:
        break;
    }
  }
}
