/**
 * sse_backoff.js — when the session page's stream tries again (SC-11).
 *
 * The reconnection delay of `SessionEventStream` (./sse.js, which re-exports it), as one
 * pure function, so that it can be tested without timers. The terminal client
 * (`sessions/api_client.py`) follows the same rule. No DOM dependency; runs under Node 20.
 * Rules cited as `SC-n` are in `docs/protocol.md` (its rule index).
 */

/** Largest delay setTimeout honours; larger values fire at once in browsers and Node. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * Compute the delay before the next connection attempt (SC-11), in milliseconds.
 *
 * - `failures === 0` (the last connection was opened: normal end, cut mid-stream, a terminal
 *   frame, drop()) → exactly `retryMs`, the server's reconnection time (HTML §9.2.3).
 * - `failures >= 1` consecutive attempts that never opened → exponential with jitter:
 *   `ceiling = min(capMs, base * 2**failures)` where `base = max(retryMs, floorMs)`, and
 *   the delay is uniform in `[ceiling/2, ceiling]`, never below `retryMs`. `floorMs` keeps a
 *   server's `retry: 0` from turning failures into a tight loop.
 * The result is clamped to 2**31-1 (setTimeout's limit). Pure; never throws.
 *
 * @param {object} args
 * @param {number} args.retryMs   Reconnection time in force, ms.
 * @param {number} args.failures  Consecutive failed attempts since the last open, ≥ 0.
 * @param {number} args.capMs     Upper bound of the exponential growth, ms.
 * @param {number} args.floorMs   Lower bound of the exponential base, ms.
 * @param {() => number} args.random  Uniform in [0, 1).
 * @returns {number} delay in ms (integer)
 */
export function computeReconnectDelayMs({ retryMs, failures, capMs, floorMs, random }) {
  let delay;
  if (failures <= 0) {
    delay = retryMs;
  } else {
    const base = Math.max(retryMs, floorMs);
    const ceiling = Math.min(capMs, base * 2 ** Math.min(failures, 52));
    delay = Math.max(retryMs, ceiling / 2 + random() * (ceiling / 2));
  }
  return Math.min(Math.round(delay), MAX_TIMER_MS);
}
