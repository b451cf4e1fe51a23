// Tests of static/qwenweb/ws.js and ws_socket.js: the WebSocket client of issue 27 (one socket,
// many subscriptions, batched resubscribe, the SSE backoff, refresh, pings, terminal frames).
// A fake WebSocket plays the server (tests/js/ws_support.mjs); timers are fired by hand.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { SharedStream } from "../../static/qwenweb/shared_stream.js";
import { computeReconnectDelayMs } from "../../static/qwenweb/sse_backoff.js";
import { socketUrl, SUBPROTOCOL, WsSessionStream } from "../../static/qwenweb/ws.js";
import { T, acceptAndSubscribe, envelope, harness, openStream, refuseFirstSubscribe, settle, until } from "./ws_support.mjs";

const backoff = (failures, retryMs = 3000) =>
  computeReconnectDelayMs({ retryMs, failures, capMs: 30000, floorMs: 1000, random: () => 0.5 });

describe("subscribe and frames", () => {
  test("socketUrl maps http(s) to ws(s) against the page", T, () => {
    assert.equal(socketUrl("/ws", "https://example.org/sessions/x/"), "wss://example.org/ws");
    assert.equal(socketUrl("/ws", "http://127.0.0.1:8000/"), "ws://127.0.0.1:8000/ws");
  });

  test("subscribe carries token, numeric cursor, epoch and maxQueued; ok opens with the reply's epoch", T, async () => {
    const h = harness();
    const a = h.make("s1", { stream: { lastEventId: "42", epoch: "E0", maxQueued: 64 } });
    a.stream.start();
    const ws = h.net.last();
    assert.equal(ws.url, "ws://127.0.0.1:8000/ws");
    assert.deepEqual(ws.protocols, [SUBPROTOCOL]);
    await acceptAndSubscribe(h, 1, "E1");
    const [sub] = ws.ops("subscribe");
    assert.deepEqual({ ...sub, ref: 0 }, { op: "subscribe", ref: 0, session: "s1", token: "s1-t1", lastEventId: 42, epoch: "E0", maxQueued: 64 });
    assert.equal(a.lastState(), "open");
    assert.equal(a.stream.epoch, "E0", "the epoch moves with the first id, as over SSE");
    ws.frame("s1", envelope(43, "note", { text: "hi" }));
    assert.equal(a.stream.epoch, "E1");
    assert.equal(a.stream.lastEventId, "43");
  });

  test("frames become the SSE client's events; synthetic frames never move the cursor", T, async () => {
    const { a, ws } = await openStream();
    ws.frame("s1", envelope(7, "note", { text: "é" }));
    ws.frame("s1", envelope(null, "slow_client_warning", { queueSize: 12 }));
    ws.frame("s2", envelope(8, "note")); // another session's frame: not this stream's
    assert.deepEqual(a.log.events[0], {
      type: "note",
      data: '{"id":7,"v":1,"type":"note","data":{"text":"é"}}',
      json: envelope(7, "note", { text: "é" }),
      lastEventId: "7",
      id: "7",
    });
    assert.equal(a.log.events[1].id, null);
    assert.equal(a.log.events[1].lastEventId, "7");
    assert.equal(a.log.events.length, 2);
  });

  test("state_resync_required reaches onResyncRequired and the subscription carries on", T, async () => {
    const { a, ws } = await openStream({ stream: { lastEventId: "2" } });
    ws.frame("s1", envelope(null, "state_resync_required", { reason: "ring_evicted" }));
    ws.frame("s1", envelope(5, "note"));
    assert.equal(a.log.resyncs.length, 1);
    assert.equal(a.lastState(), "open");
    assert.equal(a.stream.lastEventId, "5");
  });
});

describe("one socket, one batched resubscribe", () => {
  test("three sessions share one socket; after a cut they resubscribe in one burst with cursors and epochs", T, async () => {
    const h = harness();
    const streams = ["s1", "s2", "s3"].map((id) => h.make(id));
    for (const { stream } of streams) stream.start();
    const ws1 = await acceptAndSubscribe(h, 3, "E1");
    assert.equal(h.net.sockets.length, 1);
    ws1.frame("s1", envelope(10, "note"));
    ws1.frame("s3", envelope(30, "note"));
    ws1.cut(1006);
    assert.deepEqual(streams.map((s) => s.lastState()), ["reconnecting", "reconnecting", "reconnecting"]);
    assert.equal(h.timers.fire(3000), 3000, "exactly the reconnection time after a socket that had opened");
    const ws2 = h.net.last();
    ws2.accept();
    await until(() => ws2.sent.length === 3, "the batch");
    assert.deepEqual(
      ws2.ops("subscribe").map(({ session, lastEventId, epoch }) => ({ session, lastEventId, epoch })),
      [
        { session: "s1", lastEventId: 10, epoch: "E1" },
        { session: "s2", lastEventId: undefined, epoch: undefined },
        { session: "s3", lastEventId: 30, epoch: "E1" },
      ],
    );
  });

  test("the batch waits for every token and is sent in one turn, none before", T, async () => {
    const h = harness();
    let release;
    const slow = new Promise((resolve) => (release = resolve));
    const a = h.make("s1");
    const b = h.make("s2", { getToken: () => slow });
    a.stream.start();
    b.stream.start();
    const ws = h.net.last();
    ws.accept();
    await settle();
    assert.equal(ws.sent.length, 0, "nothing sent while a token is pending");
    release("slow-token");
    await until(() => ws.sent.length > 0, "the batch");
    assert.equal(ws.sent.length, 2, "both in the same turn");
  });

  test("a stream started on an open socket subscribes at once, alone", T, async () => {
    const h = harness();
    h.make("s1").stream.start();
    const ws = await acceptAndSubscribe(h, 1);
    const b = h.make("s2");
    b.stream.start();
    await acceptAndSubscribe(h, 1, "E1", 2);
    assert.equal(ws.ops("subscribe").length, 2);
    assert.equal(b.lastState(), "open");
  });
});

describe("reconnect with the SSE backoff (SC-11)", () => {
  test("handshakes that fail back off exponentially; an open resets to the reconnection time", T, async () => {
    const h = harness();
    const a = h.make("s1");
    a.stream.start();
    h.net.last().cut(1006);
    assert.equal(h.timers.fire(backoff(1)), backoff(1));
    h.net.last().cut(1006);
    assert.equal(h.timers.fire(backoff(2)), backoff(2));
    const ws = await acceptAndSubscribe(h, 1);
    ws.cut(1001, "server_shutdown");
    assert.deepEqual(a.log.delays, [backoff(1), backoff(2), 3000]);
    assert.equal(a.stream.reconnectCount, 0, "one subscribe sent so far");
  });

  test("a 4429 close (the user's sockets at their limit) backs off as a socket that never opened", T, async () => {
    const { a, ws } = await openStream();
    ws.cut(4429, "socket_limit_exceeded");
    assert.deepEqual(a.log.delays, [backoff(1)]);
  });

  test("drop() cuts the socket and every subscription resumes after the reconnection time", T, async () => {
    const h = harness();
    const a = h.make("s1");
    const b = h.make("s2");
    a.stream.start();
    b.stream.start();
    const ws = await acceptAndSubscribe(h, 2);
    a.stream.drop();
    assert.equal(ws.closedBy.code, 4000);
    assert.deepEqual([a.lastState(), b.lastState()], ["reconnecting", "reconnecting"]);
    h.timers.fire(3000);
    await acceptAndSubscribe(h, 2);
    assert.deepEqual([a.lastState(), b.lastState()], ["open", "open"]);
  });

  test("no message after a ping within the pong timeout: the socket is closed and reconnected", T, async () => {
    const { h, a, ws } = await openStream();
    h.timers.fire(15000);
    const [ping] = ws.ops("ping");
    ws.push({ op: "pong", ref: ping.ref });
    assert.deepEqual(a.log.comments, ["heartbeat"]);
    h.timers.fire(10000); // heard: the next ping is scheduled
    h.timers.fire(15000);
    h.timers.fire(10000); // silence
    assert.equal(ws.closedBy.reason, "ping_timeout");
    assert.deepEqual(a.log.states.at(-1), ["reconnecting", "ping_timeout"]);
  });

  test("the server's ping is a heartbeat (onComment)", T, async () => {
    const { a, ws } = await openStream();
    ws.push({ op: "ping" });
    assert.deepEqual(a.log.comments, ["heartbeat"]);
  });

  test("a drain: the frame's retryAfterMs, then 1012: the socket comes back after it", T, async () => {
    const { h, ws } = await openStream();
    ws.frame("s1", envelope(1, "note"));
    ws.frame("s1", envelope(null, "stream_error", { code: "server_draining", retryAfterMs: 2140 }));
    ws.cut(1012, "server_draining");
    assert.deepEqual(h.timers.pending, [2140]);
    h.timers.fire(2140);
    const ws2 = await acceptAndSubscribe(h, 1);
    assert.equal(ws2.ops("subscribe")[0].lastEventId, 1);
  });
});

describe("replies and terminal frames", () => {
  test("unauthorized: one fresh token at once, never the rejected one; a second stops", T, async () => {
    const h = harness();
    const a = h.make("s1");
    a.stream.start();
    const ws = await refuseFirstSubscribe(h, { code: "unauthorized", error: "bad token" });
    await until(() => ws.ops("subscribe").length === 2, "second subscribe");
    assert.deepEqual(a.log.tokenReasons, ["reconnect", "unauthorized"]);
    assert.equal(ws.ops("subscribe")[1].token, "s1-t2");
    ws.reply(ws.ops("subscribe")[1], { ok: false, error: { code: "token_revoked", error: "revoked" } });
    assert.deepEqual(a.log.states.at(-1), ["stopped", "unauthorized"]);
  });

  test("session_closed ends the stream and its own socket; not_found stops it", T, async () => {
    const h = harness({ shared: false });
    const a = h.make("s1");
    a.stream.start();
    const ws = await refuseFirstSubscribe(h, { code: "session_closed", error: "closed" });
    assert.deepEqual(a.log.states.at(-1), ["ended", "session_ended"]);
    assert.equal(ws.closedBy.code, 1000);
    const b = h.make("s2");
    b.stream.start();
    const ws2 = await refuseFirstSubscribe(h, { code: "not_found", error: "unknown session" });
    assert.deepEqual(b.log.states.at(-1), ["stopped", "not_found"]);
  });

  test("subscriber_limit_exceeded: again on the same socket after its retryAfterMs", T, async () => {
    const h = harness();
    const a = h.make("s1");
    a.stream.start();
    const ws = await refuseFirstSubscribe(h, { code: "subscriber_limit_exceeded", retryAfterMs: 5000 });
    assert.equal(a.lastState(), "reconnecting");
    h.timers.fire(backoff(1, 5000));
    await acceptAndSubscribe(h, 1, "E1", 2);
    assert.equal(h.net.sockets.length, 1);
    assert.equal(a.lastState(), "open");
  });

  test("client_evicted ends the subscription: later frames are ignored, it resubscribes with its cursor", T, async () => {
    const { h, a, ws } = await openStream();
    ws.frame("s1", envelope(4, "note"));
    ws.frame("s1", envelope(null, "client_evicted", { reason: "queue_overflow" }));
    ws.frame("s1", envelope(5, "note")); // cannot happen; would be a duplicate of the replay
    assert.equal(a.log.events.length, 2);
    assert.deepEqual(a.log.states.at(-1), ["reconnecting", "client_evicted"]);
    h.timers.fire(3000);
    await until(() => ws.ops("subscribe").length === 2, "resubscribe");
    assert.deepEqual(
      (({ lastEventId, epoch }) => ({ lastEventId, epoch }))(ws.ops("subscribe")[1]),
      { lastEventId: 4, epoch: "E1" },
    );
  });

  test("stream_error token_expired: the resubscribe asks a fresh token and never resends the old", T, async () => {
    const { h, a, ws } = await openStream();
    ws.frame("s1", envelope(null, "stream_error", { code: "token_expired" }));
    h.timers.fire(3000);
    await until(() => ws.ops("subscribe").length === 2, "resubscribe");
    assert.deepEqual(a.log.tokenReasons, ["reconnect", "unauthorized"]);
    assert.notEqual(ws.ops("subscribe")[1].token, ws.ops("subscribe")[0].token);
  });

  test("session_closed (the real event) ends the stream", T, async () => {
    const { a, ws } = await openStream();
    ws.frame("s1", envelope(9, "session_closed", { reason: "closed" }));
    assert.deepEqual(a.log.states.at(-1), ["ended", "session_ended"]);
    assert.equal(a.log.events.at(-1).id, "9");
  });
});

describe("refresh, pause, close", () => {
  test("refreshAfterMs sends a refresh op with a new token; the subscription carries on", T, async () => {
    const { h, a, ws } = await openStream({ stream: { refreshAfterMs: () => 60000 } });
    h.timers.fire(60000);
    await until(() => ws.ops("refresh").length === 1, "refresh");
    const [refresh] = ws.ops("refresh");
    assert.deepEqual({ session: refresh.session, token: refresh.token }, { session: "s1", token: "s1-t2" });
    assert.deepEqual(a.log.tokenReasons, ["reconnect", "refresh"]);
    ws.reply(refresh, { ok: true });
    assert.ok(h.timers.pending.includes(60000), "the next refresh is scheduled");
    assert.equal(a.lastState(), "open");
  });

  test("pause holds frames, resume delivers them in order", T, async () => {
    const { a, ws } = await openStream();
    a.stream.pause();
    ws.frame("s1", envelope(1, "note"));
    ws.frame("s1", envelope(2, "note"));
    assert.equal(a.log.events.length, 0);
    a.stream.resume();
    assert.deepEqual(a.log.events.map((e) => e.id), ["1", "2"]);
  });

  test("too much held while paused: unsubscribe, then resume resubscribes from the last delivered id", T, async () => {
    const { a, ws } = await openStream({ stream: { maxHeldFrames: 2 } });
    ws.frame("s1", envelope(1, "note"));
    a.stream.pause();
    for (const id of [2, 3, 4]) ws.frame("s1", envelope(id, "note"));
    assert.equal(ws.ops("unsubscribe").length, 1);
    a.stream.resume();
    await until(() => ws.ops("subscribe").length === 2, "resubscribe");
    assert.equal(ws.ops("subscribe")[1].lastEventId, 1);
  });

  test("close() unsubscribes and closes its own socket with 1000; nothing reconnects", T, async () => {
    const { h, a, ws } = await openStream({ shared: false });
    a.stream.close();
    assert.equal(ws.ops("unsubscribe").length, 1);
    assert.equal(ws.closedBy.code, 1000);
    assert.deepEqual(h.timers.pending, []);
    assert.equal(a.lastState(), "stopped");
  });
});

describe("in the page's SharedStream", () => {
  test("SharedStream runs a WsSessionStream as its StreamClass", T, async () => {
    const h = harness({ shared: false });
    const events = [];
    const shared = new SharedStream({
      key: "s1",
      own: true,
      StreamClass: WsSessionStream,
      streamOptions: {
        session: "s1",
        url: "/ws",
        WebSocket: h.net.WebSocket,
        getToken: async () => "tok",
        setTimeout: h.timers.setTimeout,
        clearTimeout: h.timers.clearTimeout,
      },
      onEvent: (frame) => events.push(frame.id),
    });
    shared.start({ lastEventId: "3", epoch: "E1" });
    const ws = await acceptAndSubscribe(h, 1);
    assert.equal(ws.ops("subscribe")[0].lastEventId, 3);
    ws.frame("s1", envelope(4, "note"));
    assert.deepEqual(events, ["4"]);
    assert.equal(shared.lastEventId, "4");
    assert.equal(shared.state, "open");
  });
});
