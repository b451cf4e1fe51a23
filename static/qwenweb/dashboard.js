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
// History: the page starts from the server's (an hour of totals, two minutes per session)
// and adds each `tick` sample; both stay bounded (time and count: trimHistory). Samples
// are stamped with the server's clock: where two are more than `gapAfterS` apart, the
// plots draw a gap (./dashboard_plot.js). The plots' time axis ends at the server's "now"
// (the last sample's time plus the time since it came), so a feed that went quiet shows as
// a growing gap at the right, not as a line held flat.
//
// Sessions: live first (./dashboard_sessions.js), a filter (live / closed / all) and a
// search; lag and evictions are coloured by the configured thresholds (amber, red).
//
// A session's detail panel ("subscribers" in its row) shows its live subscribers in every
// server process with a Disconnect button each (./subscribers.js): it polls
// `GET /session/<id>/subscribers` every 2 s while it is open and the page is visible.
//
// The pure helpers are exported (and tested under Node: tests/js/dashboard.test.mjs); the
// DOM part runs only in a browser.

import { ConnectionWaitNotice } from "./connection_wait.js";
import { Plot, clockTime, niceMax, plotPaths, ratesOf, thresholdLevel, trimHistory } from "./dashboard_plot.js";
import { compareSessions, filterCounts, matchesFilter, matchesSearch } from "./dashboard_sessions.js";
import { SharedFeed } from "./shared_feed.js";
import { SubscribersTable } from "./subscribers.js";

export { niceMax, plotPaths, ratesOf, trimHistory };

const SVG_NS = "http://www.w3.org/2000/svg";
const MAX_ACTIVITY = 60;
const STALE_AFTER_MS = 3500;
const RANGE_WORDS = { 300: "last 5 minutes", 3600: "last hour" };

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

/** The history point of one `stats` tick: `[t_ms, published, subscribers, maxLag]` summed
 * (the lag: the worst) over its sessions. */
export function totalsOf(message) {
  let published = 0;
  let subscribers = 0;
  let lag = 0;
  for (const session of message.sessions) {
    published += session.published;
    subscribers += session.subscribers;
    lag = Math.max(lag, session.maxLag || 0);
  }
  return [message.t, published, subscribers, lag];
}

// -- the page --------------------------------------------------------------------------

function drawSpark(element, series, windowMs, t1, gapMs) {
  const max = niceMax(Math.max(0, ...series.map(([, v]) => v)));
  const { line } = plotPaths(series, { width: 120, height: 24, windowMs, yMax: max, t1, gapMs });
  element.replaceChildren();
  if (line) {
    const path = document.createElementNS(SVG_NS, "path");
    path.setAttribute("class", "line");
    path.setAttribute("d", line);
    element.append(path);
  }
}

function shortId(id) {
  return id ? String(id).slice(0, 8) : "";
}

const timeOf = clockTime;

class Dashboard {
  constructor(config) {
    this.config = config;
    this.historyMs = config.historyS * 1000;
    this.sparkMs = config.sessionHistoryS * 1000;
    this.gapMs = config.gapAfterS * 1000;
    this.maxPoints = Math.ceil((2 * config.historyS) / config.tickS);
    this.windowMs = 300_000;
    this.thresholds = config.thresholds;
    this.tbody = document.querySelector("#sessions tbody");
    this.rows = new Map();
    this.meta = new Map();
    this.history = trimHistory(config.history || [], this.historyMs, this.maxPoints);
    this.sessionHistory = new Map(Object.entries(config.sessionHistory || {}));
    this.live = new Map();
    this.statsSeen = 0;
    this.lastSample = { t: config.serverT ?? Date.now(), at: Date.now() };
    this.filter = "all";
    this.query = "";
    for (const row of document.querySelectorAll("#sessions tbody tr[data-session-id]")) {
      this.rows.set(row.dataset.sessionId, row);
      this.meta.set(row.dataset.sessionId, {
        id: row.dataset.sessionId,
        title: row.querySelector(".session-title")?.textContent || "",
        owner: row.dataset.owner || "",
        createdAt: Date.parse(row.dataset.created) || 0,
      });
    }
    for (const session of config.sessions || []) {
      if (session.live) this.live.set(session.id, session);
    }
    this.plots = {
      rate: new Plot({ frame: document.getElementById("plot-rate-frame"), kind: "rate", unit: "events/s", format: formatRate }),
      subscribers: new Plot({ frame: document.getElementById("plot-subscribers-frame"), kind: "subscribers", unit: "subscribers", format: formatCount }),
      lag: new Plot({ frame: document.getElementById("plot-lag-frame"), kind: "lag", unit: "events behind", format: formatCount, thresholds: this.thresholds.lag }),
    };
    for (const item of config.activity || []) this.addActivity(item);
    this.bindControls();
    this.refreshAll();
    this.detail = null;
    this.tbody.addEventListener("click", (event) => {
      const button = event.target.closest(".detail-open");
      const row = button?.closest("tr[data-session-id]");
      if (row) this.openDetail(row.dataset.sessionId);
    });
    document.getElementById("detail-close").addEventListener("click", () => this.closeDetail());
  }

  bindControls() {
    document.getElementById("time-range").addEventListener("change", (event) => {
      this.windowMs = Number(event.target.value) * 1000;
      for (const words of document.querySelectorAll(".range-words")) words.textContent = RANGE_WORDS[event.target.value];
      this.drawPlots();
    });
    document.getElementById("session-filter").addEventListener("change", (event) => {
      this.filter = event.target.value;
      this.arrangeRows();
    });
    document.getElementById("session-search").addEventListener("input", (event) => {
      this.query = event.target.value;
      this.arrangeRows();
    });
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
      if (Date.now() - this.lastStatsAt > STALE_AFTER_MS) {
        this.setStale(true);
        this.drawPlots(); // the axis moves on: missing samples show as a growing gap
      }
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
    this.lastSample = { t: message.t, at: this.lastStatsAt };
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
      for (const session of message.sessions) {
        const points = this.sessionHistory.get(session.id) || [];
        points.push([message.t, session.published, session.subscribers]);
        this.sessionHistory.set(session.id, trimHistory(points, this.sparkMs, this.maxPoints));
      }
      for (const id of [...this.sessionHistory.keys()]) {
        if (!seen.has(id)) this.sessionHistory.delete(id);
      }
      this.history.push(totalsOf(message));
      this.history = trimHistory(this.history, this.historyMs, this.maxPoints);
    }
    this.refreshAll();
  }

  onActivity(item) {
    this.addActivity(item);
    const row = this.rows.get(item.session);
    if (item.kind === "session_opened" && !row) {
      this.ensureRow({ id: item.session, title: item.title, status: item.status || "open" });
    }
    if (item.kind === "session_closed" && row) {
      this.setStatus(row, "closed");
      this.arrangeRows();
    }
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
      <td class="session-cell" data-label="Session"><a class="session-title"></a><span class="mono muted session-id"></span></td>
      <td data-label="Status"><span class="pill" data-field="status"></span></td>
      <td class="num mono" data-field="subscribers" data-label="Subscribers">0</td>
      <td class="num mono" data-field="maxLag" data-label="Worst lag">–</td>
      <td class="spark-cell" data-label="Events / s"><svg class="spark" data-field="spark" viewBox="0 0 120 24" preserveAspectRatio="none" aria-hidden="true"></svg><span class="mono spark-rate" data-field="rate">–</span></td>
      <td class="num mono" data-field="lastEventId" data-label="Last id">–</td>
      <td class="num mono" data-field="published" data-label="Published">–</td>
      <td data-field="ring" data-label="Ring"><span class="muted">not loaded</span></td>
      <td class="num mono" data-field="warnings" data-label="Warnings">0</td>
      <td class="num mono" data-field="evictions" data-label="Evictions">0</td>
      <td class="links" data-label="Open"><a class="page-link">page</a> · <a class="admin-link">admin</a> · <button type="button" class="text-button detail-open" aria-controls="session-detail">subscribers</button></td>`;
    const title = row.querySelector(".session-title");
    title.textContent = session.title || "(untitled)";
    title.href = page;
    const id = row.querySelector(".session-id");
    id.textContent = session.id;
    id.title = session.id;
    row.querySelector(".page-link").href = page;
    row.querySelector(".admin-link").href = admin;
    this.setStatus(row, session.status || "open");
    this.tbody.prepend(row);
    this.rows.set(session.id, row);
    const createdAt = Date.parse(session.createdAt) || this.lastSample.t;
    this.meta.set(session.id, { id: session.id, title: session.title || "", owner: "", createdAt });
    return row;
  }

  setStatus(row, status) {
    const pill = row.querySelector('[data-field="status"]');
    pill.textContent = status;
    pill.className = `pill pill-${status}`;
  }

  /** The server's clock now: the last sample's time plus the time since it came. */
  serverNow() {
    return this.lastSample.t + (Date.now() - this.lastSample.at);
  }

  refreshAll() {
    const t1 = this.serverNow();
    let subscribers = 0;
    let warnings = 0;
    let evictions = 0;
    let lag = 0;
    for (const session of this.live.values()) {
      const row = this.ensureRow(session);
      row.dataset.live = "true";
      subscribers += session.subscribers;
      warnings += session.warnings;
      evictions += session.evictions;
      lag = Math.max(lag, session.maxLag || 0);
      this.setStatus(row, session.status || "open");
      this.setCell(row, "subscribers", formatCount(session.subscribers));
      this.setCell(row, "maxLag", formatCount(session.maxLag ?? 0));
      this.setLevel(row.querySelector('[data-field="maxLag"]'), session.maxLag ?? 0, this.thresholds.lag);
      this.setCell(row, "lastEventId", formatCount(session.lastEventId));
      this.setCell(row, "published", formatCount(session.published));
      this.setCell(row, "warnings", formatCount(session.warnings), session.warnings > 0);
      this.setCell(row, "evictions", formatCount(session.evictions));
      this.setRing(row, session.ringLength, session.ringSize);
      const rates = ratesOf(this.sessionHistory.get(session.id) || [], this.gapMs);
      drawSpark(row.querySelector('[data-field="spark"]'), rates, this.sparkMs, t1, this.gapMs);
      const last = rates.length ? rates[rates.length - 1][1] : NaN;
      row.querySelector('[data-field="rate"]').textContent = formatRate(last);
      row.dataset.active = String(session.subscribers > 0 || last > 0);
    }
    for (const [id, row] of this.rows) {
      if (!this.live.has(id) && row.dataset.live === "true") {
        row.dataset.live = "false";
        row.dataset.active = "false";
        this.setCell(row, "subscribers", "0");
        this.setCell(row, "maxLag", "–");
        this.setLevel(row.querySelector('[data-field="maxLag"]'), 0, this.thresholds.lag);
        row.querySelector('[data-field="ring"]').innerHTML = '<span class="muted">not loaded</span>';
        row.querySelector('[data-field="rate"]').textContent = "–";
        row.querySelector('[data-field="spark"]').replaceChildren();
      }
      const cell = row.querySelector('[data-field="evictions"]');
      this.setLevel(cell, Number(cell.textContent.replace(/\D/g, "")) || 0, this.thresholds.evictions);
    }
    const rates = ratesOf(this.history, this.gapMs);
    const fresh = rates.length && t1 - rates[rates.length - 1][0] <= this.gapMs;
    document.getElementById("tile-loaded").textContent = formatCount(this.live.size);
    document.getElementById("tile-subscribers").textContent = formatCount(subscribers);
    document.getElementById("tile-rate").textContent = fresh ? formatRate(rates[rates.length - 1][1]) : "–";
    document.getElementById("tile-warnings").textContent = formatCount(warnings);
    const lagTile = document.getElementById("tile-lag");
    lagTile.textContent = formatCount(lag);
    this.setLevel(lagTile.parentElement, lag, this.thresholds.lag);
    const evictionTile = document.getElementById("tile-evictions");
    evictionTile.textContent = formatCount(evictions);
    this.setLevel(evictionTile.parentElement, evictions, this.thresholds.evictions);
    this.drawPlots(rates);
    this.arrangeRows();
  }

  drawPlots(rates = ratesOf(this.history, this.gapMs)) {
    const view = { windowMs: this.windowMs, t1: this.serverNow(), gapMs: this.gapMs };
    this.plots.rate.draw({ ...view, series: rates });
    this.plots.subscribers.draw({ ...view, series: this.history.map(([t, , count]) => [t, count]) });
    this.plots.lag.draw({ ...view, series: this.history.map(([t, , , lag]) => [t, lag ?? 0]) });
  }

  /** The session behind a row, for ordering and filtering. */
  sessionOf(id, row) {
    const meta = this.meta.get(id) || { id, title: "", owner: "", createdAt: 0 };
    const status = row.querySelector('[data-field="status"]').textContent.trim();
    return { ...meta, status, live: row.dataset.live === "true", active: row.dataset.active === "true" };
  }

  /** Order the rows (live first), then show those the filter and the search keep. Moves a
   * row only when the order changed (a row moved loses the focus inside it). */
  arrangeRows() {
    const sessions = [...this.rows].map(([id, row]) => ({ session: this.sessionOf(id, row), row }));
    sessions.sort((a, b) => compareSessions(a.session, b.session));
    const current = [...this.tbody.querySelectorAll("tr[data-session-id]")];
    if (sessions.some((entry, i) => current[i] !== entry.row)) {
      const marker = this.tbody.querySelector(".filter-empty");
      for (const { row } of sessions) this.tbody.insertBefore(row, marker);
    }
    let shown = 0;
    for (const { session, row } of sessions) {
      const keep = matchesFilter(session, this.filter) && matchesSearch(session, this.query);
      row.hidden = !keep;
      if (keep) shown += 1;
    }
    const counts = filterCounts(sessions.map((entry) => entry.session));
    for (const span of document.querySelectorAll("#session-filter [data-count]")) {
      span.textContent = `(${counts[span.dataset.count]})`;
    }
    const filtered = this.filter !== "all" || this.query.trim() !== "";
    this.tbody.querySelector(".filter-empty").hidden = !(filtered && shown === 0 && sessions.length > 0);
    const status = document.getElementById("filter-status");
    const text = filtered ? `${shown} of ${sessions.length} shown` : "";
    if (status.textContent !== text) status.textContent = text;
  }

  setCell(row, field, text, nonzero) {
    const cell = row.querySelector(`[data-field="${field}"]`);
    if (cell.textContent !== text) cell.textContent = text;
    if (nonzero !== undefined) cell.classList.toggle("nonzero", nonzero);
  }

  /** Colour `element` by `value` against `{warn, alert}`: class level-warn / level-alert. */
  setLevel(element, value, thresholds) {
    const level = thresholdLevel(value, thresholds);
    element.classList.toggle("level-warn", level === "warn");
    element.classList.toggle("level-alert", level === "alert");
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
