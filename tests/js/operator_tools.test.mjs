// The operator tools' pure helpers: static/qwenweb/subscribers.js (the live subscribers
// table) and static/qwenweb/publish_console.js (the publish console, provoke backpressure).
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  MAX_BYTES,
  MAX_EVENTS,
  PROBE_EVENT_BYTES,
  parseData,
  probeBody,
  queuePastWarning,
  stopReason,
  newIdempotencyKey,
} from "../../static/qwenweb/publish_console.js";
import { describeApiError, formatAge, formatBytes, formatRate } from "../../static/qwenweb/subscribers.js";

test("an API error is said in words, never as its machine code", () => {
  const text = describeApiError(404, { error: "no such subscriber (it may have left)", code: "subscriber_not_found" });
  assert.match(text, /no longer connected/);
  assert.doesNotMatch(text, /subscriber_not_found/);
});

test("every code the two tools can meet has its own sentence", () => {
  for (const code of ["forbidden", "csrf_failed", "not_found", "subscriber_not_found", "session_closed",
    "invalid_event", "invalid_json", "body_too_large", "unauthorized", "backend_unavailable", "unavailable"]) {
    assert.doesNotMatch(describeApiError(400, { code }), new RegExp(code), code);
  }
});

test("an unknown code falls back to the server's message, a non-JSON answer to its status", () => {
  assert.equal(describeApiError(418, { code: "teapot", error: "short and stout" }), "The server refused: short and stout.");
  assert.equal(describeApiError(502, null), "The server answered HTTP 502.");
  assert.equal(describeApiError(0, null), "The server could not be reached.");
});

test("sizes, rates and ages read as people say them", () => {
  assert.equal(formatBytes(512), "512 B");
  assert.equal(formatBytes(1536), "1.5 KiB");
  assert.equal(formatRate(2 * 1024 * 1024), "2.0 MiB/s");
  assert.equal(formatAge(100, 142_000), "42 s");
  assert.equal(formatAge(0, 3 * 3600_000 + 5 * 60_000), "3 h 5 min");
  assert.equal(formatAge(undefined, 0), "?");
});

test("the console's data must be JSON; empty means no data", () => {
  assert.deepEqual(parseData(' {"a": [1]} '), { ok: true, value: { a: [1] } });
  assert.deepEqual(parseData("  "), { ok: true, value: undefined });
  const bad = parseData("{a: 1}");
  assert.equal(bad.ok, false);
  assert.match(bad.error, /^The data is not valid JSON: /);
});

test("each probe event's body is exactly 64 KiB of JSON with its number", () => {
  for (const n of [0, 7, 1999]) {
    const body = probeBody(n);
    assert.equal(body.length, PROBE_EVENT_BYTES);
    assert.equal(JSON.parse(body).data.n, n);
  }
});

test("the warning threshold is 75 % of either cap (EB-4)", () => {
  assert.equal(queuePastWarning({ queuedFrames: 12, queuedBytes: 0 }, 16, 2 ** 21), true);
  assert.equal(queuePastWarning({ queuedFrames: 11, queuedBytes: 0 }, 16, 2 ** 21), false);
  assert.equal(queuePastWarning({ queuedFrames: 1, queuedBytes: 1_572_864 }, 256, 2 ** 21), true);
});

test("publishing stops at the eviction, the page's own warning, Stop, or the bounds", () => {
  const run = { stopRequested: false, failure: null, evictedOnServer: false, warnedOnPage: false, published: 0, bytes: 0 };
  assert.equal(stopReason(run), null);
  assert.equal(stopReason({ ...run, evictedOnServer: true }), "evicted");
  assert.equal(stopReason({ ...run, warnedOnPage: true }), "warned");
  assert.equal(stopReason({ ...run, stopRequested: true, evictedOnServer: true }), "stopped");
  assert.equal(stopReason({ ...run, failure: "no token" }), "failed");
  assert.equal(stopReason({ ...run, published: MAX_EVENTS }), "max_events");
  assert.equal(stopReason({ ...run, bytes: MAX_BYTES - PROBE_EVENT_BYTES + 1 }), "max_bytes");
  assert.ok(MAX_EVENTS <= 2000 && MAX_BYTES <= 128 * 1024 * 1024);
});

test("idempotency keys are UUID4s, also without crypto.randomUUID", () => {
  const uuid4 = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
  assert.match(newIdempotencyKey(), uuid4);
  const fallback = newIdempotencyKey({ getRandomValues: (bytes) => bytes.fill(0xff) });
  assert.match(fallback, uuid4);
  assert.notEqual(newIdempotencyKey(), newIdempotencyKey());
});
