// Tests of SessionEventStream (static/qwenweb/sse.js, with sse_request.js and sse_backoff.js)
// against a fake fetch that returns real Response objects with ReadableStream bodies. Rules: SC-9..SC-13 and EB-12..EB-19 of
// docs/protocol.md.
// No test waits on the wall clock: timers are injected and fired by hand, and `until()` only
// yields to the event loop a bounded number of times.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import * as sse from "../../static/qwenweb/sse.js";
import { computeReconnectDelayMs } from "../../static/qwenweb/sse_backoff.js";
import { contentTypeEssence, createParser } from "../../static/qwenweb/sse_parser.js";

const { SessionEventStream, STATES } = sse;

const T = { timeout: 5000 };
const URL_ = "/session/s1/events";
const encoder = new TextEncoder();

/** Yield to the event loop until `predicate()` holds; fail naming `what` after 500 turns. */
async function until(predicate, what) {
  for (let turn = 0; turn < 500; turn += 1) {
    if (predicate()) return;
    await new Promise((resolve) => setImmediate(resolve));
  }
  assert.fail(`never happened: ${what}`);
}

/** Timers that only fire when the test says so. */
function fakeTimers() {
  const timers = [];
  return {
    setTimeout(fn, ms) {
      timers.push({ fn, ms, live: true });
      return timers.length;
    },
    clearTimeout(handle) {
      if (timers[handle - 1]) timers[handle - 1].live = false;
    },
    /** Delays of the timers still pending. */
    get pending() {
      return timers.filter((t) => t.live).map((t) => t.ms);
    },
    /** Fire the one pending timer and return its delay. */
    fire() {
      const live = timers.filter((t) => t.live);
      assert.equal(live.length, 1, "exactly one pending timer");
      live[0].live = false;
      live[0].fn();
      return live[0].ms;
    },
  };
}

/**
 * A fake server: each fetch call takes the next scripted reply. Every call is recorded with
 * its URL, a copy of its headers and its signal; `stream()` replies expose `call.body` to
 * push text into, close or cut. Like a real fetch, aborting the signal errors the body.
 */
function fakeServer() {
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
function harness(options = {}) {
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

const frame = (id, type, data = {}) =>
  `${id === null ? "" : `id: ${id}\n`}event: ${type}\ndata: ${JSON.stringify({ ...(id === null ? {} : { id }), v: 1, type, data })}\n\n`;

/** Open the n-th connection of `h` (already scripted) and wait until it is readable. */
async function openCall(h, n) {
  await h.waitCalls(n);
  await until(() => h.server.calls[n - 1].body !== null && h.lastState() === "open", `call ${n} open`);
  return h.server.calls[n - 1];
}

describe("SC-9 request headers", () => {
  test("first connection without a cursor sends the bearer token and no Last-Event-ID or epoch", T, async () => {
    const h = harness();
    h.server.stream();
    h.stream.start();
    const call = await openCall(h, 1);
    assert.equal(call.url, URL_);
    assert.deepEqual([...call.headers], [["accept", "text/event-stream"], ["authorization", "Bearer t1"]]);
    h.stream.close();
  });

  test("an initial cursor and epoch are sent on the first request, each exactly once", T, async () => {
    const h = harness({ stream: { lastEventId: "41", epoch: "epA" } });
    h.server.stream({ epoch: "epA" });
    h.stream.start();
    const call = await openCall(h, 1);
    assert.deepEqual([...call.headers].filter(([name]) => name === "last-event-id"), [["last-event-id", "41"]]);
    assert.equal(call.headers.get("x-event-epoch"), "epA");
    h.stream.close();
  });

  test("after reconnects the cursor header is still sent exactly once, with the latest id", T, async () => {
    const h = harness();
    for (let i = 0; i < 3; i += 1) h.server.stream();
    h.stream.start();
    for (let n = 1; n <= 3; n += 1) {
      const call = await openCall(h, n);
      call.body.push(frame(n * 10, "chat"));
      call.body.close();
      await h.waitState("reconnecting");
      if (n < 3) h.timers.fire();
    }
    const sent = h.server.calls.map((c) => c.headers.get("last-event-id"));
    assert.deepEqual(sent, [null, "10", "20"]);
    h.stream.close();
  });

  test("an adopted cursor (a resync's snapshot) is sent on reconnect; a frame without id keeps it", T, async () => {
    const h = harness();
    h.server.stream({ epoch: "old" });
    h.server.stream({ epoch: "new" });
    h.stream.start();
    const first = await openCall(h, 1);
    first.body.push(frame(7, "chat"));
    await h.waitEvents(1);
    h.stream.adoptCursor("100000", "new");
    first.body.push(frame(null, "replay_complete"));
    await h.waitEvents(2);
    assert.deepEqual([h.stream.lastEventId, h.stream.epoch], ["100000", "new"]);
    first.body.close();
    await h.waitState("reconnecting");
    h.timers.fire();
    const second = await openCall(h, 2);
    assert.equal(second.headers.get("last-event-id"), "100000");
    assert.equal(second.headers.get("x-event-epoch"), "new");
    h.stream.close();
  });

  test("an id reset to empty by the server removes the Last-Event-ID header on reconnect", T, async () => {
    const h = harness();
    h.server.stream();
    h.server.stream();
    h.stream.start();
    const first = await openCall(h, 1);
    first.body.push("id: 5\ndata: a\n\nid\ndata: b\n\n");
    first.body.close();
    await h.waitState("reconnecting");
    h.timers.fire();
    const second = await openCall(h, 2);
    assert.equal(second.headers.get("last-event-id"), null);
    assert.equal(second.headers.get("x-event-epoch"), null);
    h.stream.close();
  });

  test("a non-ASCII id is sent as UTF-8 bytes", T, async () => {
    const h = harness({ stream: { lastEventId: "ü" } });
    h.server.stream();
    h.stream.start();
    const call = await openCall(h, 1);
    assert.equal(call.headers.get("last-event-id"), "\u00c3\u00bc");
    h.stream.close();
  });

  test("synthetic frames (no id:) never move the cursor and have id null", T, async () => {
    const h = harness();
    h.server.stream();
    h.stream.start();
    const call = await openCall(h, 1);
    call.body.push(frame(7, "chat") + frame(null, "replay_complete", { replayedCount: 0 }));
    call.body.push(frame(null, "slow_client_warning", { queueSize: 3 }));
    await h.waitEvents(3);
    assert.deepEqual(h.log.events.map((e) => [e.type, e.id, e.lastEventId]), [
      ["chat", "7", "7"],
      ["replay_complete", null, "7"],
      ["slow_client_warning", null, "7"],
    ]);
    assert.equal(h.stream.lastEventId, "7");
    h.stream.close();
  });

  test("the server's leading retry block does not blank a resumed cursor", T, async () => {
    const h = harness({ stream: { lastEventId: "41", epoch: "epA" } });
    h.server.stream({ epoch: "epA" });
    h.server.stream({ epoch: "epA" });
    h.stream.start();
    const first = await openCall(h, 1);
    first.body.push("retry: 3000\n\n" + frame(null, "replay_complete", { replayedCount: 0 }));
    first.body.close();
    await h.waitState("reconnecting");
    h.timers.fire();
    const second = await openCall(h, 2);
    assert.equal(second.headers.get("last-event-id"), "41");
    h.stream.close();
  });
});

describe("SC-9 / EB-17 the epoch travels with the cursor", () => {
  test("the epoch announced by a response is adopted once an event with an id arrives on it", T, async () => {
    const h = harness({ stream: { lastEventId: "3", epoch: "old" } });
    h.server.stream({ epoch: "new" });
    h.server.stream({ epoch: "new" });
    h.stream.start();
    const first = await openCall(h, 1);
    first.body.push(frame(null, "state_resync_required", { reason: "epoch_reset" }) + frame(1, "chat"));
    first.body.close();
    await h.waitState("reconnecting");
    assert.equal(h.stream.epoch, "new");
    h.timers.fire();
    const second = await openCall(h, 2);
    assert.equal(second.headers.get("last-event-id"), "1");
    assert.equal(second.headers.get("x-event-epoch"), "new");
    h.stream.close();
  });

  test("a connection that delivers no id keeps the cursor's old epoch", T, async () => {
    const h = harness({ stream: { lastEventId: "3", epoch: "old" } });
    h.server.stream({ epoch: "other" });
    h.server.stream();
    h.stream.start();
    const first = await openCall(h, 1);
    first.body.push(frame(null, "replay_complete", { replayedCount: 0 }));
    first.body.close();
    await h.waitState("reconnecting");
    h.timers.fire();
    const second = await openCall(h, 2);
    assert.equal(second.headers.get("x-event-epoch"), "old");
    h.stream.close();
  });
});

describe("SC-10 response checks", () => {
  test("200 text/event-stream opens and delivers parsed frames with raw data and json", T, async () => {
    const h = harness();
    h.server.stream({ epoch: "ep9" });
    h.stream.start();
    const call = await openCall(h, 1);
    call.body.push(frame(1, "chat", { text: "hi" }) + "event: raw\ndata: not json\n\n");
    await h.waitEvents(2);
    const [chat, raw] = h.log.events;
    assert.equal(chat.type, "chat");
    assert.equal(chat.data, '{"id":1,"v":1,"type":"chat","data":{"text":"hi"}}');
    assert.deepEqual(chat.json.data, { text: "hi" });
    assert.deepEqual([raw.type, raw.data, raw.json], ["raw", "not json", undefined]);
    assert.deepEqual([h.stream.state, h.stream.lastEventId, h.stream.epoch], ["open", "1", "ep9"]);
    h.stream.close();
  });

  test("Content-Type Text/Event-Stream; charset=utf-8 is accepted", T, async () => {
    const h = harness();
    h.server.stream({ contentType: "Text/Event-Stream; charset=utf-8" });
    h.stream.start();
    const call = await openCall(h, 1);
    call.body.push("data: ok\n\n");
    await h.waitEvents(1);
    h.stream.close();
  });

  test("200 with text/plain is retried with backoff, not parsed", T, async () => {
    const h = harness();
    h.server.stream({ contentType: "text/plain" });
    h.stream.start();
    await h.waitState("reconnecting");
    assert.deepEqual(h.log.states.at(-1), ["reconnecting", "bad_content_type"]);
    assert.deepEqual(h.timers.pending, [4500]);
    h.stream.close();
  });

  test("204 stops for good with state ended and no reconnect", T, async () => {
    const h = harness();
    h.server.status(204);
    h.stream.start();
    await h.waitState("ended");
    assert.deepEqual(h.log.states.at(-1), ["ended", "session_ended"]);
    assert.deepEqual(h.timers.pending, []);
  });

  for (const [status, reason] of [[403, "forbidden"], [404, "not_found"], [400, "client_error"], [429, "client_error"]]) {
    test(`${status} stops with reason ${reason} and never reconnects`, T, async () => {
      const h = harness();
      h.server.status(status, { error: "nope", code: "some_code" });
      h.stream.start();
      await h.waitState("stopped");
      assert.deepEqual(h.log.states.at(-1), ["stopped", reason]);
      assert.deepEqual(h.timers.pending, []);
      assert.equal(h.server.calls.length, 1);
    });
  }

  test("the stop info carries the status and the server's error code", T, async () => {
    const h = harness();
    let info;
    h.server.status(403, { error: "no read access", code: "forbidden" });
    const stream = new SessionEventStream({
      url: URL_, fetch: h.server.fetch, getToken: () => "t", onStateChange: (_state, i) => (info = i),
    });
    stream.start();
    await until(() => stream.state === "stopped", "stopped");
    assert.deepEqual(info, { reason: "forbidden", status: 403, detail: "forbidden: no read access" });
  });

  for (const status of [500, 502, 503]) {
    test(`${status} is retried with backoff`, T, async () => {
      const h = harness();
      h.server.status(status);
      h.stream.start();
      await h.waitState("reconnecting");
      assert.deepEqual(h.log.states.at(-1), ["reconnecting", "server_error"]);
      assert.equal(h.timers.pending.length, 1);
      h.stream.close();
    });
  }

  test("a fetch that rejects (network error) is retried with backoff", T, async () => {
    const h = harness();
    h.server.networkError();
    h.server.stream();
    h.stream.start();
    await h.waitState("reconnecting");
    assert.deepEqual(h.log.states.at(-1), ["reconnecting", "network_error"]);
    h.timers.fire();
    await openCall(h, 2);
    h.stream.close();
  });
});

describe("SC-10 / WHATWG: a 2xx or 3xx other than 200 and 204 fails the connection for good", () => {
  for (const status of [201, 202, 205, 206, 299, 301, 304, 399]) {
    test(`${status} stops with reason unexpected_status and never reconnects`, T, async () => {
      const h = harness();
      h.server.status(status);
      h.stream.start();
      await h.waitState("stopped");
      assert.deepEqual(h.log.states.at(-1), ["stopped", "unexpected_status"]);
      assert.deepEqual(h.timers.pending, []);
      assert.equal(h.server.calls.length, 1);
      assert.deepEqual(h.log.delays, []);
    });
  }

  test("the stop info of a 201 carries the status, for the page to show", T, async () => {
    const server = fakeServer();
    let info;
    server.status(201);
    const stream = new SessionEventStream({
      url: URL_, fetch: server.fetch, getToken: () => "t", onStateChange: (_state, i) => (info = i),
    });
    stream.start();
    await until(() => stream.state === "stopped", "stopped");
    assert.deepEqual(info, { reason: "unexpected_status", status: 201 });
  });

  test("a 503 is retried with backoff until a 200 opens the stream", T, async () => {
    const h = harness();
    h.server.status(503, { error: { code: "backend_unavailable", message: "later" } });
    h.server.status(503);
    h.server.stream();
    h.stream.start();
    await h.waitState("reconnecting");
    assert.deepEqual(h.log.states.at(-1), ["reconnecting", "server_error"]);
    h.timers.fire();
    await until(() => h.server.calls.length === 2 && h.lastState() === "reconnecting", "second failure");
    h.timers.fire();
    await openCall(h, 3);
    assert.equal(h.log.delays.length, 2);
    assert.ok(h.log.delays[1] >= h.log.delays[0], "the delay grows with consecutive failures");
    h.stream.close();
  });
});

describe("connection wait: no response headers after connectWaitMs", () => {
  /** A fetch whose answer comes only when the test calls `answer()`. */
  function heldFetch() {
    const held = { calls: 0, answer: null, fail: null };
    held.fetch = (_url, init) => {
      held.calls += 1;
      return new Promise((resolve, reject) => {
        const body = new ReadableStream({ start: (c) => c.enqueue(encoder.encode(": hi\n\n")) }); // stays open
        held.answer = () => resolve(new Response(body, { status: 200, headers: { "Content-Type": "text/event-stream" } }));
        held.fail = reject;
        init.signal.addEventListener("abort", () => reject(new DOMException("aborted", "AbortError")));
      });
    };
    return held;
  }

  test("after connectWaitMs without headers the client says so, keeps waiting, and clears it on the answer", T, async () => {
    const timers = fakeTimers();
    const held = heldFetch();
    const waits = [];
    const stream = new SessionEventStream({
      url: URL_, getToken: () => "t", fetch: held.fetch, connectWaitMs: 5000,
      setTimeout: timers.setTimeout, clearTimeout: timers.clearTimeout,
      onConnectionWait: (waiting) => waits.push(waiting),
    });
    stream.start();
    await until(() => held.calls === 1, "fetch issued");
    assert.deepEqual(timers.pending, [5000]);
    timers.fire();
    assert.deepEqual(waits, [true]);
    assert.equal(stream.state, "connecting", "still waiting for the same request");
    assert.equal(held.calls, 1, "no second request while the first waits");
    held.answer();
    await until(() => stream.state === "open", "open");
    assert.deepEqual(waits, [true, false]);
    stream.close();
  });

  test("an answer before connectWaitMs never raises the notice", T, async () => {
    const timers = fakeTimers();
    const held = heldFetch();
    const waits = [];
    const stream = new SessionEventStream({
      url: URL_, getToken: () => "t", fetch: held.fetch,
      setTimeout: timers.setTimeout, clearTimeout: timers.clearTimeout,
      onConnectionWait: (waiting) => waits.push(waiting),
    });
    stream.start();
    await until(() => held.calls === 1, "fetch issued");
    held.answer();
    await until(() => stream.state === "open", "open");
    assert.deepEqual(timers.pending, [], "the wait timer was cleared");
    assert.deepEqual(waits, []);
    stream.close();
  });

  test("close() while waiting clears the notice", T, async () => {
    const timers = fakeTimers();
    const held = heldFetch();
    const waits = [];
    const stream = new SessionEventStream({
      url: URL_, getToken: () => "t", fetch: held.fetch,
      setTimeout: timers.setTimeout, clearTimeout: timers.clearTimeout,
      onConnectionWait: (waiting) => waits.push(waiting),
    });
    stream.start();
    await until(() => held.calls === 1, "fetch issued");
    timers.fire();
    stream.close();
    assert.deepEqual(waits, [true, false]);
  });
});

describe("SC-10 401: one fresh token, never the rejected one", () => {
  test("401 asks for a fresh token and retries at once with it", T, async () => {
    const h = harness();
    h.server.status(401, { error: "expired", code: "unauthorized" });
    h.server.stream();
    h.stream.start();
    await openCall(h, 2);
    assert.deepEqual(h.log.tokenReasons, ["connect", "unauthorized"]);
    assert.deepEqual(h.server.calls.map((c) => c.headers.get("authorization")), ["Bearer t1", "Bearer t2"]);
    assert.deepEqual(h.timers.pending, [], "no backoff before the token retry");
    h.stream.close();
  });

  test("a second consecutive 401 with the fresh token stops", T, async () => {
    const h = harness();
    h.server.status(401);
    h.server.status(401);
    h.stream.start();
    await h.waitState("stopped");
    assert.deepEqual(h.log.states.at(-1), ["stopped", "unauthorized"]);
    assert.equal(h.server.calls.length, 2);
    assert.deepEqual(h.timers.pending, []);
  });

  test("a provider that returns the rejected token again stops without sending it", T, async () => {
    const h = harness({ tokens: ["same"] });
    h.server.status(401);
    h.stream.start();
    await h.waitState("stopped");
    assert.equal(h.server.calls.length, 1);
    assert.deepEqual(h.log.states.at(-1), ["stopped", "unauthorized"]);
  });

  test("a 401 on a later reconnect gets its own single fresh-token retry", T, async () => {
    const h = harness();
    h.server.stream();
    h.server.status(401);
    h.server.stream();
    h.stream.start();
    const first = await openCall(h, 1);
    first.body.close();
    await h.waitState("reconnecting");
    h.timers.fire();
    await openCall(h, 3);
    assert.deepEqual(h.log.tokenReasons, ["connect", "reconnect", "unauthorized"]);
    assert.deepEqual(h.server.calls.map((c) => c.headers.get("authorization")), ["Bearer t1", "Bearer t2", "Bearer t3"]);
    h.stream.close();
  });

  test("a token provider that throws stops with reason token_error", T, async () => {
    const server = fakeServer();
    const states = [];
    const stream = new SessionEventStream({
      url: URL_, fetch: server.fetch, getToken: async () => { throw new Error("logged out"); },
      onStateChange: (state, info) => states.push([state, info.reason]),
    });
    stream.start();
    await until(() => stream.state === "stopped", "stopped");
    assert.deepEqual(states, [["connecting", "start"], ["stopped", "token_error"]]);
    assert.equal(server.calls.length, 0);
  });
});

describe("SC-11 reconnection time and backoff", () => {
  test("a normal end of stream reconnects after the server's retry value", T, async () => {
    const h = harness();
    h.server.stream();
    h.stream.start();
    const call = await openCall(h, 1);
    call.body.push("retry: 1234\n\n");
    call.body.close();
    await h.waitState("reconnecting");
    assert.deepEqual(h.log.delays, [1234]);
    assert.equal(h.stream.currentDelayMs, 1234);
    h.stream.close();
  });

  test("the retry value is kept across connections that do not resend it", T, async () => {
    const h = harness();
    h.server.stream();
    h.server.stream();
    h.stream.start();
    const first = await openCall(h, 1);
    first.body.push("retry: 777\n\n");
    first.body.close();
    await h.waitState("reconnecting");
    h.timers.fire();
    const second = await openCall(h, 2);
    second.body.push("data: x\n\n");
    second.body.close();
    await until(() => h.log.delays.length === 2, "second delay");
    assert.deepEqual(h.log.delays, [777, 777]);
    assert.equal(h.stream.retryMs, 777);
    h.stream.close();
  });

  test("consecutive failures grow exponentially up to the cap; a successful connection resets", T, async () => {
    const h = harness({ stream: { capMs: 8000, initialRetryMs: 1000 } });
    for (let i = 0; i < 5; i += 1) h.server.status(503);
    h.server.stream();
    h.stream.start();
    for (let n = 1; n <= 5; n += 1) {
      await until(() => h.log.delays.length === n, `delay ${n}`);
      h.timers.fire();
    }
    const call = await openCall(h, 6);
    call.body.close();
    await until(() => h.log.delays.length === 6, "delay after success");
    // random() = 0.5 → 3/4 of min(cap, 1000·2^n); after an open connection: retry exactly.
    assert.deepEqual(h.log.delays, [1500, 3000, 6000, 6000, 6000, 1000]);
    assert.equal(h.stream.reconnectCount, 5);
    h.stream.close();
  });

  test("a network error mid-stream discards the half event and resumes from the last whole one", T, async () => {
    const h = harness();
    h.server.stream();
    h.server.stream();
    h.stream.start();
    const first = await openCall(h, 1);
    first.body.push(frame(1, "chat") + "id: 2\nevent: chat\ndata: {\"half");
    await h.waitEvents(1);
    first.body.cut();
    await h.waitState("reconnecting");
    assert.deepEqual(h.log.states.at(-1), ["reconnecting", "network_error"]);
    assert.deepEqual(h.log.delays, [3000], "the connection had opened: plain retry, no backoff");
    h.timers.fire();
    const second = await openCall(h, 2);
    assert.equal(second.headers.get("last-event-id"), "1");
    assert.equal(h.log.events.length, 1);
    h.stream.close();
  });
});

describe("computeReconnectDelayMs (SC-11)", () => {
  const base = { retryMs: 1000, capMs: 30000, floorMs: 1000 };
  test("after an opened connection the delay is exactly the retry value", T, () => {
    assert.equal(computeReconnectDelayMs({ ...base, failures: 0, random: () => 0.99 }), 1000);
  });

  test("jitter spans half to all of the ceiling and never goes below retry", T, () => {
    assert.equal(computeReconnectDelayMs({ ...base, failures: 1, random: () => 0 }), 1000);
    assert.equal(computeReconnectDelayMs({ ...base, failures: 3, random: () => 0 }), 4000);
    assert.equal(computeReconnectDelayMs({ ...base, failures: 3, random: () => 0.999999 }), 8000);
  });

  test("growth stops at the cap even after very many failures", T, () => {
    assert.equal(computeReconnectDelayMs({ ...base, failures: 5000, random: () => 0.999999 }), 30000);
  });

  test("retry 0 does not make failures loop tightly: the floor is the base", T, () => {
    assert.equal(computeReconnectDelayMs({ ...base, retryMs: 0, failures: 1, random: () => 0 }), 1000);
  });

  test("a huge server retry is clamped to what setTimeout honours", T, () => {
    assert.equal(computeReconnectDelayMs({ ...base, retryMs: 1e12, failures: 0, random: () => 0 }), 2 ** 31 - 1);
  });
});

describe("SC-12 frames with meaning for the client", () => {
  test("client_evicted ends the connection and reconnects with the cursor after retry", T, async () => {
    const h = harness();
    h.server.stream();
    h.server.stream();
    h.stream.start();
    const first = await openCall(h, 1);
    first.body.push(frame(4, "chat") + frame(null, "client_evicted", { reason: "queue_overflow" }) + frame(5, "late"));
    await h.waitState("reconnecting");
    assert.ok(first.signal.aborted, "the fetch is aborted");
    assert.deepEqual(h.log.events.map((e) => e.type), ["chat", "client_evicted"], "nothing after the terminal frame");
    assert.deepEqual(h.log.states.at(-1), ["reconnecting", "client_evicted"]);
    assert.deepEqual(h.log.delays, [3000]);
    h.timers.fire();
    const second = await openCall(h, 2);
    assert.equal(second.headers.get("last-event-id"), "4");
    h.stream.close();
  });

  test("stream_error after retry: 5000 (subscriber limit, EB-16) reconnects after 5000 ms", T, async () => {
    const h = harness();
    h.server.stream();
    h.stream.start();
    const call = await openCall(h, 1);
    call.body.push("retry: 5000\n\n" + frame(null, "stream_error", { code: "subscriber_limit_exceeded" }));
    await h.waitState("reconnecting");
    assert.ok(call.signal.aborted);
    assert.deepEqual(h.log.delays, [5000]);
    h.stream.close();
  });

  test("the drain's stream_error carries retry: in its own block: the reconnect waits that long (SC-11)", T, async () => {
    // What sessions.transport.stream.drain_frame() encodes: the retry field leads the
    // terminal block itself, so it must be taken before the frame ends the connection.
    const h = harness();
    h.server.stream();
    h.server.stream();
    h.stream.start();
    const call = await openCall(h, 1);
    call.body.push(frame(3, "note"));
    const drain = frame(null, "stream_error", { code: "server_draining", retryAfterMs: 7321 });
    call.body.push("retry: 7321\n" + drain);
    await h.waitState("reconnecting");
    assert.ok(call.signal.aborted);
    assert.deepEqual(h.log.delays, [7321]);
    assert.equal(h.stream.retryMs, 7321, "kept for the connections after");
    h.timers.fire();
    const second = await openCall(h, 2);
    assert.equal(second.headers.get("last-event-id"), "3");
    h.stream.close();
  });

  for (const code of ["token_revoked", "token_expired"]) {
    test(`stream_error ${code} reconnects with a fresh token and the cursor, never the old token`, T, async () => {
      const h = harness();
      h.server.stream();
      h.server.stream();
      h.stream.start();
      const first = await openCall(h, 1);
      first.body.push(frame(7, "note") + frame(null, "stream_error", { code }));
      await h.waitState("reconnecting");
      h.timers.fire();
      const second = await openCall(h, 2);
      assert.deepEqual(h.log.tokenReasons, ["connect", "unauthorized"]);
      assert.equal(second.headers.get("authorization"), "Bearer t2");
      assert.equal(second.headers.get("last-event-id"), "7");
      h.stream.close();
    });
  }

  test("another stream_error code reconnects with the same token", T, async () => {
    const h = harness();
    h.server.stream();
    h.server.stream();
    h.stream.start();
    const first = await openCall(h, 1);
    first.body.push(frame(null, "stream_error", { code: "server_disconnect" }));
    await h.waitState("reconnecting");
    h.timers.fire();
    await openCall(h, 2);
    assert.deepEqual(h.log.tokenReasons, ["connect", "reconnect"]);
    h.stream.close();
  });

  test("state_resync_required reaches onEvent and onResyncRequired; the stream goes on", T, async () => {
    const h = harness({ stream: { lastEventId: "9" } });
    h.server.stream();
    h.stream.start();
    const call = await openCall(h, 1);
    call.body.push(frame(null, "state_resync_required", { reason: "ring_evicted" }) + frame(20, "chat"));
    await h.waitEvents(2);
    assert.equal(h.log.resyncs.length, 1);
    assert.equal(h.log.resyncs[0].json.data.reason, "ring_evicted");
    assert.equal(h.stream.state, "open");
    h.stream.close();
  });

  test("unknown types are delivered raw and are never fatal", T, async () => {
    const h = harness();
    h.server.stream();
    h.stream.start();
    const call = await openCall(h, 1);
    call.body.push("event: mystery\ndata: <b>?</b>\n\n");
    await h.waitEvents(1);
    assert.deepEqual([h.log.events[0].type, h.log.events[0].data, h.stream.state], ["mystery", "<b>?</b>", "open"]);
    h.stream.close();
  });

  test("a callback that throws is reported and the stream carries on", T, async () => {
    const h = harness({ stream: { onEvent: () => { throw new Error("page bug"); } } });
    h.server.stream();
    h.stream.start();
    const call = await openCall(h, 1);
    call.body.push(frame(1, "a") + frame(2, "b"));
    await until(() => h.log.callbackErrors.length === 2, "two callback errors");
    assert.equal(h.stream.lastEventId, "2");
    h.stream.close();
  });
});

describe("SC-13 close, drop, pause", () => {
  test("close() aborts the fetch, stops for good and is idempotent", T, async () => {
    const h = harness();
    h.server.stream();
    h.stream.start();
    const call = await openCall(h, 1);
    h.stream.close();
    h.stream.close();
    assert.ok(call.signal.aborted);
    assert.deepEqual(h.log.states.slice(-1), [["stopped", "closed"]]);
    assert.equal(h.log.states.filter(([s]) => s === "stopped").length, 1);
    assert.deepEqual(h.timers.pending, []);
  });

  test("close() while waiting to reconnect cancels the timer", T, async () => {
    const h = harness();
    h.server.status(500);
    h.stream.start();
    await h.waitState("reconnecting");
    h.stream.close();
    assert.deepEqual(h.timers.pending, []);
    assert.equal(h.stream.currentDelayMs, null);
  });

  test("a reconnect timer that fires after close() despite clearTimeout does nothing", T, async () => {
    const h = harness();
    const fired = [];
    h.server.status(500);
    const stream = new SessionEventStream({
      url: URL_, fetch: h.server.fetch, getToken: () => "t", random: () => 0.5,
      setTimeout: (fn) => fired.push(fn), clearTimeout: () => {},
    });
    stream.start();
    await until(() => stream.state === "reconnecting", "reconnect scheduled");
    assert.equal(fired.length, 2, "the headers-wait timer, then the reconnect timer");
    stream.close();
    fired[1]();
    assert.equal(stream.state, "stopped");
    assert.equal(h.server.calls.length, 1);
  });

  test("close() while the token is being fetched sends no request", T, async () => {
    let release;
    const server = fakeServer();
    const stream = new SessionEventStream({
      url: URL_, fetch: server.fetch, getToken: () => new Promise((resolve) => (release = resolve)),
    });
    stream.start();
    stream.close();
    release("t");
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(server.calls.length, 0);
    assert.equal(stream.state, "stopped");
  });

  test("drop() aborts the current fetch and reconnects with the cursor after retry", T, async () => {
    const h = harness();
    h.server.stream({ epoch: "e1" });
    h.server.stream({ epoch: "e1" });
    h.stream.start();
    const first = await openCall(h, 1);
    first.body.push(frame(12, "chat"));
    await h.waitEvents(1);
    h.stream.drop();
    assert.ok(first.signal.aborted);
    assert.deepEqual(h.log.states.at(-1), ["reconnecting", "dropped"]);
    assert.equal(h.timers.fire(), 3000);
    const second = await openCall(h, 2);
    assert.equal(second.headers.get("last-event-id"), "12");
    assert.equal(second.headers.get("x-event-epoch"), "e1");
    assert.equal(h.stream.reconnectCount, 1);
    h.stream.close();
  });

  test("pause() stops reading without cancelling; resume() delivers what was held", T, async () => {
    const h = harness();
    h.server.stream();
    h.stream.start();
    const call = await openCall(h, 1);
    h.stream.pause();
    call.body.push(frame(1, "a"));
    call.body.push(frame(2, "b"));
    for (let i = 0; i < 20; i += 1) await new Promise((resolve) => setImmediate(resolve));
    assert.ok(h.log.events.length <= 1, "at most the read already in flight is parsed");
    assert.equal(call.signal.aborted, false);
    h.stream.resume();
    await h.waitEvents(2);
    assert.equal(h.stream.lastEventId, "2");
    h.stream.close();
  });

  test("close() while paused ends the read loop", T, async () => {
    const h = harness();
    h.server.stream();
    h.stream.start();
    const call = await openCall(h, 1);
    h.stream.pause();
    call.body.push(frame(1, "a"));
    await new Promise((resolve) => setImmediate(resolve));
    h.stream.close();
    for (let i = 0; i < 10; i += 1) await new Promise((resolve) => setImmediate(resolve));
    assert.ok(h.log.events.length <= 1, "at most the read already in flight is parsed");
    assert.ok(call.signal.aborted);
    assert.equal(h.stream.state, "stopped");
  });
});

describe("options and helpers", () => {
  test("maxQueued becomes a query parameter (EB-14)", T, async () => {
    const h = harness({ stream: { maxQueued: 16, url: "/session/s1/events?x=1" } });
    h.server.stream();
    h.stream.start();
    const call = await openCall(h, 1);
    assert.equal(call.url, "/session/s1/events?x=1&maxQueued=16");
    h.stream.close();
  });

  test("invalid options throw at construction", T, () => {
    const ok = { url: URL_, getToken: () => "t", fetch: async () => {} };
    assert.throws(() => new SessionEventStream({ ...ok, maxQueued: 15 }), RangeError);
    assert.throws(() => new SessionEventStream({ ...ok, maxQueued: 2049 }), RangeError);
    assert.throws(() => new SessionEventStream({ ...ok, getToken: "t" }), TypeError);
    assert.throws(() => new SessionEventStream({ ...ok, url: undefined }), TypeError);
    assert.throws(() => new SessionEventStream({ ...ok, lastEventId: "1\n2" }), TypeError);
  });

  test("a new stream is idle and start() is idempotent", T, async () => {
    const h = harness();
    assert.equal(h.stream.state, "idle");
    h.server.stream();
    h.stream.start();
    h.stream.start();
    await openCall(h, 1);
    assert.equal(h.server.calls.length, 1);
    assert.deepEqual(STATES, ["idle", "connecting", "open", "reconnecting", "stopped", "ended"]);
    h.stream.close();
  });

  test("fetch and timers are called as plain functions, as the browser's require", T, async () => {
    const thisValues = [];
    function strictFetch() {
      thisValues.push(this);
      return Promise.resolve(new Response(null, { status: 500 }));
    }
    function strictSetTimeout() {
      thisValues.push(this);
      return 1;
    }
    const stream = new SessionEventStream({
      url: URL_, getToken: () => "t", fetch: strictFetch, setTimeout: strictSetTimeout, clearTimeout() {},
    });
    stream.start();
    await until(() => stream.state === "reconnecting", "reconnecting");
    assert.deepEqual(thisValues, [undefined, undefined, undefined], "headers-wait timer, fetch, reconnect timer");
    stream.close();
  });

  test("contentTypeEssence ignores case, parameters and whitespace", T, () => {
    assert.equal(contentTypeEssence(" Text/Event-Stream ; charset=UTF-8"), "text/event-stream");
    assert.equal(contentTypeEssence(null), "");
  });

  test("sse.js re-exports the parser and the backoff formula (the shared spec takes createParser from it)", T, () => {
    assert.equal(sse.createParser, createParser);
    assert.equal(sse.contentTypeEssence, contentTypeEssence);
    assert.equal(sse.computeReconnectDelayMs, computeReconnectDelayMs);
  });
});
