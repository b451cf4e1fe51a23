// qwenweb — the dashboard's plots (static/qwenweb/dashboard.js draws three of them).
//
// A series is an array of samples `[t_ms, value]`, oldest first, one a tick (1 s). Samples
// further apart than `gapMs` have missing data between them (a stalled or stopped server, a
// lost feed): the plot draws a gap there — no line, a shaded band — never a straight line
// across, as Grafana does for null values. The server's sample times decide, so a gap the
// server's history kept is drawn on a page opened after it, too.
//
// The plot reads its values on hover and by keyboard: the plot's frame is a focusable
// `role="slider"` whose value is a sample (Left/Right, Page Up/Down by a minute, Home/End);
// its `aria-valuetext` says the time and the value, or the missing data next to it.
//
// The pure helpers are exported and tested under Node (tests/js/dashboard_plot.test.mjs).

const SVG_NS = "http://www.w3.org/2000/svg";
const WIDTH = 600;
const HEIGHT = 140;

/** Events per second between consecutive points `[t_ms, published, ...]`.
 * Returns `[[t_ms, rate]]`. A drop of `published` (a bus rebuilt or unloaded) counts as 0,
 * never as a negative rate; two points further apart than `gapMs` give no rate (missing
 * data: the published count of the time between is unknown). */
export function ratesOf(points, gapMs = Infinity) {
  const out = [];
  for (let i = 1; i < points.length; i += 1) {
    const [t0, p0] = points[i - 1];
    const [t1, p1] = points[i];
    const dt = t1 - t0;
    if (dt > gapMs) continue;
    out.push([t1, dt > 0 ? (Math.max(0, p1 - p0) * 1000) / dt : 0]);
  }
  return out;
}

/** Keep the points of the last `windowMs` before the last point, and at most `maxPoints`
 * (the newest): a history bounded in time and in memory. */
export function trimHistory(points, windowMs, maxPoints = Infinity) {
  if (points.length === 0) return points;
  const since = points[points.length - 1][0] - windowMs;
  let first = Math.max(0, points.length - maxPoints);
  while (first < points.length && points[first][0] < since) first += 1;
  return first === 0 ? points : points.slice(first);
}

/** A "nice" upper bound for an axis: 1, 2 or 5 times a power of ten, at least `value`. */
export function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) {
    if (value <= step * power) return step * power;
  }
  return 10 * power;
}

/** Split `series` where consecutive samples are more than `gapMs` apart: an array of
 * runs (each a non-empty array of samples). */
export function segmentsOf(series, gapMs) {
  const runs = [];
  let run = [];
  for (const sample of series) {
    if (run.length > 0 && sample[0] - run[run.length - 1][0] > gapMs) {
      runs.push(run);
      run = [];
    }
    run.push(sample);
  }
  if (run.length > 0) runs.push(run);
  return runs;
}

/** The stretches of missing data in `[start, end]`: `[[from_ms, to_ms]]`, between samples
 * more than `gapMs` apart, before the first sample when it starts later than `gapMs`
 * after `start` (only with `leading`), and after the last one when `end` is more than
 * `gapMs` later (the feed stopped). An empty series is one gap over the whole window. */
export function gapsOf(series, gapMs, { start, end, leading = false }) {
  if (series.length === 0) return [[start, end]];
  const gaps = [];
  if (leading && series[0][0] - start > gapMs) gaps.push([start, series[0][0]]);
  for (let i = 1; i < series.length; i += 1) {
    const from = series[i - 1][0];
    const to = series[i][0];
    if (to - from > gapMs && to > start && from < end) gaps.push([Math.max(from, start), Math.min(to, end)]);
  }
  const last = series[series.length - 1][0];
  if (end - last > gapMs) gaps.push([Math.max(last, start), end]);
  return gaps;
}

/** SVG path data for `series` in a `width` x `height` box over `[t1 - windowMs, t1]`, y
 * from 0 (bottom) to `yMax` (top), broken at gaps (one subpath per run; a run of one
 * sample is a dot). Returns `{line, area}` ("" when there is no sample). */
export function plotPaths(series, { width, height, windowMs, yMax, t1, gapMs = Infinity }) {
  if (series.length === 0) return { line: "", area: "" };
  const end = t1 ?? series[series.length - 1][0];
  const start = end - windowMs;
  const x = (t) => (((t - start) / windowMs) * width).toFixed(1);
  const y = (v) => (height - (Math.min(v, yMax) / yMax) * height).toFixed(1);
  const lines = [];
  const areas = [];
  for (const run of segmentsOf(series, gapMs)) {
    const coords = run.map(([t, v]) => `${x(t)},${y(v)}`);
    if (run.length === 1) {
      lines.push(`M${coords[0]}h0.1`);
      continue;
    }
    const line = `M${coords.join("L")}`;
    lines.push(line);
    areas.push(`${line}L${x(run[run.length - 1][0])},${height}L${x(run[0][0])},${height}Z`);
  }
  return { line: lines.join(""), area: areas.join("") };
}

/** Which colour a value takes: "alert" from `alert`, "warn" from `warn`, else "ok". */
export function thresholdLevel(value, { warn, alert }) {
  if (!(value >= warn)) return "ok";
  return value >= alert ? "alert" : "warn";
}

/** The index of the sample nearest to `t` (binary search), -1 for an empty series. */
export function nearestIndex(series, t) {
  if (series.length === 0) return -1;
  let low = 0;
  let high = series.length - 1;
  while (low < high) {
    const mid = (low + high) >> 1;
    if (series[mid][0] < t) low = mid + 1;
    else high = mid;
  }
  if (low > 0 && t - series[low - 1][0] <= series[low][0] - t) return low - 1;
  return low;
}

/** What the plot says at time `t`: `{kind: "value", index, t, value}` for the nearest
 * sample, `{kind: "gap", from, to}` inside missing data (samples more than `gapMs` apart,
 * or past the last sample by more than `gapMs` up to `end`), or null for no sample. */
export function readAt(series, t, gapMs, end = Infinity) {
  const index = nearestIndex(series, t);
  if (index < 0) return null;
  const [ts, value] = series[index];
  const before = t < ts ? series[index - 1] : series[index];
  const after = t < ts ? series[index] : series[index + 1];
  if (before && after && after[0] - before[0] > gapMs && Math.abs(t - ts) > gapMs / 2) {
    return { kind: "gap", from: before[0], to: after[0] };
  }
  if (!after && t - ts > gapMs / 2 && end - ts > gapMs) return { kind: "gap", from: ts, to: end };
  return { kind: "value", index, t: ts, value };
}

/** A time of day, to the second (24 h). */
export function clockTime(ms) {
  return new Date(ms).toLocaleTimeString("en-GB", { hour12: false });
}

/** A duration in words: "45 s", "3 min 5 s", "1 h 2 min". */
export function spanText(ms) {
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min${s % 60 ? ` ${s % 60} s` : ""}`;
  return `${Math.floor(s / 3600)} h${Math.floor((s % 3600) / 60) ? ` ${Math.floor((s % 3600) / 60)} min` : ""}`;
}

/** The words for a reading of `readAt` ("12:03:04 · 12.5 events/s", or the gap). */
export function readingText(reading, format, unit) {
  if (reading === null) return "no data yet";
  if (reading.kind === "gap") {
    return `no data from ${clockTime(reading.from)} to ${clockTime(reading.to)} (${spanText(reading.to - reading.from)})`;
  }
  return `${clockTime(reading.t)} · ${format(reading.value)} ${unit}`;
}

// -- the DOM part ------------------------------------------------------------------------

function svg(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  return node;
}

/** One plot: an SVG in a focusable frame (`role="slider"`), its axis below, a tooltip.
 *
 * Options: frame (the element with the svg inside), kind (a CSS class), unit (words after
 * the value), format(value) → text, thresholds ({warn, alert} or null: lines and a
 * coloured line). `draw({series, windowMs, t1, gapMs})` redraws; the cursor (hover or
 * keyboard) stays on its sample's time across redraws. */
export class Plot {
  constructor({ frame, kind, unit, format, thresholds = null }) {
    this.frame = frame;
    this.svg = frame.querySelector("svg");
    this.kind = kind;
    this.unit = unit;
    this.format = format;
    this.thresholds = thresholds;
    this.tip = frame.querySelector(".plot-tip");
    this.state = { series: [], windowMs: 1, t1: 0, gapMs: Infinity, yMax: 1 };
    this.cursorT = null;
    this.svg.classList.add(`plot-${kind}`);
    frame.addEventListener("pointermove", (event) => this.hover(event));
    frame.addEventListener("pointerleave", () => {
      if (document.activeElement !== frame) this.setCursor(null);
    });
    frame.addEventListener("focus", () => {
      const { series } = this.state;
      if (this.cursorT === null && series.length) this.setCursor(series[series.length - 1][0]);
    });
    frame.addEventListener("blur", () => this.setCursor(null));
    frame.addEventListener("keydown", (event) => this.key(event));
  }

  draw({ series, windowMs, t1, gapMs }) {
    const start = t1 - windowMs;
    const visible = series.filter(([t]) => t >= start && t <= t1);
    let top = Math.max(0, ...visible.map(([, v]) => v));
    if (this.thresholds) top = Math.max(top, this.thresholds.warn * 1.25);
    const yMax = niceMax(top);
    this.state = { series: visible, windowMs, t1, gapMs, yMax };
    const node = this.svg;
    node.replaceChildren();
    for (const fraction of [0, 0.5, 1]) {
      const y = (HEIGHT - fraction * HEIGHT).toFixed(1);
      node.append(svg("line", { class: "grid", x1: 0, x2: WIDTH, y1: y, y2: y }));
    }
    const x = (t) => ((t - start) / windowMs) * WIDTH;
    for (const [from, to] of gapsOf(visible, gapMs, { start, end: t1 })) {
      const gap = svg("rect", {
        class: "gap", x: x(from).toFixed(1), y: 0, width: Math.max(0.5, x(to) - x(from)).toFixed(1), height: HEIGHT,
      });
      gap.dataset.from = String(from);
      gap.dataset.to = String(to);
      node.append(gap);
    }
    const { line, area } = plotPaths(visible, { width: WIDTH, height: HEIGHT, windowMs, yMax, t1, gapMs });
    if (this.thresholds) this.drawThresholds(yMax);
    if (line) {
      node.append(svg("path", { class: "area", d: area }));
      node.append(svg("path", { class: "line", d: line, ...(this.thresholds ? { stroke: `url(#${this.gradientId})` } : {}) }));
    }
    this.drawAxis(windowMs, yMax);
    this.frame.setAttribute("aria-valuemin", "0");
    this.frame.setAttribute("aria-valuemax", String(Math.max(0, visible.length - 1)));
    this.showCursor();
  }

  get gradientId() {
    return `${this.svg.id}-levels`;
  }

  drawThresholds(yMax) {
    const { warn, alert } = this.thresholds;
    const at = (v) => Math.min(1, v / yMax);
    const gradient = svg("linearGradient", {
      id: this.gradientId, gradientUnits: "userSpaceOnUse", x1: 0, y1: HEIGHT, x2: 0, y2: 0,
    });
    const stops = [["ok", 0], ["ok", at(warn)], ["warn", at(warn)], ["warn", at(alert)], ["alert", at(alert)], ["alert", 1]];
    for (const [level, offset] of stops) gradient.append(svg("stop", { class: `stop-${level}`, offset }));
    const defs = svg("defs", {});
    defs.append(gradient);
    this.svg.append(defs);
    for (const [level, value] of [["warn", warn], ["alert", alert]]) {
      if (value > yMax) continue;
      const y = (HEIGHT - (value / yMax) * HEIGHT).toFixed(1);
      this.svg.append(svg("line", { class: `threshold threshold-${level}`, x1: 0, x2: WIDTH, y1: y, y2: y }));
    }
  }

  drawAxis(windowMs, yMax) {
    let axis = this.frame.nextElementSibling;
    if (!axis || !axis.classList.contains("plot-axis")) {
      axis = document.createElement("div");
      axis.className = "plot-axis";
      this.frame.after(axis);
    }
    const span = (text, className = "") => Object.assign(document.createElement("span"), { textContent: text, className });
    const parts = [span(`−${spanText(windowMs)}`), span(`max ${this.format(yMax)}`)];
    if (this.thresholds) {
      parts.push(span(`amber ≥ ${this.thresholds.warn} · red ≥ ${this.thresholds.alert}`, "plot-levels"));
    }
    parts.push(span("now"));
    axis.replaceChildren(...parts);
  }

  hover(event) {
    const box = this.svg.getBoundingClientRect();
    if (box.width <= 0) return;
    const { windowMs, t1 } = this.state;
    const fraction = Math.min(1, Math.max(0, (event.clientX - box.left) / box.width));
    this.setCursor(t1 - windowMs + fraction * windowMs, { exact: true });
  }

  key(event) {
    const { series } = this.state;
    if (series.length === 0) return;
    const current = this.cursorT === null ? series.length - 1 : nearestIndex(series, this.cursorT);
    const moves = { ArrowLeft: -1, ArrowDown: -1, ArrowRight: 1, ArrowUp: 1, PageDown: -60, PageUp: 60, Home: -Infinity, End: Infinity };
    if (!(event.key in moves)) return;
    event.preventDefault();
    const index = Math.min(series.length - 1, Math.max(0, current + moves[event.key]));
    this.setCursor(series[index][0]);
  }

  /** Put the cursor at time `t` (null hides it); `exact`: read at `t` itself (hover can
   * point into a gap), else at the nearest sample. */
  setCursor(t, { exact = false } = {}) {
    this.cursorT = t;
    this.cursorExact = exact;
    this.showCursor();
  }

  showCursor() {
    const { series, windowMs, t1, gapMs, yMax } = this.state;
    this.svg.querySelector(".cursor")?.remove();
    this.svg.querySelector(".cursor-dot")?.remove();
    const reading = this.cursorT === null ? null : readAt(series, this.cursorT, gapMs, t1);
    const summary = series.length ? readingText({ kind: "value", t: series[series.length - 1][0], value: series[series.length - 1][1] }, this.format, this.unit) : "no data yet";
    if (this.cursorT === null || reading === null) {
      this.tip.hidden = true;
      this.frame.setAttribute("aria-valuenow", String(Math.max(0, series.length - 1)));
      this.frame.setAttribute("aria-valuetext", `latest: ${summary}`);
      return;
    }
    const start = t1 - windowMs;
    const tx = reading.kind === "value" && !this.cursorExact ? reading.t : this.cursorT;
    const x = ((tx - start) / windowMs) * WIDTH;
    this.svg.append(svg("line", { class: "cursor", x1: x.toFixed(1), x2: x.toFixed(1), y1: 0, y2: HEIGHT }));
    let text = readingText(reading, this.format, this.unit);
    if (reading.kind === "value") {
      const y = HEIGHT - (Math.min(reading.value, yMax) / yMax) * HEIGHT;
      this.svg.append(svg("line", { class: "cursor-dot", x1: x.toFixed(1), x2: (x + 0.1).toFixed(1), y1: y.toFixed(1), y2: y.toFixed(1) }));
      const next = series[reading.index + 1];
      if (next && next[0] - reading.t > gapMs) text += ` · then no data for ${spanText(next[0] - reading.t)}`;
      if (this.thresholds) {
        const level = thresholdLevel(reading.value, this.thresholds);
        if (level !== "ok") text += ` (${level === "alert" ? "red" : "amber"})`;
      }
      this.frame.setAttribute("aria-valuenow", String(reading.index));
    }
    this.frame.setAttribute("aria-valuetext", text);
    this.tip.textContent = text;
    this.tip.dataset.kind = reading.kind;
    this.tip.hidden = false;
    const frameWidth = this.frame.clientWidth;
    const tipWidth = this.tip.offsetWidth;
    const left = (x / WIDTH) * this.svg.clientWidth - tipWidth / 2;
    this.tip.style.left = `${Math.max(0, Math.min(frameWidth - tipWidth, left))}px`;
  }
}
