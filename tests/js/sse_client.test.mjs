// Tests of SessionEventStream (static/qwenweb/sse.js): the connection wait, frames with meaning
// for the client (SC-12), close, drop and pause (SC-13), its options and helpers. Against a
// fake fetch that returns real Response objects with ReadableStream bodies
// (tests/js/sse_support.mjs); rules SC-n and EB-n are those of docs/protocol.md. No test waits
// on the wall clock: timers are injected and fired by hand.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import * as sse from "../../static/qwenweb/sse.js";
import { STATES, SessionEventStream } from "../../static/qwenweb/sse.js";
import { computeReconnectDelayMs } from "../../static/qwenweb/sse_backoff.js";
import { contentTypeEssence, createParser } from "../../static/qwenweb/sse_parser.js";
import { T, URL_, encoder, fakeServer, fakeTimers, frame, harness, openCall, until } from "./sse_support.mjs";

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

  /** A started stream on a held fetch and fake timers, recording its connection-wait calls. */
  function waitingStream(options = {}) {
    const timers = fakeTimers();
    const held = heldFetch();
    const waits = [];
    const stream = new SessionEventStream({
      url: URL_, getToken: () => "t", fetch: held.fetch, ...options,
      setTimeout: timers.setTimeout, clearTimeout: timers.clearTimeout,
      onConnectionWait: (waiting) => waits.push(waiting),
    });
    stream.start();
    return { timers, held, waits, stream };
  }

  test("after connectWaitMs without headers the client says so, keeps waiting, and clears it on the answer", T, async () => {
    const { timers, held, waits, stream } = waitingStream({ connectWaitMs: 5000 });
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
    const { timers, held, waits, stream } = waitingStream();
    await until(() => held.calls === 1, "fetch issued");
    held.answer();
    await until(() => stream.state === "open", "open");
    assert.deepEqual(timers.pending, [], "the wait timer was cleared");
    assert.deepEqual(waits, []);
    stream.close();
  });

  test("close() while waiting clears the notice", T, async () => {
    const { timers, held, waits, stream } = waitingStream();
    await until(() => held.calls === 1, "fetch issued");
    timers.fire();
    stream.close();
    assert.deepEqual(waits, [true, false]);
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
