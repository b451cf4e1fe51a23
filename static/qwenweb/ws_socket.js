/**
 * ws_socket.js — one WebSocket to `GET /ws` (subprotocol `qwenweb.v1`) that carries many
 * subscriptions (docs/protocol.md, "The WebSocket transport"; issue 27).
 *
 * `SessionSocket` owns the socket and what belongs to the connection, not to a session:
 * the request refs and their replies, pings, the reconnect with the SSE client's backoff
 * (SC-11, ./reconnect.js's `ReconnectTimer`) and, after every open, **one batched resubscribe**: it asks
 * every subscription for its `subscribe` message (token, cursor, epoch) at once and sends
 * them all in one burst, in one turn of the event loop. The subscriptions themselves
 * (`WsSessionStream`, ./ws.js) decide what a reply or a frame means for their session.
 *
 * A member (a subscription) has: `session` (string); `_wantsSubscription()` (true while it
 * needs the server to hold a subscription that it does not hold yet); `_prepareSubscribe(reason)`
 * → Promise of the message without `ref` (or null: nothing to send); `_onReply(reply,
 * message)`; `_onFrame(envelope)`; `_onSocketLost(info)`; `_onSocketOpen()`;
 * `_onHeartbeat()` (a server `ping` or the `pong` to ours).
 *
 * Close codes (docs/protocol.md): every close the client did not ask for reconnects —
 * 1012 `server_draining` after the drain's `retryAfterMs` (./ws.js hands it over), 1001,
 * 4408 `writer_idle_timeout`, 4429 `socket_limit_exceeded` and a failed handshake (1006)
 * with the backoff of a socket that never opened when it had not opened.
 *
 * No DOM dependency beyond the injected `WebSocket` constructor: runs in the browser and
 * under Node 20 with a fake (`node --test tests/js/`).
 *
 * Concurrency: everything runs on the caller's event loop; a stale socket's callbacks are
 * recognised (`this._ws !== ws`) and ignored.
 */
import { callSafely, RECONNECT_DEFAULTS, ReconnectTimer } from "./reconnect.js";

/** The subprotocol the client asks for; the server answers with it or refuses. */
export const SUBPROTOCOL = "qwenweb.v1";

/** States of a `SessionSocket`; "closed" is terminal. @type {ReadonlyArray<string>} */
export const SOCKET_STATES = Object.freeze(["idle", "connecting", "open", "reconnecting", "closed"]);

/** WebSocket.OPEN, spelled out: fakes and old runtimes may not define the constant. */
const OPEN = 1;

/**
 * Resolve `path` (e.g. "/ws") against the page's address with the ws/wss scheme.
 * @param {string} path  A path or an absolute ws(s)/http(s) URL.
 * @param {string} [base]  Default `location.href`.
 * @returns {string} e.g. "wss://example.org/ws"
 * @throws {TypeError} when `path` cannot be resolved (no base and not absolute).
 */
export function socketUrl(path, base = globalThis.location?.href) {
  const url = new URL(path, base);
  if (url.protocol === "http:") url.protocol = "ws:";
  else if (url.protocol === "https:") url.protocol = "wss:";
  return url.href;
}

/**
 * @typedef {object} SessionSocketOptions
 * @property {string} url  The socket URL ("/ws" is resolved with `socketUrl`).
 * @property {Function} [WebSocket]  Constructor `(url, protocols)`; default the global one.
 * @property {number} [initialRetryMs]  Reconnection time; 3000 (the SSE default).
 * @property {number} [capMs]  Cap of the exponential backoff; 30000.
 * @property {number} [floorMs]  Minimum base of the exponential backoff; 1000.
 * @property {number} [pingIntervalMs]  A `ping` op this long after the last one; 15000.
 * @property {number} [pongTimeoutMs]  No message at all this long after a ping → the peer
 *   is gone: the socket is closed and reconnected (reason "ping_timeout"); 10000.
 * @property {(state: string, info: object) => void} [onStateChange]
 * @property {(error: unknown) => void} [onCallbackError]  Default `console.error`.
 * @property {() => number} [random]
 * @property {typeof setTimeout} [setTimeout] @property {typeof clearTimeout} [clearTimeout]
 */

/**
 * One reconnecting WebSocket shared by many subscriptions. Never throws after construction.
 *
 * Life: "idle" → `attach()` of a first member connects → "connecting" → "open" (the batch
 * is sent) → on a close the server or the network caused, "reconnecting" after
 * `computeReconnectDelayMs` (failures = consecutive sockets that never opened; exactly
 * the reconnection time after a socket that had opened), then "connecting" again …
 * `close()` → "closed" for good.
 */
export class SessionSocket {
  /**
   * @param {SessionSocketOptions} options
   * @throws {TypeError} no `url`, no WebSocket constructor, a timer or `random` not a function.
   */
  constructor(options = {}) {
    const {
      url,
      WebSocket: WS = globalThis.WebSocket,
      initialRetryMs = RECONNECT_DEFAULTS.initialRetryMs,
      capMs = RECONNECT_DEFAULTS.capMs,
      floorMs = RECONNECT_DEFAULTS.floorMs,
      pingIntervalMs = 15000,
      pongTimeoutMs = 10000,
      onStateChange,
      onCallbackError = (error) => console.error("SessionSocket callback failed:", error),
      random = Math.random,
      setTimeout: setTimer = globalThis.setTimeout,
      clearTimeout: clearTimer = globalThis.clearTimeout,
    } = options;
    if (typeof url !== "string" || url === "") throw new TypeError("SessionSocket: url is required");
    if (typeof WS !== "function") throw new TypeError("SessionSocket: no WebSocket constructor");
    for (const fn of [setTimer, clearTimer, random]) {
      if (typeof fn !== "function") throw new TypeError("SessionSocket: setTimeout, clearTimeout and random must be functions");
    }
    this._url = url;
    this._WS = WS;
    this._pingIntervalMs = pingIntervalMs;
    this._pongTimeoutMs = pongTimeoutMs;
    this._onStateChange = onStateChange;
    this._onCallbackError = onCallbackError;
    this._setTimer = (fn, ms) => setTimer(fn, ms);
    this._clearTimer = (handle) => clearTimer(handle);
    this._reconnect = new ReconnectTimer({
      retryMs: initialRetryMs,
      capMs,
      floorMs,
      random: () => random(),
      setTimer: this._setTimer,
      clearTimer: this._clearTimer,
    });
    this._state = "idle";
    this._sockets = 0;
    this._ws = null;
    this._opened = false; // whether the current socket reached "open"
    this._members = new Set();
    this._pending = new Map(); // ref → {message, onReply}
    this._nextRef = 1;
    this._pingTimer = null;
    this._heard = true; // a message arrived since the last ping
  }

  /** One of `SOCKET_STATES`. */
  get state() {
    return this._state;
  }

  /** Sockets opened after the first attempt. */
  get reconnectCount() {
    return Math.max(0, this._sockets - 1);
  }

  /** The reconnection time in force, ms. */
  get retryMs() {
    return this._reconnect.retryMs;
  }

  /** The delay of the pending reconnect in ms, or null. */
  get currentDelayMs() {
    return this._reconnect.currentDelayMs;
  }

  /** Whether messages can be sent now. */
  get isOpen() {
    return this._state === "open";
  }

  /** Requests sent and not answered yet. */
  get pendingCount() {
    return this._pending.size;
  }

  /**
   * Take the server's reconnection time for the next reconnect (e.g. a `server_draining`
   * frame's `retryAfterMs`). Integers ≥ 0 only; others are ignored. Never throws.
   */
  setRetryMs(ms) {
    if (Number.isSafeInteger(ms) && ms >= 0) this._reconnect.retryMs = ms;
  }

  /** Add a member; connects when idle. Idempotent. Nothing after close(). */
  attach(member) {
    if (this._state === "closed") return;
    this._members.add(member);
    if (this._state === "idle") this._connect("start");
  }

  /** Remove a member (its later replies and frames are ignored). Idempotent. */
  detach(member) {
    this._members.delete(member);
  }

  /**
   * Send one op now. `onReply(reply)` gets the `reply` op with its ref.
   * @param {object} message  An op without `ref`.
   * @param {(reply: object) => void} [onReply]
   * @returns {boolean} false when the socket is not open (nothing was sent).
   */
  send(message, onReply) {
    if (this._state !== "open" || this._ws === null || this._ws.readyState !== OPEN) return false;
    const ref = this._nextRef++;
    const full = { ...message, ref };
    if (onReply !== undefined) this._pending.set(ref, { message: full, onReply });
    try {
      this._ws.send(JSON.stringify(full));
    } catch {
      this._pending.delete(ref);
      return false;
    }
    return true;
  }

  /**
   * Cut the socket as the network would, then reconnect after the reconnection time and
   * resubscribe everything (the page's Drop). Does nothing unless connecting or open.
   */
  drop() {
    if (this._ws === null) return;
    this._lost({ reason: "dropped" });
  }

  /** Close the socket for good (code 1000); members are told "closed". Idempotent. */
  close() {
    if (this._state === "closed") return;
    const ws = this._ws;
    this._release();
    this._reconnect.cancel();
    if (ws !== null) safeClose(ws, 1000, "client closed");
    this._setState("closed", { reason: "closed" });
  }

  // ---- internals -------------------------------------------------------------------------

  _call(fn, ...args) {
    callSafely(fn, args, (error) => this._onCallbackError(error));
  }

  _setState(state, info) {
    this._state = state;
    this._call(this._onStateChange, state, info);
  }

  /** Forget the current socket: no more of its callbacks, no ping, no pending replies. */
  _release() {
    const ws = this._ws;
    this._ws = null;
    this._pending.clear();
    if (this._pingTimer !== null) this._clearTimer(this._pingTimer);
    this._pingTimer = null;
    if (ws !== null) {
      ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
    }
  }

  _connect(reason) {
    this._reconnect.cancel();
    let ws;
    this._opened = false;
    this._setState("connecting", { reason });
    try {
      ws = new this._WS(socketUrl(this._url), [SUBPROTOCOL]);
    } catch (error) {
      this._reconnect.failures += 1;
      this._schedule({ reason: "network_error", error });
      return;
    }
    this._ws = ws;
    ws.onopen = () => this._ws === ws && this._onOpen(ws);
    ws.onmessage = (event) => this._ws === ws && this._onMessage(event.data);
    ws.onclose = (event) => this._ws === ws && this._onClose(event);
    ws.onerror = () => {}; // a close event follows; it carries what can be known
  }

  _onOpen(ws) {
    if (ws.protocol !== undefined && ws.protocol !== "" && ws.protocol !== SUBPROTOCOL) {
      this._lost({ reason: "bad_subprotocol", detail: ws.protocol });
      return;
    }
    this._opened = true;
    this._reconnect.failures = 0;
    this._sockets += 1;
    this._setState("open", { reason: "open" });
    this._heard = true;
    this._schedulePing();
    for (const member of [...this._members]) this._call(() => member._onSocketOpen());
    this._resubscribeAll(ws);
  }

  /** One batch: every member's subscribe message, asked for together, sent together. */
  async _resubscribeAll(ws) {
    const members = [...this._members].filter((member) => member._wantsSubscription());
    const messages = await Promise.all(
      members.map((member) => member._prepareSubscribe("reconnect").catch(() => null)),
    );
    if (this._ws !== ws || this._state !== "open") return;
    members.forEach((member, index) => {
      const message = messages[index];
      if (message !== null && this._members.has(member)) {
        this.send(message, (reply) => member._onReply(reply, message));
      }
    });
  }

  _schedulePing() {
    this._pingTimer = this._setTimer(() => {
      this._pingTimer = null;
      if (this._state !== "open") return;
      this._heard = false;
      this.send({ op: "ping" }, () => {});
      this._pingTimer = this._setTimer(() => {
        this._pingTimer = null;
        if (this._state !== "open") return;
        if (!this._heard) this._lost({ reason: "ping_timeout" });
        else this._schedulePing();
      }, this._pongTimeoutMs);
    }, this._pingIntervalMs);
  }

  _onMessage(data) {
    this._heard = true;
    let message;
    try {
      message = JSON.parse(String(data));
    } catch {
      return; // not JSON: nothing this client can act on (the server never sends it)
    }
    if (message === null || typeof message !== "object") return;
    if (message.op === "frame") {
      const member = this._memberFor(message.session);
      if (member !== null && message.frame !== null && typeof message.frame === "object") {
        this._call(() => member._onFrame(message.frame));
      }
    } else if (message.op === "ping") {
      // the server's heartbeat (the twin of `: heartbeat`): nothing to answer
      for (const member of [...this._members]) this._call(() => member._onHeartbeat());
    } else if (message.op === "reply" || message.op === "pong") {
      const pending = this._pending.get(message.ref);
      if (pending !== undefined) {
        this._pending.delete(message.ref);
        this._call(pending.onReply, message);
      }
      if (message.op === "pong") for (const member of [...this._members]) this._call(() => member._onHeartbeat());
    }
  }

  _memberFor(session) {
    for (const member of this._members) if (member.session === session) return member;
    return null;
  }

  _onClose(event) {
    const info = { reason: this._opened ? "socket_closed" : "network_error", code: event.code };
    if (event.reason) info.detail = event.reason;
    this._lost(info);
  }

  /** The socket is gone (closed by the server, the network, a ping timeout, drop()). */
  _lost(info) {
    const ws = this._ws;
    const opened = this._opened;
    this._release();
    if (ws !== null) safeClose(ws, 4000, info.reason);
    // 4429: the user's sockets are at their limit; opening at once again cannot help.
    if ((!opened && info.reason !== "dropped") || info.code === 4429) this._reconnect.failures += 1;
    this._schedule(info);
  }

  _schedule(info) {
    const delayMs = this._reconnect.schedule(() => this._connect("reconnect"));
    const full = { ...info, delayMs };
    this._setState("reconnecting", full);
    for (const member of [...this._members]) this._call(() => member._onSocketLost(full));
  }
}

function safeClose(ws, code, reason) {
  try {
    ws.close(code, String(reason).slice(0, 100));
  } catch {
    // already closing
  }
}
