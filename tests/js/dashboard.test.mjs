// The operator dashboard's pure helpers (static/qwenweb/dashboard.js): rates, plot paths, totals.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  formatRate,
  niceMax,
  plotPaths,
  ratesOf,
  totalsOf,
  trimHistory,
} from "../../static/qwenweb/dashboard.js";

test("rates are events per second between consecutive points", () => {
  const points = [[0, 0, 1], [1000, 10, 1], [3000, 50, 2]];
  assert.deepEqual(ratesOf(points), [[1000, 10], [3000, 20]]);
});

test("a drop of the published counter is a rate of zero, never negative", () => {
  assert.deepEqual(ratesOf([[0, 100, 0], [1000, 5, 0]]), [[1000, 0]]);
});

test("two points at the same time give a rate of zero", () => {
  assert.deepEqual(ratesOf([[5, 1, 0], [5, 9, 0]]), [[5, 0]]);
});

test("history keeps only the window before the last point", () => {
  const points = [[0], [1000], [2000], [3000]];
  assert.deepEqual(trimHistory(points, 1500), [[2000], [3000]]);
  assert.deepEqual(trimHistory([], 1500), []);
});

test("axis maximum is 1, 2 or 5 times a power of ten", () => {
  assert.deepEqual([0, 0.3, 1, 3, 7, 12, 250, 999].map(niceMax), [1, 0.5, 1, 5, 10, 20, 500, 1000]);
});

test("plot paths span the window, bottom at zero and top at the maximum", () => {
  const { line, area } = plotPaths([[0, 0], [500, 5], [1000, 10]], {
    width: 100, height: 10, windowMs: 1000, yMax: 10,
  });
  assert.equal(line, "M0.0,10.0L50.0,5.0L100.0,0.0");
  assert.equal(area, `${line}L100.0,10L0.0,10Z`);
});

test("no sample draws nothing, a single sample is a dot", () => {
  assert.deepEqual(plotPaths([], { width: 1, height: 1, windowMs: 1, yMax: 1 }), { line: "", area: "" });
  assert.deepEqual(plotPaths([[1, 1]], { width: 10, height: 10, windowMs: 1, yMax: 1 }), { line: "M10.0,0.0h0.1", area: "" });
});

test("a tick's history point sums published and subscribers and keeps the worst lag", () => {
  const message = { t: 5, sessions: [
    { published: 3, subscribers: 1, maxLag: 7 },
    { published: 4, subscribers: 2, maxLag: 2 },
    { published: 1, subscribers: 0 },
  ] };
  assert.deepEqual(totalsOf(message), [5, 8, 3, 7]);
});

test("rates show one decimal below ten", () => {
  assert.deepEqual([0, 2.25, 12.6, 1234.4].map(formatRate), ["0.0", "2.3", "13", "1,234"]);
});
