// Helpers of the SessionEventStream tests (tests/js/sse_*.test.mjs): a fake fetch that returns
// real Response objects with ReadableStream bodies, and (./timer_support.mjs) timers fired by
// hand and `until()`, which only yields to the event loop a bounded number of times. No wall
// clock.
import { SessionEventStream } from "../../static/qwenweb/sse.js";
import { fakeTimers, T, until } from "./timer_support.mjs";

export { fakeTimers, T, until };

export const URL_ = "/session/s1/events";
export const encoder = new TextEncoder();

/**
 * A fake server: each fetch call takes the next scripted reply. Every call is recorded with
 * its URL, a copy of its headers and its signal; `stream()` replies expose `call.body` to
 * push text into, close or cut. Like a real fetch, aborting the signal errors the body.
 */
export function fakeServer() {
  const replies = [];
  const calls = [];
  async function fetch(url, init) {
    const call = { url, headers: new Headers(init.headers), signal: init.signal, body: null };
    calls.push(call);
    const reply = replies.shift();
    if (!reply) throw new Error(`unexpected fetch #${calls.length}`);
    return reply(call);
  }
  return {
    fetch,
    calls,
    stream({ epoch = "ep1", contentType = "text/event-stream" } = {}) {
      replies.push((call) => {
        let controller;
        const body = new ReadableStream({ start: (c) => (controller = c) });
        const cut = (error) => {
          try {
            controller.error(error);
          } catch {
            // already closed or cancelled
          }
        };
        call.signal.addEventListener("abort", () => cut(new DOMException("aborted", "AbortError")));
        call.body = {
          push: (text) => controller.enqueue(encoder.encode(text)),
          close: () => controller.close(),
          cut: () => cut(new TypeError("network error")),
        };
        const headers = { "Content-Type": contentType };
        if (epoch !== null) headers["X-Event-Epoch"] = epoch;
        return new Response(body, { status: 200, headers });
      });
    },
    status(status, json) {
      replies.push(() =>
        new Response(json === undefined ? null : JSON.stringify(json), {
          status,
          headers: { "Content-Type": "application/json" },
        }),
      );
    },
    networkError() {
      replies.push(() => Promise.reject(new TypeError("fetch failed")));
    },
  };
}

/** Build a stream wired to a fake server and fake timers, recording every callback. */
export function harness(options = {}) {
  const server = fakeServer();
  const timers = fakeTimers();
  const tokens = options.tokens ?? ["t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8"];
  const log = { states: [], events: [], delays: [], resyncs: [], tokenReasons: [], callbackErrors: [] };
  const stream = new SessionEventStream({
    url: URL_,
    fetch: server.fetch,
    getToken: async (reason) => {
      log.tokenReasons.push(reason);
      return tokens[Math.min(log.tokenReasons.length, tokens.length) - 1];
    },
    onEvent: (event) => log.events.push(event),
    onStateChange: (state, info) => log.states.push([state, info.reason]),
    onRetryScheduled: (delayMs) => log.delays.push(delayMs),
    onResyncRequired: (frame) => log.resyncs.push(frame),
    onCallbackError: (error) => log.callbackErrors.push(error),
    random: () => 0.5,
    setTimeout: timers.setTimeout,
    clearTimeout: timers.clearTimeout,
    ...options.stream,
  });
  const lastState = () => log.states.at(-1)?.[0];
  const waitState = (state) => until(() => lastState() === state, `state ${state}`);
  const waitCalls = (n) => until(() => server.calls.length >= n, `${n} fetch calls`);
  const waitEvents = (n) => until(() => log.events.length >= n, `${n} events`);
  return { server, timers, log, stream, lastState, waitState, waitCalls, waitEvents };
}

export const frame = (id, type, data = {}) =>
  `${id === null ? "" : `id: ${id}\n`}event: ${type}\ndata: ${JSON.stringify({ ...(id === null ? {} : { id }), v: 1, type, data })}\n\n`;

/** Open the n-th connection of `h` (already scripted) and wait until it is readable. */
export async function openCall(h, n) {
  await h.waitCalls(n);
  await until(() => h.server.calls[n - 1].body !== null && h.lastState() === "open", `call ${n} open`);
  return h.server.calls[n - 1];
}
