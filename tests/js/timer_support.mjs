// What the client tests (tests/js/sse_support.mjs, ws_support.mjs, shared_stream.test.mjs)
// share to wait without the wall clock: `until()` and `settle()`, which yield to the event
// loop a bounded number of times, and timers that fire only when the test says so.
import assert from "node:assert/strict";

/** The options of every test: a hung one fails after 5 s. */
export const T = { timeout: 5000 };

/** Yield to the event loop until `predicate()` holds; fail naming `what` after 500 turns. */
export async function until(predicate, what) {
  for (let turn = 0; turn < 500; turn += 1) {
    if (predicate()) return;
    await new Promise((resolve) => setImmediate(resolve));
  }
  assert.fail(`never happened: ${what}`);
}

/** Let pending promise continuations run (a bounded number of event-loop turns). */
export async function settle() {
  for (let turn = 0; turn < 20; turn += 1) await new Promise((resolve) => setImmediate(resolve));
}

/** Timers that fire only when the test says so, picked by their delay. */
export function fakeTimers() {
  const timers = [];
  return {
    setTimeout(fn, ms) {
      timers.push({ fn, ms, live: true });
      return timers.length;
    },
    clearTimeout(handle) {
      if (timers[handle - 1]) timers[handle - 1].live = false;
    },
    /** Delays of the timers still pending, in the order they were set. */
    get pending() {
      return timers.filter((t) => t.live).map((t) => t.ms);
    },
    /** Fire the one pending timer of delay `ms` (any delay when omitted and only one pends); return its delay. */
    fire(ms) {
      const live = timers.filter((t) => t.live && (ms === undefined || t.ms === ms));
      assert.equal(live.length, 1, `exactly one pending timer of ${ms ?? "any"} ms (pending: ${this.pending})`);
      live[0].live = false;
      live[0].fn();
      return live[0].ms;
    },
  };
}
