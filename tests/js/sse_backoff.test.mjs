// Tests of the reconnection time and its backoff (SC-11): SessionEventStream's delays and
// computeReconnectDelayMs (static/qwenweb/sse_backoff.js). Against a fake fetch and timers fired
// by hand (tests/js/sse_support.mjs); rules are those of docs/protocol.md.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { computeReconnectDelayMs } from "../../static/qwenweb/sse_backoff.js";
import { T, frame, harness, openCall, until } from "./sse_support.mjs";

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
