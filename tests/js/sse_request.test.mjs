// Tests of what SessionEventStream (static/qwenweb/sse.js) sends and how it reads an answer
// (static/qwenweb/sse_request.js): request headers and the cursor's epoch (SC-9, EB-17), the
// response checks (SC-10), a 401 (one fresh token). Against a fake fetch (tests/js/sse_support.mjs);
// rules are those of docs/protocol.md. No test waits on the wall clock.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { SessionEventStream } from "../../static/qwenweb/sse.js";
import { T, URL_, fakeServer, frame, harness, openCall, until } from "./sse_support.mjs";

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
