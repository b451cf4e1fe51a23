// The dashboard's plots (static/qwenweb/dashboard_plot.js): gaps for missing samples,
// readings on hover and by keyboard, thresholds, a bounded history.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  gapsOf,
  nearestIndex,
  plotPaths,
  ratesOf,
  readAt,
  segmentsOf,
  spanText,
  thresholdLevel,
  trimHistory,
} from "../../static/qwenweb/dashboard_plot.js";

const GAP = 5000;
/** One sample a second from `from` to `to` (seconds), value = the second. */
const seconds = (from, to) => Array.from({ length: to - from + 1 }, (_, i) => [(from + i) * 1000, from + i]);
/** A 20 s outage: samples at 0..10 s, then none until 31 s, then 31..40 s. */
const outage = [...seconds(0, 10), ...seconds(31, 40)];

test("samples more than the gap apart split the series into runs", () => {
  const runs = segmentsOf(outage, GAP);
  assert.equal(runs.length, 2);
  assert.deepEqual([runs[0].at(-1)[0], runs[1][0][0]], [10_000, 31_000]);
  assert.equal(segmentsOf(seconds(0, 10), GAP).length, 1);
});

test("a 20 s outage is a gap from the last sample before it to the first after it", () => {
  assert.deepEqual(gapsOf(outage, GAP, { start: 0, end: 40_000 }), [[10_000, 31_000]]);
});

test("a late tick within the gap bound is no gap", () => {
  const late = [[0, 1], [1000, 1], [5000, 1], [6000, 1]];
  assert.deepEqual(gapsOf(late, GAP, { start: 0, end: 6000 }), []);
});

test("a feed that stopped is a gap from its last sample up to now", () => {
  assert.deepEqual(gapsOf(seconds(0, 10), GAP, { start: 0, end: 30_000 }), [[10_000, 30_000]]);
  assert.deepEqual(gapsOf([], GAP, { start: 0, end: 30_000 }), [[0, 30_000]]);
});

test("a gap is clipped to the window shown", () => {
  assert.deepEqual(gapsOf(outage, GAP, { start: 20_000, end: 40_000 }), [[20_000, 31_000]]);
});

test("the line breaks at a gap: one subpath per run, never a line across", () => {
  const { line, area } = plotPaths(outage, { width: 40, height: 40, windowMs: 40_000, yMax: 40, t1: 40_000, gapMs: GAP });
  assert.equal(line.match(/M/g).length, 2);
  assert.ok(line.includes("10.0,30.0M31.0,9.0"), line); // 10 s at y 30 ends, 31 s at y 9 starts
  assert.equal(area.match(/Z/g).length, 2);
});

test("no rate is computed across a gap", () => {
  const points = [[0, 0], [1000, 10], [21_000, 500], [22_000, 510]];
  assert.deepEqual(ratesOf(points, GAP), [[1000, 10], [22_000, 10]]);
});

test("the nearest sample is found on either side", () => {
  const series = seconds(0, 10);
  assert.deepEqual([-5, 0, 1400, 1600, 99_000].map((t) => nearestIndex(series, t)), [0, 0, 1, 2, 10]);
  assert.equal(nearestIndex([], 1), -1);
});

test("hovering a sample reads its time and value", () => {
  assert.deepEqual(readAt(outage, 3200, GAP), { kind: "value", index: 3, t: 3000, value: 3 });
});

test("hovering inside an outage reads the missing data, not a value", () => {
  assert.deepEqual(readAt(outage, 20_000, GAP), { kind: "gap", from: 10_000, to: 31_000 });
  assert.equal(readAt(outage, 10_400, GAP).kind, "value"); // next to a sample: the sample
});

test("hovering past the last sample of a stopped feed reads the missing data up to now", () => {
  assert.deepEqual(readAt(seconds(0, 10), 25_000, GAP, 30_000), { kind: "gap", from: 10_000, to: 30_000 });
  assert.equal(readAt([], 1, GAP), null);
});

test("thresholds colour a value ok, warn or alert", () => {
  const levels = { warn: 64, alert: 192 };
  assert.deepEqual([0, 63, 64, 191, 192, 5000].map((v) => thresholdLevel(v, levels)), ["ok", "ok", "warn", "warn", "alert", "alert"]);
});

test("an hour of history stays bounded by time and by count", () => {
  const hour = 3_600_000;
  const points = Array.from({ length: 8000 }, (_, i) => [i * 1000, i]);
  const kept = trimHistory(points, hour, 7200);
  assert.equal(kept.length, 3601);
  assert.deepEqual(kept[0], [4_399_000, 4399]);
  const dense = Array.from({ length: 9000 }, (_, i) => [i, i]); // samples 1 ms apart
  assert.equal(trimHistory(dense, hour, 7200).length, 7200);
});

test("durations read as words", () => {
  assert.deepEqual([20_000, 185_000, 3_720_000, 3_600_000].map(spanText), ["20 s", "3 min 5 s", "1 h 2 min", "1 h"]);
});
