/**
 * ws.js — a session's event stream over the multiplexed WebSocket transport (issue 27).
 *
 * `WsSessionStream` has the interface of `SessionEventStream` (./sse.js): `start()`,
 * `close()`, `drop()`, `pause()`, `resume()`, `adoptCursor()`, `state`, `lastEventId`,
 * `epoch`, `reconnectCount`, `retryMs`, `currentDelayMs`, `paused`, the same states
 * (`STATES`) and the same callbacks with the same `StreamEvent`s, so that the session page
 * and `SharedStream` (./shared_stream.js, `StreamClass`) use it in place of the SSE client:
 * one leader tab holds the socket, as it would hold the stream. It is one subscription on a
 * `SessionSocket` (./ws_socket.js): give several streams one `socket` to carry many
 * sessions on one connection (a dashboard); without one, the stream makes its own.
 *
 * What it does for its session (docs/protocol.md, "The WebSocket transport"):
 * - `subscribe` with its token, cursor (`lastEventId`, a number) and epoch, and
 *   `maxQueued`; after a socket drop, the socket resubscribes every stream in one batch.
 * - replies: ok → "open" (the reply's `epoch` is the one the cursor belongs to from then on,
 *   EB-17); errors by code as the SSE client treats statuses (SC-10): `unauthorized` (or
 *   `token_revoked`) → one
 *   fresh token (a rejected one is never sent again), a second one stops; `session_closed`
 *   → "ended"; `forbidden`, `not_found`, `invalid_*`, `already_subscribed` → "stopped";
 *   any other code (limits, the store unavailable, draining) → again with backoff (SC-11).
 * - frames: `{op: "frame", session, frame}` → `onEvent` with the `StreamEvent` SSE would
 *   have given (`data` the compact JSON, `id` the envelope's id as a string or null); the
 *   cursor moves only with an id (SC-9). `client_evicted` and `stream_error` end the
 *   subscription on the server: it subscribes again with its cursor after the reconnection
 *   time, a `retryAfterMs` in the frame becoming that time (SC-12); `token_revoked` /
 *   `token_expired` mark the token rejected and ask for a fresh one. After
 *   `session_closed` the stream is "ended" (what the SSE client learns from the 204).
 * - in-band token refresh: `refreshAfterMs()` (option) after every open, and `refresh()`,
 *   send `{op: "refresh", session, token}` with a token asked for with reason "refresh";
 *   the subscription carries on without a gap.
 * - pause(): browsers' WebSocket reads every message, so a paused stream cannot stall the
 *   server (EB-21) as a paused SSE reader does: frames are held here, at most
 *   `maxHeldFrames`; past that the stream unsubscribes, drops what it held, and resumes
 *   from its cursor (the last frame it delivered) on `resume()`: nothing lost, nothing twice.
 *
 * No DOM dependency: runs in the browser and under Node 20 with a fake WebSocket.
 */
import {
  callSafely,
  checkCursor,
  checkMaxQueued,
  isCursor,
  RECONNECT_DEFAULTS,
  ReconnectTimer,
  RejectedTokens,
  STATES,
  terminalFrame,
} from "./reconnect.js";
import { SessionSocket, socketUrl, SUBPROTOCOL } from "./ws_socket.js";

// STATES: the same names as the SSE client's (./sse.js).
export { SessionSocket, socketUrl, STATES, SUBPROTOCOL };

/** Reply codes after which asking again cannot help (the SSE client stops on these 4xx). */
const STOP_CODES = new Set(["forbidden", "not_found", "already_subscribed"]);

/**
 * @typedef {object} WsSessionStreamOptions
 * @property {string} session  The session id.
 * @property {(reason: "connect"|"reconnect"|"unauthorized"|"refresh") => (string|Promise<string>)} getToken
 *   "unauthorized" and "refresh" want a token other than the last one.
 * @property {SessionSocket} [socket]  A shared socket; default one of its own from `url`.
 * @property {string} [url]  The socket URL (default "/ws"), for a socket of its own.
 * @property {Function} [WebSocket]  For a socket of its own.
 * @property {string} [lastEventId]  Cursor to resume from ("" = live only).
 * @property {string|null} [epoch]
 * @property {number} [maxQueued]  Integer in [16, 2048] (EB-14).
 * @property {() => (number|null)} [refreshAfterMs]  Asked after every open and refresh:
 *   refresh the token that long after; null = no proactive refresh.
 * @property {number} [maxHeldFrames]  Frames held while paused; 4096.
 * @property {number} [initialRetryMs] @property {number} [capMs] @property {number} [floorMs]
 * @property {number} [pingIntervalMs] @property {number} [pongTimeoutMs]
 * @property {() => number} [random]
 * @property {typeof setTimeout} [setTimeout] @property {typeof clearTimeout} [clearTimeout]
 * @property {Function} [onEvent] @property {Function} [onStateChange]
 * @property {Function} [onRetryScheduled] @property {Function} [onResyncRequired]
 * @property {Function} [onComment]  The socket's heartbeat (a server `ping`, or the `pong`
 *   to ours), text "heartbeat".
 * @property {Function} [onConnectionWait]  Never called: WebSockets do not wait for the
 *   6 connections per host of HTTP/1.1.
 * @property {Function} [onCallbackError]
 */

/** One session's stream over a `SessionSocket`. See the module comment. */
export class WsSessionStream {
  /**
   * Validate the options; does not subscribe (call `start()`).
   * @param {WsSessionStreamOptions} options
   * @throws {TypeError} no `session`; `getToken` not a function; `lastEventId` not a string of
   *   digits or ""; `epoch` not a string or null.
   * @throws {RangeError} `maxQueued` not an integer in [16, 2048].
   */
  constructor(options = {}) {
    const {
      session,
      getToken,
      socket,
      lastEventId = "",
      epoch = null,
      maxQueued,
      refreshAfterMs,
      maxHeldFrames = 4096,
      onCallbackError = (error) => console.error("WsSessionStream callback failed:", error),
    } = options;
    if (typeof session !== "string" || session === "") throw new TypeError("WsSessionStream: session is required");
    if (typeof getToken !== "function") throw new TypeError("WsSessionStream: getToken must be a function");
    checkCursor("WsSessionStream", lastEventId, epoch);
    checkMaxQueued("WsSessionStream", maxQueued);
    this.session = session;
    this._getToken = (reason) => getToken(reason);
    this._ownSocket = socket === undefined;
    this._socket = socket ?? new SessionSocket({ ...options, url: options.url ?? "/ws", onStateChange: undefined });
    this._maxQueued = maxQueued;
    this._refreshAfterMs = refreshAfterMs;
    this._maxHeldFrames = maxHeldFrames;
    this._onCallbackError = onCallbackError;
    this._callbacks = options;
    this._setTimer = (fn, ms) => (options.setTimeout ?? globalThis.setTimeout)(fn, ms);
    this._clearTimer = (handle) => (options.clearTimeout ?? globalThis.clearTimeout)(handle);
    this._reconnect = new ReconnectTimer({
      retryMs: options.initialRetryMs ?? RECONNECT_DEFAULTS.initialRetryMs,
      capMs: options.capMs ?? RECONNECT_DEFAULTS.capMs,
      floorMs: options.floorMs ?? RECONNECT_DEFAULTS.floorMs,
      random: options.random ?? Math.random,
      setTimer: this._setTimer,
      clearTimer: this._clearTimer,
    });
    this._gen = 0; // bumped by every subscribe prepared and every socket lost: stale ones send nothing
    this._state = "idle";
    this._lastEventId = lastEventId;
    this._epoch = epoch;
    this._attempts = 0;
    // "idle" | "waiting" (wants a subscription) | "sending" | "subscribed" | "later"
    // (a resubscribe timer runs) | "parked" (unsubscribed while paused) | "done"
    this._phase = "idle";
    this._subEpoch = null; // the epoch of the subscription in force
    this._token = null;
    this._tokenReason = "connect";
    this._sentTokenReason = "connect";
    this._rejected = new RejectedTokens();
    this._refreshTimer = null;
    this._paused = false;
    this._held = [];
  }

  /** Which transport this is: "websocket" (the SSE client has none; the page says "SSE"). */
  get transport() {
    return "websocket";
  }

  get state() {
    return this._state;
  }

  get lastEventId() {
    return this._lastEventId;
  }

  get epoch() {
    return this._epoch;
  }

  /** Subscribe messages sent after the first one. */
  get reconnectCount() {
    return Math.max(0, this._attempts - 1);
  }

  get retryMs() {
    return this._reconnect.retryMs;
  }

  get currentDelayMs() {
    return this._reconnect.currentDelayMs ?? this._socket.currentDelayMs;
  }

  get paused() {
    return this._paused;
  }

  /** The socket this stream rides. */
  get socket() {
    return this._socket;
  }

  /** Take a snapshot's cursor (SC-12), as `SessionEventStream.adoptCursor`. Never throws. */
  adoptCursor(lastEventId, epoch) {
    if (!isCursor(lastEventId, epoch)) return;
    this._lastEventId = lastEventId;
    this._epoch = epoch;
  }

  /** Subscribe. Idempotent: does nothing unless "idle". @returns {this} */
  start() {
    if (this._state !== "idle") return this;
    this._phase = "waiting";
    this._setState("connecting", { reason: "start" });
    this._socket.attach(this);
    if (this._socket.isOpen) this._subscribeNow("connect");
    return this;
  }

  /** Unsubscribe and stop for good ("stopped", reason "closed"); closes a socket of its own. */
  close() {
    if (this._state === "stopped" || this._state === "ended") return;
    this._finish("stopped", { reason: "closed" });
  }

  /**
   * Cut the socket this stream rides, as a network cut would (every subscription on it
   * resumes in the batch after the reconnection time; the page's Drop). Never throws.
   */
  drop() {
    if (this._phase === "done") return;
    this._socket.drop();
  }

  /** Hold frames instead of delivering them (see the module comment). Idempotent. */
  pause() {
    this._paused = true;
  }

  /** Deliver what was held, then carry on; a parked stream subscribes again. Idempotent. */
  resume() {
    if (!this._paused) return;
    this._paused = false;
    const held = this._held;
    this._held = [];
    for (const envelope of held) {
      if (this._phase === "done" || this._paused) break;
      this._deliver(envelope);
    }
    if (this._phase === "parked") {
      this._phase = "waiting";
      this._setState("connecting", { reason: "resume" });
      if (this._socket.isOpen) this._subscribeNow("reconnect");
    }
  }

  /** Send the `refresh` op now with a token asked for with reason "refresh". Never throws. */
  refresh() {
    this._refresh().catch((error) => this._report(error));
  }

  // ---- the SessionSocket member interface -----------------------------------------------

  _wantsSubscription() {
    return this._phase === "waiting" || this._phase === "later";
  }

  /** The subscribe message, token included; null when the stream gave up meanwhile. */
  async _prepareSubscribe(reason) {
    this._reconnect.cancel();
    this._phase = "sending";
    const gen = ++this._gen;
    const tokenReason = this._tokenReason === "unauthorized" ? "unauthorized" : reason;
    this._tokenReason = "reconnect";
    let token;
    try {
      token = await this._getToken(tokenReason);
    } catch (error) {
      if (this._gen === gen && this._phase === "sending") this._finish("stopped", { reason: "token_error", error });
      return null;
    }
    if (this._gen !== gen || this._phase !== "sending") return null;
    if (typeof token !== "string" || token === "") {
      this._finish("stopped", { reason: "token_error", error: new TypeError("getToken returned no token") });
      return null;
    }
    if (this._rejected.has(token)) {
      this._finish("stopped", { reason: "unauthorized", detail: "token provider returned a rejected token" });
      return null;
    }
    this._token = token;
    this._sentTokenReason = tokenReason;
    this._attempts += 1;
    const message = { op: "subscribe", session: this.session, token };
    if (/^[0-9]{1,16}$/.test(this._lastEventId) && Number.isSafeInteger(Number(this._lastEventId))) {
      message.lastEventId = Number(this._lastEventId);
      if (this._epoch !== null) message.epoch = this._epoch;
    }
    if (this._maxQueued !== undefined) message.maxQueued = this._maxQueued;
    return message;
  }

  _onReply(reply, message) {
    if (this._phase !== "sending" || message.token !== this._token) return;
    if (reply.ok === true) {
      this._phase = "subscribed";
      this._reconnect.failures = 0;
      this._subEpoch = typeof reply.epoch === "string" ? reply.epoch : null;
      this._setState("open", { epoch: this._subEpoch });
      this._scheduleRefresh();
      return;
    }
    const error = reply.error !== null && typeof reply.error === "object" ? reply.error : {};
    const code = typeof error.code === "string" ? error.code : "";
    const info = { detail: error.error ?? code, code };
    if (code === "unauthorized" || code === "token_revoked") {
      this._rejected.add(message.token);
      if (this._sentTokenReason === "unauthorized") {
        this._finish("stopped", { ...info, reason: "unauthorized" });
      } else {
        this._tokenReason = "unauthorized";
        this._phase = "waiting";
        this._setState("connecting", { reason: "token_refresh" });
        this._subscribeNow("unauthorized");
      }
    } else if (code === "session_closed") {
      this._finish("ended", { ...info, reason: "session_ended" });
    } else if (STOP_CODES.has(code) || code.startsWith("invalid_")) {
      const reason = code === "forbidden" || code === "not_found" ? code : "client_error";
      this._finish("stopped", { ...info, reason });
    } else {
      if (Number.isSafeInteger(error.retryAfterMs)) this._reconnect.retryMs = error.retryAfterMs;
      this._later(code || "server_error", info, true);
    }
  }

  _onFrame(envelope) {
    if (this._phase !== "subscribed") return; // frames of a subscription already ended here
    if (this._paused) {
      this._held.push(envelope);
      if (this._held.length > this._maxHeldFrames) this._park();
      return;
    }
    this._deliver(envelope);
  }

  _onSocketOpen() {}

  _onSocketLost(info) {
    this._cancelRefresh();
    this._gen += 1;
    if (this._phase === "done" || this._phase === "parked" || this._phase === "idle") return;
    this._reconnect.cancel();
    this._phase = "waiting";
    this._setState("reconnecting", info);
    this._call("onRetryScheduled", info.delayMs, info);
  }

  _onHeartbeat() {
    if (this._phase === "subscribed") this._call("onComment", "heartbeat");
  }

  // ---- internals -------------------------------------------------------------------------

  _report(error) {
    try {
      this._onCallbackError(error);
    } catch {
      // the reporter failed too
    }
  }

  _call(name, ...args) {
    callSafely(this._callbacks[name], args, (error) => this._onCallbackError(error));
  }

  _setState(state, info) {
    this._state = state;
    this._call("onStateChange", state, info);
  }

  _cancelRefresh() {
    if (this._refreshTimer !== null) this._clearTimer(this._refreshTimer);
    this._refreshTimer = null;
  }

  /** Ask for the token and send one subscribe now (not part of a batch). */
  _subscribeNow(reason) {
    this._prepareSubscribe(reason)
      .then((message) => {
        if (message === null || this._phase !== "sending") return;
        if (!this._socket.send(message, (reply) => this._onReply(reply, message))) {
          this._phase = "waiting"; // the socket went away meanwhile: its batch takes this
        }
      })
      .catch((error) => this._report(error));
  }

  /** The server no longer holds the subscription: subscribe again after the reconnection time. */
  _later(reason, info, failed) {
    this._cancelRefresh();
    this._phase = "later";
    this._reconnect.failures = failed ? this._reconnect.failures + 1 : 0;
    const delayMs = this._reconnect.schedule(() => {
      if (this._phase !== "later") return;
      this._phase = "waiting";
      this._setState("connecting", { reason: "reconnect" });
      if (this._socket.isOpen) this._subscribeNow("reconnect");
    });
    const full = { ...info, reason, delayMs };
    this._setState("reconnecting", full);
    this._call("onRetryScheduled", delayMs, full);
  }

  _finish(state, info) {
    const wasSubscribed = this._phase === "subscribed" || this._phase === "sending";
    this._phase = "done";
    this._reconnect.cancel();
    this._cancelRefresh();
    this._held = [];
    if (wasSubscribed) this._socket.send({ op: "unsubscribe", session: this.session }, () => {});
    this._socket.detach(this);
    if (this._ownSocket) this._socket.close();
    this._setState(state, info);
  }

  /** Too much held while paused: let the server forget this subscriber; resume() resubscribes. */
  _park() {
    this._held = [];
    this._cancelRefresh();
    this._phase = "parked";
    this._socket.send({ op: "unsubscribe", session: this.session }, () => {});
  }

  _deliver(envelope) {
    const id = Number.isSafeInteger(envelope.id) ? String(envelope.id) : null;
    if (id !== null) {
      this._lastEventId = id;
      this._epoch = this._subEpoch ?? this._epoch;
    }
    const data = JSON.stringify(envelope);
    const type = typeof envelope.type === "string" ? envelope.type : "message";
    const frame = { type, data, json: envelope, lastEventId: this._lastEventId, id };
    this._call("onEvent", frame);
    if (type === "state_resync_required") this._call("onResyncRequired", frame);
    if (this._phase !== "subscribed") return; // a callback closed the stream
    const terminal = terminalFrame(type, envelope);
    if (type === "session_closed") {
      this._finish("ended", { reason: "session_ended" });
    } else if (terminal !== null) {
      const { data } = terminal;
      if (terminal.tokenRejected) {
        this._rejected.add(this._token);
        this._tokenReason = "unauthorized";
      }
      if (Number.isSafeInteger(data.retryAfterMs)) {
        this._reconnect.retryMs = data.retryAfterMs;
        // The socket closes next (1012): it reconnects after the same time (SSE keeps a `retry:`).
        if (data.code === "server_draining") this._socket.setRetryMs(data.retryAfterMs);
      }
      this._later(type, { detail: terminal.detail }, false);
    }
  }

  _scheduleRefresh() {
    this._cancelRefresh();
    const ms = typeof this._refreshAfterMs === "function" ? this._refreshAfterMs() : null;
    if (!Number.isFinite(ms) || ms < 0) return;
    this._refreshTimer = this._setTimer(() => {
      this._refreshTimer = null;
      this.refresh();
    }, ms);
  }

  async _refresh() {
    if (this._phase !== "subscribed") return;
    const token = await this._getToken("refresh");
    if (this._phase !== "subscribed" || typeof token !== "string" || token === "" || this._rejected.has(token)) return;
    const sent = this._socket.send({ op: "refresh", session: this.session, token }, (reply) => {
      if (reply.ok === true) {
        this._token = token;
        if (this._phase === "subscribed") this._scheduleRefresh();
      } else if (reply.error && reply.error.code === "unauthorized") {
        this._rejected.add(token);
      }
    });
    if (!sent) this._scheduleRefresh(); // the socket is reconnecting: the resubscribe sends a token
  }
}
