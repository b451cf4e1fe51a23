/**
 * reconnect.js — what the session page's stream clients share: the SSE client (./sse.js),
 * the WebSocket subscription (./ws.js) and the socket it rides (./ws_socket.js).
 *
 * - `STATES`, the stream states both clients go through, and `RECONNECT_DEFAULTS`;
 * - the cursor and `maxQueued` checks of their options (SC-9, EB-14, EB-17);
 * - `ReconnectTimer`: the one pending reconnect, with the reconnection time in force and the
 *   failures counted since the last open, its delay from `computeReconnectDelayMs`
 *   (./sse_backoff.js, SC-11);
 * - `RejectedTokens`: the tokens the server refused, never sent again;
 * - `terminalFrame()`: what a `client_evicted` or `stream_error` frame means (SC-12);
 * - `callSafely()`: a callback that throws never breaks the client.
 *
 * No DOM dependency: runs in the browser and under Node 20 (`node --test tests/js/`).
 * Rules cited as `SC-n` and `EB-n` are in `docs/protocol.md` (its rule index).
 */
import { computeReconnectDelayMs } from "./sse_backoff.js";

/**
 * The states of a stream client, in the order a normal life goes through them.
 * "stopped" and "ended" are terminal.
 * @type {ReadonlyArray<string>}
 */
export const STATES = Object.freeze(["idle", "connecting", "open", "reconnecting", "stopped", "ended"]);

/**
 * The reconnect's defaults, ms (SC-11): the reconnection time before the server sends one
 * (`initialRetryMs`), the cap of the exponential backoff (`capMs`) and the least base it
 * grows from (`floorMs`). The clients' options of the same names override them.
 */
export const RECONNECT_DEFAULTS = Object.freeze({ initialRetryMs: 3000, capMs: 30000, floorMs: 1000 });

/**
 * Frames that end the subscription they arrive on (SC-12, EB-5, EB-16, EB-19).
 * @type {ReadonlySet<string>}
 */
const TERMINAL_FRAME_TYPES = new Set(["client_evicted", "stream_error"]);

/** `stream_error` codes that mean "this token no longer works": the next attempt asks for a
 * fresh one (reason "unauthorized") and never resends this one. */
const TOKEN_ERROR_CODES = new Set(["token_revoked", "token_expired"]);

/** Rejected tokens remembered so that none is ever sent again; the oldest is forgotten. */
const MAX_REMEMBERED_REJECTED_TOKENS = 16;

const isLastEventId = (value) => typeof value === "string" && !/[\r\n\0]/.test(value);
const isEpoch = (value) => value === null || typeof value === "string";

/**
 * Whether `lastEventId` / `epoch` can be a cursor: a string free of CR, LF and NUL (it
 * travels in a `Last-Event-ID` header, SC-9) and a string or null (EB-17). Never throws.
 * @returns {boolean}
 */
export function isCursor(lastEventId, epoch) {
  return isLastEventId(lastEventId) && isEpoch(epoch);
}

/**
 * Check a client's `lastEventId` and `epoch` options (see `isCursor`).
 * @param {string} owner  The class name the message starts with.
 * @throws {TypeError} `lastEventId` not a string free of CR, LF and NUL; `epoch` not a
 *   string or null.
 */
export function checkCursor(owner, lastEventId, epoch) {
  if (!isLastEventId(lastEventId)) throw new TypeError(`${owner}: lastEventId must be a string without CR, LF or NUL`);
  if (!isEpoch(epoch)) throw new TypeError(`${owner}: epoch must be a string or null`);
}

/**
 * Check a client's `maxQueued` option: undefined (the server's default) or an integer in
 * [16, 2048] (EB-14).
 * @param {string} owner  The class name the message starts with.
 * @throws {RangeError} otherwise.
 */
export function checkMaxQueued(owner, maxQueued) {
  if (maxQueued !== undefined && !(Number.isInteger(maxQueued) && maxQueued >= 16 && maxQueued <= 2048)) {
    throw new RangeError(`${owner}: maxQueued must be an integer in [16, 2048] (EB-14)`);
  }
}

/**
 * Call `fn(...args)` if it is a function; what it throws goes to `report(error)`, and what
 * `report` throws is dropped. Never throws.
 * @param {unknown} fn
 * @param {Array<unknown>} args
 * @param {(error: unknown) => void} report
 */
export function callSafely(fn, args, report) {
  if (typeof fn !== "function") return;
  try {
    fn(...args);
  } catch (error) {
    try {
      report(error);
    } catch {
      // the error reporter itself failed: nothing more can be done
    }
  }
}

/**
 * What a frame means for the subscription it arrived on: null unless it is a terminal
 * frame (`client_evicted`, `stream_error`: the server ended the subscription, SC-12).
 * Never throws.
 * @param {string} type  The frame's event type.
 * @param {unknown} envelope  The frame's parsed JSON (`{v, type, data, …}`), whatever it is.
 * @returns {null|{data: object, detail: string|undefined, tokenRejected: boolean}}
 *   `data`: the envelope's `data` object ({} when it has none); `detail`: its `reason`,
 *   `code` or `error`; `tokenRejected`: a `stream_error` saying the token was revoked or
 *   expired (the next attempt wants a fresh one).
 */
export function terminalFrame(type, envelope) {
  if (!TERMINAL_FRAME_TYPES.has(type)) return null;
  const inner = envelope !== null && typeof envelope === "object" ? envelope.data : undefined;
  const data = inner !== null && typeof inner === "object" ? inner : {};
  return {
    data,
    detail: data.reason ?? data.code ?? data.error,
    tokenRejected: type === "stream_error" && TOKEN_ERROR_CODES.has(data.code),
  };
}

/** The tokens the server refused (401, `unauthorized`, a revoked or expired token): the last 16. */
export class RejectedTokens {
  constructor() {
    /** @type {Set<string>} */
    this._tokens = new Set();
  }

  /** Remember `token`, forgetting the oldest past 16. A non-string is ignored. Never throws. */
  add(token) {
    if (typeof token !== "string") return;
    this._tokens.add(token);
    if (this._tokens.size > MAX_REMEMBERED_REJECTED_TOKENS) this._tokens.delete(this._tokens.values().next().value);
  }

  /** Whether `token` was refused. */
  has(token) {
    return this._tokens.has(token);
  }
}

/**
 * A client's one pending reconnect (SC-11).
 *
 * `retryMs` (the reconnection time in force, ms) and `failures` (consecutive attempts that
 * never opened) are the client's to set; `schedule(onFire)` cancels any pending reconnect
 * and sets one after `computeReconnectDelayMs` of them. A timer that fires after it was
 * cancelled or replaced does nothing. Never throws (unless `onFire` does).
 */
export class ReconnectTimer {
  /**
   * @param {object} options
   * @param {number} options.retryMs  The reconnection time before the server sends one.
   * @param {number} options.capMs  Cap of the exponential backoff.
   * @param {number} options.floorMs  Minimum base of the exponential backoff.
   * @param {() => number} options.random  Uniform in [0, 1).
   * @param {(fn: Function, ms: number) => unknown} options.setTimer
   * @param {(handle: unknown) => void} options.clearTimer
   */
  constructor({ retryMs, capMs, floorMs, random, setTimer, clearTimer }) {
    this.retryMs = retryMs;
    this.failures = 0;
    this._backoff = { capMs, floorMs, random };
    this._setTimer = setTimer;
    this._clearTimer = clearTimer;
    this._timer = null;
    this._token = null;
    this._delayMs = null;
  }

  /** The delay of the pending reconnect in ms, or null when none is scheduled. */
  get currentDelayMs() {
    return this._delayMs;
  }

  /**
   * Cancel any pending reconnect and call `onFire()` after the backoff's delay.
   * @param {() => void} onFire
   * @returns {number} the delay, ms.
   */
  schedule(onFire) {
    const delayMs = computeReconnectDelayMs({ retryMs: this.retryMs, failures: this.failures, ...this._backoff });
    this.cancel();
    // The token guards against a timer that fires after it was cancelled or replaced.
    const token = {};
    this._token = token;
    this._delayMs = delayMs;
    this._timer = this._setTimer(() => {
      if (this._token !== token) return;
      this._timer = null;
      this._token = null;
      this._delayMs = null;
      onFire();
    }, delayMs);
    return delayMs;
  }

  /** Cancel the pending reconnect, if any. Idempotent. */
  cancel() {
    if (this._timer !== null) this._clearTimer(this._timer);
    this._timer = null;
    this._token = null;
    this._delayMs = null;
  }
}
