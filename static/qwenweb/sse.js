/**
 * sse.js — the reconnecting Server-Sent Events client of the session page (SC-9..SC-13).
 *
 * The session page cannot use `EventSource` (it must send `Authorization: Bearer …`), so it
 * reads `GET /session/<id>/events` with `fetch()` and does by hand what `EventSource` would
 * do; the bytes go through the hand-written parser of ./sse_parser.js (SC-1..SC-8), the
 * request's headers and the bodies it does not read are ./sse_request.js's, the reconnect
 * timer, the rejected tokens and the terminal frames ./reconnect.js's (shared with the
 * WebSocket client, ./ws.js). This module and those it imports have no DOM dependency: they
 * run unchanged in the browser and under Node 20 (`node --test tests/js/`). Rules cited as
 * `SC-n` and `EB-n` are in `docs/protocol.md` (its rule index).
 *
 * Exports
 *
 * - `class SessionEventStream(options)` — one reconnecting stream (SC-9..SC-13).
 *   Methods: `start()`, `close()`, `drop()`, `pause()`, `resume()`, `adoptCursor()`.
 *   Read-only: `state`, `lastEventId`, `epoch`, `reconnectCount`, `retryMs`,
 *   `currentDelayMs`, `paused`.
 *   States: "idle" → "connecting" → "open" → "reconnecting" → "connecting" … and the two
 *   terminal states "stopped" (close(), 401 twice, 403, 404, other 4xx, a 2xx/3xx other
 *   than 200 and 204, token provider failure) and "ended" (204: the session is closed, EB-15).
 *
 * - `STATES` — the frozen list of those state names (./reconnect.js).
 * - re-exported, so that this module stays the client's whole interface (the shared spec's
 *   sse-client.md §5 takes the parser from sse.js): `createParser` and `contentTypeEssence`
 *   (./sse_parser.js, SC-1..SC-8, SC-10), `computeReconnectDelayMs` (./sse_backoff.js, the
 *   backoff formula, pure, SC-11).
 *
 * Usage (the session page):
 *
 *   const stream = new SessionEventStream({
 *     url: `/session/${id}/events`,
 *     getToken: (reason) => tokens.get({ fresh: reason === "unauthorized" }),
 *     lastEventId: snapshot.lastEventId, epoch: snapshot.epoch,   // resume after a snapshot
 *     onEvent: ({ type, data, json, id, lastEventId }) => view.apply(type, json ?? data),
 *     onResyncRequired: () => view.reloadSnapshot(),
 *     onStateChange: (state, info) => badge.show(state, info.reason),
 *   }).start();
 *   dropButton.onclick = () => stream.drop();
 *
 * Options: url, getToken(reason), fetch, lastEventId, epoch, maxQueued, initialRetryMs (3000),
 * capMs (30000), floorMs (1000), connectWaitMs (5000), random, setTimeout, clearTimeout.
 * Callbacks: onEvent, onStateChange(state, info), onRetryScheduled(delayMs, info),
 * onResyncRequired(frame), onComment(text), onConnectionWait(waiting, info),
 * onCallbackError(error). One stream per page (SC-13): close() the old one
 * before making another.
 *
 * Concurrency: everything runs on the caller's event loop; no callback is ever invoked
 * re-entrantly from inside another call of the same object except the parser callbacks,
 * which run synchronously inside `feed()` / `feedBytes()` / `end()`.
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
import { computeReconnectDelayMs } from "./sse_backoff.js";
import { contentTypeEssence, createParser } from "./sse_parser.js";
import { discardBody, readErrorDetail, requestHeaders, withQueryParam } from "./sse_request.js";

export { computeReconnectDelayMs, contentTypeEssence, createParser, STATES };

/**
 * @typedef {object} StreamEvent
 * @property {string} type          Event type ("message" when the frame had no `event:` line).
 * @property {string} data          The raw data string.
 * @property {*} json               `JSON.parse(data)`, or undefined when data is not JSON.
 * @property {string} lastEventId   The cursor after this event ("" if none).
 * @property {string|null} id       This frame's own `id` field, or null (synthetic frame).
 */

/**
 * @typedef {object} StateInfo
 * @property {string} [reason]   Why: "start", "reconnect", "token_refresh", "end_of_stream",
 *   "network_error", "server_error", "bad_content_type", "unexpected_status" (a 2xx or 3xx
 *   other than 200 and 204: terminal, the WHATWG model fails the connection),
 *   "client_evicted", "stream_error", "dropped", "closed", "session_ended", "unauthorized",
 *   "forbidden", "not_found", "client_error" (other 4xx), "token_error", "internal_error".
 * @property {number} [status]   HTTP status of the response that caused the change.
 * @property {string} [detail]   The server's JSON `error` / `code`, when it sent one.
 * @property {*} [error]         The thrown error (network, token provider).
 * @property {number} [delayMs]  With "reconnecting": the delay scheduled.
 * @property {string|null} [epoch] With "open": the epoch the server announced (EB-17).
 */

/**
 * @typedef {object} SessionEventStreamOptions
 * @property {string} url  The stream URL, e.g. "/session/<id>/events" (relative URLs are
 *   resolved by the injected fetch, as the browser's does).
 * @property {(reason: "connect"|"reconnect"|"unauthorized") => (string|Promise<string>)} getToken
 *   Token provider, asked before every request. "unauthorized" means the previous token was
 *   just rejected with 401 and a fresh one is needed.
 * @property {typeof fetch} [fetch]  Default `globalThis.fetch`.
 * @property {(event: StreamEvent) => void} [onEvent]  Every frame, synthetic ones included.
 * @property {(state: string, info: StateInfo) => void} [onStateChange]
 * @property {(delayMs: number, info: StateInfo) => void} [onRetryScheduled]
 * @property {(frame: StreamEvent) => void} [onResyncRequired]  A `state_resync_required`
 *   frame arrived (after its onEvent): reload the snapshot (SC-12).
 * @property {(text: string) => void} [onComment]  Comment lines (heartbeats), for debugging.
 * @property {(waiting: boolean, info: {waitedMs: number}) => void} [onConnectionWait]
 *   `true` when a request has had no response headers for `connectWaitMs` (the browser is
 *   most likely out of connections to this server: 6 per host over HTTP/1.1); `false` once
 *   that request got its answer, failed or was given up. The request keeps waiting.
 * @property {(error: unknown) => void} [onCallbackError]  A callback threw; default
 *   `console.error`. The stream carries on.
 * @property {string} [lastEventId]  Cursor to resume from (default "").
 * @property {string|null} [epoch]   Epoch that cursor belongs to (default null).
 * @property {number} [maxQueued]    `?maxQueued=N` query parameter, integer in [16, 2048] (EB-14).
 * @property {number} [initialRetryMs]  Reconnection time before the server sends one; 3000.
 * @property {number} [capMs]     Cap of the exponential backoff; 30000.
 * @property {number} [floorMs]   Minimum base of the exponential backoff; 1000.
 * @property {number} [connectWaitMs]  No response headers for this long → onConnectionWait(true); 5000.
 * @property {() => number} [random]  Default Math.random.
 * @property {typeof setTimeout} [setTimeout]
 * @property {typeof clearTimeout} [clearTimeout]
 */

/**
 * One reconnecting event stream for the session page (SC-9..SC-13).
 *
 * Per attempt it asks `getToken`, builds fresh headers (`Accept`, `Authorization: Bearer`,
 * and — only with a non-empty cursor — `Last-Event-ID` exactly once plus `X-Event-Epoch`
 * when the cursor's epoch is known), and fetches with its own `AbortController`.
 *
 * Responses (SC-10): 200 with a `text/event-stream` essence → "open", the body is read with
 * `getReader()` and parsed by a fresh parser seeded with the cursor; 204 → "ended";
 * 401 → one immediate retry with a token asked with reason "unauthorized" (a token equal to
 * one already rejected is never sent; a second consecutive 401 stops); 403, 404, other 4xx,
 * and any status that is neither 200, 204, 4xx nor 5xx (201, 205, 206, 299, 301, 304 … as
 * the WHATWG model fails the connection on them) → "stopped" with reason
 * "unexpected_status"; 5xx, a wrong content type, a network error → "reconnecting" with
 * backoff (SC-11, see `computeReconnectDelayMs`).
 *
 * The cursor moves only when a dispatched block carried an `id` (SC-9), and the epoch it
 * belongs to is the `X-Event-Epoch` of the response it arrived on (EB-13, EB-17).
 * `client_evicted` and `stream_error` end the connection: it is aborted and the stream
 * reconnects with the cursor after the reconnection time (SC-12). A `stream_error` with code
 * `token_revoked` or `token_expired` also marks the token rejected: that reconnect asks for
 * a fresh token (reason "unauthorized"), and a 401 to it stops.
 *
 * Callbacks never break the stream: an exception is passed to `onCallbackError`.
 */
export class SessionEventStream {
  /**
   * Validate the options; does not connect (call `start()`).
   * @param {SessionEventStreamOptions} options
   * @throws {TypeError} missing `url`; `getToken`, `fetch`, a timer or `random` not a
   *   function; `lastEventId` not a string free of CR/LF/NUL; `epoch` not a string or null.
   * @throws {RangeError} `maxQueued` not an integer in [16, 2048]; `initialRetryMs`, `capMs`,
   *   `floorMs` or `connectWaitMs` not a number >= 0.
   */
  constructor(options = {}) {
    const {
      url,
      getToken,
      fetch: fetchFn = globalThis.fetch,
      onEvent,
      onStateChange,
      onRetryScheduled,
      onResyncRequired,
      onComment,
      onConnectionWait,
      onCallbackError = (error) => console.error("SessionEventStream callback failed:", error),
      lastEventId = "",
      epoch = null,
      maxQueued,
      initialRetryMs = RECONNECT_DEFAULTS.initialRetryMs,
      capMs = RECONNECT_DEFAULTS.capMs,
      floorMs = RECONNECT_DEFAULTS.floorMs,
      connectWaitMs = 5000,
      random = Math.random,
      setTimeout: setTimer = globalThis.setTimeout,
      clearTimeout: clearTimer = globalThis.clearTimeout,
    } = options;
    const fail = (ErrorClass, message) => {
      throw new ErrorClass(`SessionEventStream: ${message}`);
    };
    if (typeof url !== "string" && !(url instanceof URL)) fail(TypeError, "url is required");
    if (typeof getToken !== "function") fail(TypeError, "getToken must be a function");
    if (typeof fetchFn !== "function") fail(TypeError, "no fetch function");
    for (const fn of [setTimer, clearTimer, random]) {
      if (typeof fn !== "function") fail(TypeError, "setTimeout, clearTimeout and random must be functions");
    }
    checkCursor("SessionEventStream", lastEventId, epoch);
    for (const [name, value] of Object.entries({ initialRetryMs, capMs, floorMs, connectWaitMs })) {
      if (typeof value !== "number" || !(value >= 0)) fail(RangeError, `${name} must be a number >= 0`);
    }
    checkMaxQueued("SessionEventStream", maxQueued);

    this._url = String(url);
    if (maxQueued !== undefined) this._url = withQueryParam(this._url, "maxQueued", String(maxQueued));
    // Called as plain functions: the browser's fetch and timers throw "Illegal invocation"
    // when called as methods of another object.
    this._getToken = (reason) => getToken(reason);
    this._fetch = (input, init) => fetchFn(input, init);
    this._callbacks = { onEvent, onStateChange, onRetryScheduled, onResyncRequired, onComment, onConnectionWait };
    this._connectWaitMs = connectWaitMs;
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
    this._lastEventId = lastEventId;
    this._epoch = epoch;
    this._attempts = 0;
    /** @type {Attempt|null} */
    this._attempt = null;
    /** tokens a 401 (or a token_revoked / token_expired frame) rejected: never sent again */
    this._rejectedTokens = new RejectedTokens();
    /** set by a token_revoked / token_expired frame: the next attempt asks for a fresh token */
    this._freshTokenNext = false;
    this._paused = false;
    this._resumeWaiters = [];
  }

  /** Current state, one of `STATES`. */
  get state() {
    return this._state;
  }

  /** The cursor: the last event ID string to send as `Last-Event-ID` ("" = none). */
  get lastEventId() {
    return this._lastEventId;
  }

  /** The epoch the cursor belongs to (the `X-Event-Epoch` it came with), or null. */
  get epoch() {
    return this._epoch;
  }

  /** Connection attempts made after the first one (401 retries included). */
  get reconnectCount() {
    return Math.max(0, this._attempts - 1);
  }

  /** The reconnection time in force, ms: the server's last valid `retry`, kept across connections. */
  get retryMs() {
    return this._reconnect.retryMs;
  }

  /** The delay of the pending reconnect in ms, or null when none is scheduled. */
  get currentDelayMs() {
    return this._reconnect.currentDelayMs;
  }

  /** True between `pause()` and `resume()`. */
  get paused() {
    return this._paused;
  }

  /**
   * Take `lastEventId` / `epoch` as the cursor (the snapshot a resync rebuilt the view from,
   * SC-12): the next connection resumes from it, and it moves again with the next `id`.
   * Never throws; a `lastEventId` with CR, LF or NUL, or an epoch that is not a string or
   * null, is ignored.
   */
  adoptCursor(lastEventId, epoch) {
    if (!isCursor(lastEventId, epoch)) return;
    this._lastEventId = lastEventId;
    this._epoch = epoch;
  }

  /**
   * Open the stream. Idempotent: does nothing unless the state is "idle".
   * Never throws; failures are reported through `onStateChange`.
   * @returns {this}
   */
  start() {
    if (this._state === "idle") this._connect("connect", "start");
    return this;
  }

  /**
   * Abort the current request or pending reconnect and stop for good (state "stopped",
   * reason "closed"; SC-13). Idempotent; never throws.
   */
  close() {
    if (this._isTerminal()) return;
    this._stop("stopped", { reason: "closed" });
  }

  /**
   * Abort the current request as a network cut would, and reconnect with the cursor after
   * the reconnection time (the page's "drop connection" control; SC-13). Does nothing when
   * no request is in flight (idle, reconnecting, stopped, ended). Never throws.
   */
  drop() {
    if (this._attempt === null) return;
    this._abortAttempt();
    this._scheduleReconnect("dropped", {});
  }

  /**
   * Stop reading the response body without cancelling it, so that TCP backpressure builds up
   * to the server (EB-21). Persists across reconnections. Idempotent.
   */
  pause() {
    this._paused = true;
  }

  /** Resume reading the body after `pause()`. Idempotent. */
  resume() {
    this._paused = false;
    this._releaseReaders();
  }

  // ---- internals -------------------------------------------------------------------------

  _isTerminal() {
    return this._state === "stopped" || this._state === "ended";
  }

  _call(name, ...args) {
    callSafely(this._callbacks[name], args, (error) => this._onCallbackError(error));
  }

  _setState(state, info) {
    this._state = state;
    this._call("onStateChange", state, info);
  }

  _stop(state, info) {
    this._abortAttempt();
    this._reconnect.cancel();
    this._setState(state, info);
  }

  _abortAttempt() {
    const attempt = this._attempt;
    if (attempt === null) return;
    this._attempt = null;
    attempt.dead = true;
    if (attempt.waiting) {
      attempt.waiting = false;
      this._call("onConnectionWait", false, { waitedMs: 0 });
    }
    attempt.controller.abort();
    if (attempt.reader) attempt.reader.cancel().catch(() => {});
    this._releaseReaders();
  }

  _releaseReaders() {
    const waiters = this._resumeWaiters;
    this._resumeWaiters = [];
    for (const resolve of waiters) resolve();
  }

  _scheduleReconnect(reason, info) {
    const delayMs = this._reconnect.schedule(() => {
      const tokenReason = this._freshTokenNext ? "unauthorized" : "reconnect";
      this._freshTokenNext = false;
      this._connect(tokenReason, "reconnect");
    });
    const fullInfo = { ...info, reason, delayMs };
    this._setState("reconnecting", fullInfo);
    this._call("onRetryScheduled", delayMs, fullInfo);
  }

  _fail(attempt, reason, info) {
    attempt.dead = true;
    this._reconnect.failures += 1;
    this._attempt = null;
    this._scheduleReconnect(reason, info);
  }

  _connect(tokenReason, stateReason) {
    const attempt = {
      controller: new AbortController(),
      reader: null,
      dead: false,
      epoch: null,
      token: null,
      committedId: null,
    };
    this._attempt = attempt;
    this._attempts += 1;
    this._setState("connecting", { reason: stateReason });
    this._run(attempt, tokenReason).catch((error) => {
      // Defensive: _run handles its own errors; anything here is a bug in this module.
      if (!attempt.dead) this._stop("stopped", { reason: "internal_error", error });
    });
  }

  async _run(attempt, tokenReason) {
    let token;
    try {
      token = await this._getToken(tokenReason);
    } catch (error) {
      if (!attempt.dead) this._stop("stopped", { reason: "token_error", error });
      return;
    }
    if (attempt.dead) return;
    if (typeof token !== "string" || token === "") {
      this._stop("stopped", { reason: "token_error", error: new TypeError("getToken returned no token") });
      return;
    }
    attempt.token = token;
    if (this._rejectedTokens.has(token)) {
      this._stop("stopped", { reason: "unauthorized", detail: "token provider returned a rejected token" });
      return;
    }

    let response;
    const waitTimer = this._watchHeaders(attempt);
    try {
      response = await this._fetch(this._url, {
        method: "GET",
        headers: requestHeaders(token, this._lastEventId, this._epoch),
        signal: attempt.controller.signal,
      });
    } catch (error) {
      this._endHeadersWait(attempt, waitTimer);
      if (!attempt.dead) this._fail(attempt, "network_error", { error });
      return;
    }
    this._endHeadersWait(attempt, waitTimer);
    if (attempt.dead) {
      discardBody(response);
      return;
    }
    await this._handleResponse(attempt, response, token, tokenReason);
  }

  /** Start the "no response headers yet" timer of `attempt` (see onConnectionWait). */
  _watchHeaders(attempt) {
    const startedAt = Date.now();
    return this._setTimer(() => {
      if (attempt.dead || attempt.headersAt !== undefined) return;
      attempt.waiting = true;
      this._call("onConnectionWait", true, { waitedMs: Date.now() - startedAt });
    }, this._connectWaitMs);
  }

  _endHeadersWait(attempt, timer) {
    this._clearTimer(timer);
    attempt.headersAt = Date.now();
    if (attempt.waiting) {
      attempt.waiting = false;
      this._call("onConnectionWait", false, { waitedMs: 0 });
    }
  }

  async _handleResponse(attempt, response, token, tokenReason) {
    const status = response.status;
    if (status === 200) {
      if (contentTypeEssence(response.headers.get("Content-Type")) !== "text/event-stream") {
        discardBody(response);
        this._fail(attempt, "bad_content_type", { status });
        return;
      }
      await this._readBody(attempt, response);
      return;
    }
    if (status === 204) {
      discardBody(response);
      this._stop("ended", { reason: "session_ended", status });
      return;
    }
    if (status >= 500 && status <= 599) {
      discardBody(response);
      this._fail(attempt, "server_error", { status });
      return;
    }
    if (status < 400 || status > 499) {
      // 201, 205, 206, 299, 301, 304 …: the WHATWG model fails the connection for good.
      discardBody(response);
      this._stop("stopped", { reason: "unexpected_status", status });
      return;
    }
    const detail = await readErrorDetail(response);
    if (attempt.dead) return;
    if (status === 401) {
      this._rejectedTokens.add(token);
      if (tokenReason === "unauthorized") {
        this._stop("stopped", { reason: "unauthorized", status, detail });
      } else {
        attempt.dead = true;
        this._attempt = null;
        this._connect("unauthorized", "token_refresh");
      }
      return;
    }
    const reason = status === 403 ? "forbidden" : status === 404 ? "not_found" : "client_error";
    this._stop("stopped", { reason, status, detail });
  }

  async _readBody(attempt, response) {
    attempt.epoch = response.headers.get("X-Event-Epoch");
    this._reconnect.failures = 0;
    attempt.committedId = this._lastEventId;
    const parser = createParser({
      lastEventId: this._lastEventId,
      onEvent: (event) => this._onParsedEvent(attempt, parser, event),
      onRetry: (ms) => {
        if (!attempt.dead) this._reconnect.retryMs = ms;
      },
      onComment: (text) => {
        if (!attempt.dead) this._call("onComment", text);
      },
    });
    this._setState("open", { status: 200, epoch: attempt.epoch });
    if (attempt.dead) {
      discardBody(response);
      return;
    }
    if (response.body === null) {
      this._endOfStream(attempt, parser, "end_of_stream", {});
      return;
    }
    const reader = response.body.getReader();
    attempt.reader = reader;
    try {
      for (;;) {
        while (this._paused && !attempt.dead) {
          await new Promise((resolve) => this._resumeWaiters.push(resolve));
        }
        if (attempt.dead) return;
        const { done, value } = await reader.read();
        if (attempt.dead) return;
        if (done) break;
        parser.feedBytes(value);
        if (attempt.dead) return; // a terminal frame in this chunk ended the connection
        this._syncCursor(attempt, parser);
      }
    } catch (error) {
      if (!attempt.dead) this._endOfStream(attempt, parser, "network_error", { error });
      return;
    }
    this._endOfStream(attempt, parser, "end_of_stream", {});
  }

  _endOfStream(attempt, parser, reason, info) {
    attempt.dead = true;
    parser.end(); // SC-7: the unfinished block is discarded, its id never committed
    this._attempt = null;
    this._scheduleReconnect(reason, info);
  }

  _syncCursor(attempt, parser) {
    // The cursor only moves when an `id` field was committed on this connection, so its
    // epoch is the one this response announced (EB-13, EB-17). Compared with what this
    // connection committed before, not with the cursor: a cursor adopted meanwhile
    // (`adoptCursor`) stays until the next id.
    if (parser.lastEventId !== attempt.committedId) {
      attempt.committedId = parser.lastEventId;
      this._lastEventId = parser.lastEventId;
      this._epoch = attempt.epoch;
    }
  }

  _onParsedEvent(attempt, parser, event) {
    if (attempt.dead) return; // bytes after a terminal frame are not delivered
    this._syncCursor(attempt, parser);
    const frame = {
      type: event.type,
      data: event.data,
      json: tryParseJson(event.data),
      lastEventId: event.lastEventId,
      id: event.idField,
    };
    this._call("onEvent", frame);
    if (frame.type === "state_resync_required") this._call("onResyncRequired", frame);
    const terminal = this._attempt === attempt ? terminalFrame(frame.type, frame.json) : null;
    if (terminal !== null) {
      if (terminal.tokenRejected) {
        this._rejectedTokens.add(attempt.token);
        this._freshTokenNext = true;
      }
      this._abortAttempt();
      this._scheduleReconnect(frame.type, { detail: terminal.detail });
    }
  }
}

/**
 * @typedef {object} Attempt
 * @property {AbortController} controller  One per attempt (SC-13).
 * @property {ReadableStreamDefaultReader|null} reader
 * @property {boolean} dead  Set once the attempt is over; stale continuations check it.
 * @property {string|null} epoch  `X-Event-Epoch` of this attempt's response.
 * @property {string|null} token  The bearer token this attempt sent.
 */

function tryParseJson(data) {
  try {
    return JSON.parse(data);
  } catch {
    return undefined;
  }
}

