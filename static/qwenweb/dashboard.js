// qwenweb — the operator dashboard (templates/dashboard.html; server side:
// sessions/ops/dashboard.py and sessions/ops/feed.py).
//
// Reads the staff-only operator channel with the browser's EventSource (django-eventstream,
// same origin, the login cookie): `stats` events carry every loaded session's counters
// (`tick: true` once a second, `tick: false` right after activity), `activity` events carry
// what happened (subscriber joined/left, slow_client_warning, client_evicted, session
// opened/closed). The page updates its rows, tiles and plots in place; it never reloads.
// EventSource reconnects by itself; missed activity is gone, the next `stats` repairs counts.
// The dashboard tabs of one browser share one feed connection (./shared_feed.js
// SharedFeed: one tab holds the EventSource and posts its events to the others), and a feed
// without an answer after 5 s shows that the browser waits for a free connection.
//
// A session's detail panel ("subscribers" in its row) shows its live subscribers in every
// server process with a Disconnect button each (./subscribers.js): it polls
// `GET /session/<id>/subscribers` every 2 s while it is open and the page is visible.
//
// The pure helpers are exported (and tested under Node: tests/js/dashboard.test.mjs); the
// DOM part runs only in a browser.

import { ConnectionWaitNotice } from "./connection_wait.js";
import { SharedFeed } from "./shared_feed.js";
import { SubscribersTable } from "./subscribers.js";

const SVG_NS = "http://www.w3.org/2000/svg";
const MAX_ACTIVITY = 60;
const SPARK_WINDOW_MS = 120_000;
const STALE_AFTER_MS = 3500;

/** Events per second between consecutive points `[t_ms, published, subscribers]`.
 * Returns `[[t_ms, rate]]` (one fewer than points). A drop of `published` (a bus rebuilt or
 * unloaded) counts as 0, never as a negative rate. */
export function ratesOf(points) {
  const out = [];
  for (let i = 1; i < points.length; i += 1) {
    const [t0, p0] = points[i - 1];
    const [t1, p1] = points[i];
    const dt = (t1 - t0) / 1000;
    out.push([t1, dt > 0 ? Math.max(0, p1 - p0) / dt : 0]);
  }
  return out;
}

/** Keep the points of the last `windowMs` before the last point (array of `[t_ms, ...]`). */
export function trimHistory(points, windowMs) {
  if (points.length === 0) return points;
  const since = points[points.length - 1][0] - windowMs;
  let first = 0;
  while (first < points.length && points[first][0] < since) first += 1;
  return points.slice(first);
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

/** SVG path data for `series` (`[[t, y]]`) in a `width` x `height` box over the time
 * window `[t1 - windowMs, t1]`, y from 0 (bottom) to `yMax` (top). Returns
 * `{line, area}` ("" when there are fewer than two points). */
export function plotPaths(series, { width, height, windowMs, yMax, t1 }) {
  if (series.length < 2) return { line: "", area: "" };
  const end = t1 ?? series[series.length - 1][0];
  const start = end - windowMs;
  const x = (t) => (((t - start) / windowMs) * width).toFixed(1);
  const y = (v) => (height - (Math.min(v, yMax) / yMax) * height).toFixed(1);
  const coords = series.map(([t, v]) => `${x(t)},${y(v)}`);
  const line = `M${coords.join("L")}`;
  const area = `${line}L${x(series[series.length - 1][0])},${height}L${x(series[0][0])},${height}Z`;
  return { line, area };
}

/** Format a count with thin grouping (12 345). */
export function formatCount(value) {
  if (value === null || value === undefined) return "–";
  return Number(value).toLocaleString("en-US").replace(/,/g, "\u2009");
}

/** Format a rate: one decimal below 10, none above. */
export function formatRate(value) {
  if (!Number.isFinite(value)) return "–";
  return value < 10 ? value.toFixed(1) : Math.round(value).toLocaleString("en-US");
}

// -- the page --------------------------------------------------------------------------

function svg(tag, attrs) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  return node;
}

function drawPlot(element, series, { windowMs, t1, kind }) {
  const width = 600;
  const height = 140;
  const max = niceMax(Math.max(0, ...series.map(([, v]) => v)));
  element.replaceChildren();
  element.classList.add(`plot-${kind}`);
  for (const fraction of [0, 0.5, 1]) {
    const yLine = (height - fraction * height).toFixed(1);
    element.append(svg("line", { class: "grid", x1: 0, x2: width, y1: yLine, y2: yLine }));
  }
  const { line, area } = plotPaths(series, { width, height, windowMs, yMax: max, t1 });
  if (line) {
    element.append(svg("path", { class: "area", d: area }));
    element.append(svg("path", { class: "line", d: line }));
  }
  let axis = element.nextElementSibling;
  if (!axis || !axis.classList.contains("plot-axis")) {
    axis = document.createElement("div");
    axis.className = "plot-axis";
    element.after(axis);
  }
  axis.replaceChildren(
    Object.assign(document.createElement("span"), { textContent: `−${Math.round(windowMs / 60000)} min` }),
    Object.assign(document.createElement("span"), { textContent: `max ${formatCount(max)}` }),
    Object.assign(document.createElement("span"), { textContent: "now" }),
  );
}

function drawSpark(element, series, windowMs, t1) {
  const max = niceMax(Math.max(0, ...series.map(([, v]) => v)));
  const { line } = plotPaths(series, { width: 120, height: 24, windowMs, yMax: max, t1 });
  element.replaceChildren();
  if (line) element.append(svg("path", { class: "line", d: line }));
}

function shortId(id) {
  return id ? String(id).slice(0, 8) : "";
}

function timeOf(ms) {
  return new Date(ms).toLocaleTimeString("en-GB", { hour12: false });
}

class Dashboard {
  constructor(config) {
    this.config = config;
    this.windowMs = config.historyS * 1000;
    this.tbody = document.querySelector("#sessions tbody");
    this.rows = new Map();
    this.history = trimHistory(config.history || [], this.windowMs);
    this.sessionHistory = new Map(Object.entries(config.sessionHistory || {}));
    this.live = new Map();
    this.totals = { warnings: 0, evictions: 0 };
    this.statsSeen = 0;
    for (const row of document.querySelectorAll("#sessions tbody tr[data-session-id]")) {
      this.rows.set(row.dataset.sessionId, row);
    }
    for (const session of config.sessions || []) {
      if (session.live) this.live.set(session.id, session);
    }
    for (const item of config.activity || []) this.addActivity(item);
    this.refreshAll(Date.now());
    this.detail = null;
    this.tbody.addEventListener("click", (event) => {
      const button = event.target.closest(".detail-open");
      const row = button?.closest("tr[data-session-id]");
      if (row) this.openDetail(row.dataset.sessionId);
    });
    document.getElementById("detail-close").addEventListener("click", () => this.closeDetail());
  }

  /** Show the live subscribers of `sessionId` (one session at a time). */
  openDetail(sessionId) {
    this.closeDetail();
    const { urls, placeholder, subscriberPlaceholder } = this.config;
    const panel = document.getElementById("session-detail");
    const row = this.rows.get(sessionId);
    const link = document.getElementById("detail-page");
    link.textContent = row?.querySelector(".session-title")?.textContent || "(untitled)";
    link.href = urls.sessionPage.replace(placeholder, sessionId);
    document.getElementById("detail-id").textContent = sessionId;
    panel.dataset.sessionId = sessionId;
    for (const other of this.rows.values()) other.classList.toggle("selected", other === row);
    this.detail = new SubscribersTable({
      root: document.getElementById("detail-subscribers"),
      listUrl: urls.subscribers.replace(placeholder, sessionId),
      disconnectUrl: (id) =>
        urls.disconnect.replace(placeholder, sessionId).replace(subscriberPlaceholder, encodeURIComponent(id)),
    });
    panel.hidden = false;
    this.detail.start();
    panel.scrollIntoView({ block: "nearest" });
  }

  closeDetail() {
    if (this.detail !== null) this.detail.stop();
    this.detail = null;
    document.getElementById("session-detail").hidden = true;
    for (const row of this.rows.values()) row.classList.remove("selected");
  }

  connect() {
    const state = document.getElementById("feed-state");
    const show = (value, text) => {
      state.dataset.state = value;
      state.textContent = text;
    };
    const notice = new ConnectionWaitNotice(document.querySelector(".dash-head"), { id: "feed-wait" });
    const feed = new SharedFeed({
      key: this.config.feedUrl,
      open: () => new EventSource(this.config.feedUrl),
      events: ["stream-open", "stream-error", "stats", "activity"],
      closeOn: ["stream-error"],
      replayLatest: ["stats"],
      onOpen: () => show("live", "live"),
      onError: () => {
        show("reconnecting", "reconnecting…");
        this.setStale(true);
      },
      onConnectionWait: (waiting) => notice.set("feed", waiting),
      onRoleChange: (role) => {
        state.dataset.role = role;
        state.title = role === "follower" ? "shared: another dashboard tab holds the feed" : "";
      },
      onMessage: (type, data) => {
        if (type === "stream-open") show("live", "live");
        else if (type === "stream-error") {
          show("reconnecting", "the server refused the feed: reload the page (log in as staff)");
          console.warn("operator feed refused", data);
          this.setStale(true);
        } else if (type === "stats") this.onStats(JSON.parse(data));
        else if (type === "activity") for (const item of JSON.parse(data).items) this.onActivity(item);
      },
    });
    window.addEventListener("pagehide", () => feed.close());
    // Stats come every second: none for STALE_AFTER_MS means the numbers are old, even
    // when the connection has not reported an error yet (a stalled server or network).
    this.lastStatsAt = Date.now();
    setInterval(() => {
      if (Date.now() - this.lastStatsAt > STALE_AFTER_MS) this.setStale(true);
    }, 1000);
    this.feed = feed.start();
  }

  /** Grey out every number and say what time they are from while the feed is down. */
  setStale(stale) {
    const root = document.querySelector(".dash");
    const note = document.getElementById("stale-note");
    if (root === null || note === null) return;
    root.classList.toggle("stale", stale);
    note.hidden = !stale;
    if (stale) {
      // Before the first `stats`, the numbers are the ones the page was rendered with.
      note.textContent = `values as of ${timeOf(this.lastStatsAt)}`;
    }
  }

  onStats(message) {
    this.lastStatsAt = Date.now();
    this.setStale(false);
    this.statsSeen += 1;
    document.body.dataset.statsSeen = String(this.statsSeen);
    const seen = new Set();
    for (const session of message.sessions) {
      seen.add(session.id);
      this.live.set(session.id, session);
    }
    for (const id of [...this.live.keys()]) {
      if (!seen.has(id)) this.live.delete(id); // unloaded (closed): no subscriber here any more
    }
    if (message.tick) {
      let published = 0;
      let subscribers = 0;
      for (const session of message.sessions) {
        published += session.published;
        subscribers += session.subscribers;
        const points = this.sessionHistory.get(session.id) || [];
        points.push([message.t, session.published, session.subscribers]);
        this.sessionHistory.set(session.id, trimHistory(points, this.windowMs));
      }
      this.history.push([message.t, published, subscribers]);
      this.history = trimHistory(this.history, this.windowMs);
    }
    this.refreshAll(message.t);
  }

  onActivity(item) {
    this.addActivity(item);
    const row = this.rows.get(item.session);
    if (item.kind === "session_opened" && !row) {
      this.ensureRow({ id: item.session, title: item.title, status: item.status || "open" });
    }
    if (item.kind === "session_closed" && row) this.setStatus(row, "closed");
    if (row && (item.kind === "client_evicted" || item.kind === "slow_client_warning")) {
      const cell = row.querySelector(`[data-field="${item.kind === "client_evicted" ? "evictions" : "warnings"}"]`);
      cell.classList.remove("flash");
      void cell.offsetWidth; // restart the animation
      cell.classList.add("flash");
    }
  }

  ensureRow(session) {
    let row = this.rows.get(session.id);
    if (row) return row;
    this.tbody.querySelector(".empty-row")?.remove();
    const template = this.config.placeholder;
    const page = this.config.urls.sessionPage.replace(template, session.id);
    const admin = this.config.urls.sessionAdmin.replace(template, session.id);
    row = document.createElement("tr");
    row.dataset.sessionId = session.id;
    row.dataset.live = "false";
    row.innerHTML = `
      <td class="session-cell"><a class="session-title"></a><span class="mono muted session-id"></span></td>
      <td><span class="pill" data-field="status"></span></td>
      <td class="num mono" data-field="subscribers">0</td>
      <td class="spark-cell"><svg class="spark" data-field="spark" viewBox="0 0 120 24" preserveAspectRatio="none" aria-hidden="true"></svg><span class="mono spark-rate" data-field="rate">–</span></td>
      <td class="num mono" data-field="lastEventId">–</td>
      <td class="num mono" data-field="published">–</td>
      <td data-field="ring"><span class="muted">not loaded</span></td>
      <td class="num mono" data-field="warnings">0</td>
      <td class="num mono" data-field="evictions">0</td>
      <td class="links"><a class="page-link">page</a> · <a class="admin-link">admin</a> · <button type="button" class="text-button detail-open" aria-controls="session-detail">subscribers</button></td>`;
    const title = row.querySelector(".session-title");
    title.textContent = session.title || "(untitled)";
    title.href = page;
    row.querySelector(".session-id").textContent = `${shortId(session.id)}…`;
    row.querySelector(".page-link").href = page;
    row.querySelector(".admin-link").href = admin;
    this.setStatus(row, session.status || "open");
    this.tbody.prepend(row);
    this.rows.set(session.id, row);
    return row;
  }

  setStatus(row, status) {
    const pill = row.querySelector('[data-field="status"]');
    pill.textContent = status;
    pill.className = `pill pill-${status}`;
  }

  refreshAll(now) {
    const t1 = this.history.length ? this.history[this.history.length - 1][0] : now;
    let subscribers = 0;
    let warnings = 0;
    let evictions = 0;
    for (const session of this.live.values()) {
      const row = this.ensureRow(session);
      row.dataset.live = "true";
      subscribers += session.subscribers;
      warnings += session.warnings;
      evictions += session.evictions;
      this.setStatus(row, session.status || "open");
      this.setCell(row, "subscribers", formatCount(session.subscribers));
      this.setCell(row, "lastEventId", formatCount(session.lastEventId));
      this.setCell(row, "published", formatCount(session.published));
      this.setCell(row, "warnings", formatCount(session.warnings), session.warnings > 0);
      this.setCell(row, "evictions", formatCount(session.evictions), session.evictions > 0);
      this.setRing(row, session.ringLength, session.ringSize);
      const rates = ratesOf(this.sessionHistory.get(session.id) || []);
      drawSpark(row.querySelector('[data-field="spark"]'), trimHistory(rates, SPARK_WINDOW_MS), SPARK_WINDOW_MS, t1);
      const last = rates.length ? rates[rates.length - 1][1] : NaN;
      row.querySelector('[data-field="rate"]').textContent = formatRate(last);
    }
    for (const [id, row] of this.rows) {
      if (!this.live.has(id) && row.dataset.live === "true") {
        row.dataset.live = "false";
        this.setCell(row, "subscribers", "0");
        row.querySelector('[data-field="ring"]').innerHTML = '<span class="muted">not loaded</span>';
        row.querySelector('[data-field="rate"]').textContent = "–";
        row.querySelector('[data-field="spark"]').replaceChildren();
      }
    }
    const rates = ratesOf(this.history);
    document.getElementById("tile-loaded").textContent = formatCount(this.live.size);
    document.getElementById("tile-subscribers").textContent = formatCount(subscribers);
    document.getElementById("tile-rate").textContent = rates.length ? formatRate(rates[rates.length - 1][1]) : "–";
    document.getElementById("tile-warnings").textContent = formatCount(warnings);
    const evictionTile = document.getElementById("tile-evictions");
    evictionTile.textContent = formatCount(evictions);
    evictionTile.classList.toggle("nonzero", evictions > 0);
    drawPlot(document.getElementById("plot-rate"), rates, { windowMs: this.windowMs, t1, kind: "rate" });
    drawPlot(
      document.getElementById("plot-subscribers"),
      this.history.map(([t, , count]) => [t, count]),
      { windowMs: this.windowMs, t1, kind: "subscribers" },
    );
  }

  setCell(row, field, text, nonzero) {
    const cell = row.querySelector(`[data-field="${field}"]`);
    if (cell.textContent !== text) cell.textContent = text;
    if (nonzero !== undefined) cell.classList.toggle("nonzero", nonzero);
  }

  setRing(row, length, size) {
    const cell = row.querySelector('[data-field="ring"]');
    const percent = size ? Math.min(100, (100 * length) / size) : 0;
    let ring = cell.querySelector(".ring");
    if (!ring) {
      cell.innerHTML = '<span class="ring"><span class="ring-bar"><span></span></span><span class="mono"></span></span>';
      ring = cell.querySelector(".ring");
    }
    ring.querySelector(".ring-bar > span").style.width = `${percent.toFixed(1)}%`;
    ring.querySelector(".mono").textContent = `${formatCount(length)} / ${formatCount(size)}`;
    ring.title = `${percent.toFixed(1)}% of the ring`;
  }

  addActivity(item) {
    const list = document.getElementById("activity-list");
    document.getElementById("activity-empty").hidden = true;
    const entry = document.createElement("li");
    entry.dataset.kind = item.kind;
    const time = Object.assign(document.createElement("span"), { className: "activity-time", textContent: timeOf(item.t) });
    const what = document.createElement("span");
    what.className = "activity-what";
    const kind = Object.assign(document.createElement("span"), { className: `kind kind-${item.kind}`, textContent: item.kind.replace(/_/g, " ") });
    const row = this.rows.get(item.session);
    const title = row?.querySelector(".session-title")?.textContent || item.title || shortId(item.session);
    what.append(kind, document.createTextNode(title));
    const detail = document.createElement("span");
    detail.className = "activity-detail";
    detail.textContent = describe(item);
    entry.append(time, what, detail);
    list.prepend(entry);
    while (list.children.length > MAX_ACTIVITY) list.lastElementChild.remove();
  }
}

function describe(item) {
  const who = item.subscriber ? `sub ${shortId(item.subscriber)}` : "";
  switch (item.kind) {
    case "subscriber_joined":
      return [who, item.subject, item.clientAddr, item.clientId && `id ${item.clientId}`].filter(Boolean).join(" · ");
    case "subscriber_left":
      return [who, item.reason, `${formatCount(item.framesSent)} frames`].filter(Boolean).join(" · ");
    case "slow_client_warning":
      return `${who} · queue ${item.queueSize}/${item.maxQueued} (${item.threshold}) at id ${item.lastEventId}`;
    case "client_evicted":
      return `${who} · ${item.reason} after id ${item.droppedAfter}`;
    case "session_closed":
      return `last event id ${item.lastEventId}`;
    default:
      return "";
  }
}

if (typeof document !== "undefined") {
  const config = JSON.parse(document.getElementById("dashboard-config").textContent);
  const dashboard = new Dashboard(config);
  dashboard.connect();
  window.qwenwebDashboard = dashboard;
}
