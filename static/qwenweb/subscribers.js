/**
 * subscribers.js — the operators' "Live subscribers" table (session page and dashboard).
 *
 * Polls `GET /session/<id>/subscribers` (staff only; docs/protocol.md, "Endpoints") every
 * `intervalMs` (2 s) while the page is visible, and renders one row per current subscriber
 * in every server process: who, from where, `X-Client-Id`, since when, last id written, lag
 * behind the head, queue fill (frames and bytes), bytes per second. Each row has a
 * Disconnect button: `POST /session/<id>/subscribers/<subscriber id>/disconnect` with the
 * CSRF header; the outcome, or the error, is said in words (never a raw code).
 *
 * Costs the server nothing per frame: each poll reads counters the stream keeps anyway.
 * Every request is bounded (`REQUEST_TIMEOUT_MS`); a failed poll keeps the last rows,
 * greyed, and says why. Text from the server is only ever inserted as text.
 *
 * Exports the pure helpers (tested under Node: tests/js/operator_tools.test.mjs) and
 * `SubscribersTable`, which needs a DOM.
 */

import { envelopeFields } from "./api_error.js";
import { lookup } from "./lookup.js";

const REQUEST_TIMEOUT_MS = 10_000;

/** "512 B", "1.5 KiB", "2.0 MiB"; "?" when not a number. */
export function formatBytes(bytes) {
  if (typeof bytes !== "number" || !Number.isFinite(bytes)) return "?";
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / (1024 * 1024)).toFixed(1)} MiB`;
}

/** A rate in bytes per second as "1.5 KiB/s". */
export function formatRate(bytesPerSecond) {
  return `${formatBytes(bytesPerSecond)}/s`;
}

/** How long ago `sinceS` (epoch seconds) was at `nowMs`: "42 s", "3 min", "2 h 5 min". */
export function formatAge(sinceS, nowMs) {
  if (typeof sinceS !== "number" || !Number.isFinite(sinceS)) return "?";
  const seconds = Math.max(0, Math.floor(nowMs / 1000 - sinceS));
  if (seconds < 60) return `${seconds} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min`;
  return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

const SENTENCES = {
  unauthorized: "You are not logged in any more: log in again.",
  forbidden: "You may not do this here.",
  csrf_failed: "The page's security token was refused: reload the page and try again.",
  not_found: "This session does not exist (any more).",
  subscriber_not_found: "That subscriber is no longer connected: it left or reconnected already.",
  session_closed: "The session is closed: nothing can be published into it any more.",
  invalid_json: "That is not valid JSON.",
  invalid_event: "The server refused the event.",
  invalid_request: "The server refused the request.",
  body_too_large: "The event is too large for this server.",
  method_not_allowed: "The server does not accept this request here.",
  backend_unavailable: "The event store (Redis) is unavailable: try again in a few seconds.",
  unavailable: "The database is busy: try again shortly.",
};

/**
 * An API error in words for people: a sentence for the envelope's `code`, followed by the
 * server's own message (`error`, which is words too), or the HTTP status when the body is
 * not the JSON envelope. The machine code itself is never shown.
 */
export function describeApiError(status, body) {
  const { code, error } = envelopeFields(body);
  const message = error ?? "";
  const sentence = lookup(SENTENCES, code);
  if (sentence && message) return `${sentence} (${message})`;
  if (sentence) return sentence;
  if (message) return `The server refused: ${message}.`;
  return status ? `The server answered HTTP ${status}.` : "The server could not be reached.";
}

/** Read a JSON answer; `{status, body}` with `body` null when it is not JSON. Never throws. */
export async function readJson(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON: the status says enough
  }
  return { status: response.status, body };
}

/** `fetch` bounded by `REQUEST_TIMEOUT_MS`; rejects on a network error or the timeout. */
export async function boundedFetch(url, init = {}, timeoutMs = REQUEST_TIMEOUT_MS) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), timeoutMs);
  try {
    return await fetch(url, { ...init, signal: controller.signal });
  } finally {
    clearTimeout(timer);
  }
}

/** The CSRF token: the page's `{% csrf_token %}` input, else the `csrftoken` cookie. */
export function csrfToken() {
  const input = document.querySelector("input[name=csrfmiddlewaretoken]");
  if (input && input.value) return input.value;
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

/** The table's columns: `[label, class]`; each cell carries its label (`data-label`) for
 * the stacked rows of narrow screens (session_page.css). */
const COLUMNS = [
  ["Subscriber", ""], ["Process", ""], ["User", ""], ["Client id", ""], ["Address", ""],
  ["Since", ""], ["Last id", "num"], ["Lag", "num"], ["Queue", "num"], ["Rate", "num"], ["Action", "hidden-label"],
];

function cell(text, className) {
  const td = document.createElement("td");
  if (className) td.className = className;
  td.textContent = String(text);
  return td;
}

/**
 * The table. Options: `root` (an element to render into), `listUrl`, `disconnectUrl(id)`,
 * `intervalMs` (2000), `ownClientId` (rows with this `X-Client-Id` are marked "this page"),
 * `onRows(rows)` (called after each successful poll).
 * Methods: `start()`, `stop()`, `refresh()` (one poll now; resolves with the rows or null).
 */
export class SubscribersTable {
  constructor({ root, listUrl, disconnectUrl, intervalMs = 2000, ownClientId = "", onRows = null }) {
    this.root = root;
    this.listUrl = listUrl;
    this.disconnectUrl = disconnectUrl;
    this.intervalMs = intervalMs;
    this.ownClientId = ownClientId;
    this.onRows = onRows;
    this.timer = null;
    this.running = false;
    this.inFlight = null;
    this.rows = [];
    this.build();
    this.onVisibility = () => {
      if (!this.running) return;
      if (document.visibilityState === "visible") this.schedule(0);
      else this.cancel();
    };
  }

  build() {
    const status = document.createElement("p");
    status.className = "subs-status muted";
    status.setAttribute("role", "status");
    status.textContent = "Loading…";
    const result = document.createElement("p");
    result.className = "subs-result";
    result.setAttribute("aria-live", "polite");
    result.hidden = true;
    const scroller = document.createElement("div");
    scroller.className = "subs-scroll";
    scroller.tabIndex = 0; // a scrolling region is reachable from the keyboard (axe)
    scroller.setAttribute("role", "region");
    scroller.setAttribute("aria-label", "Table of live subscribers");
    const table = document.createElement("table");
    table.className = "table subs-table";
    const head = document.createElement("thead");
    const headRow = document.createElement("tr");
    for (const [label, cls] of COLUMNS) {
      const th = document.createElement("th");
      if (cls === "hidden-label") {
        // The buttons' column: named for screen readers (axe empty-table-header), not shown.
        const name = document.createElement("span");
        name.className = "sr-only-text";
        name.textContent = label;
        th.append(name);
      } else {
        th.textContent = label;
        if (cls) th.className = cls;
      }
      headRow.append(th);
    }
    head.append(headRow);
    this.body = document.createElement("tbody");
    table.append(head, this.body);
    scroller.append(table);
    this.root.replaceChildren(status, result, scroller);
    this.status = status;
    this.result = result;
    this.table = table;
  }

  start() {
    if (this.running) return;
    this.running = true;
    document.addEventListener("visibilitychange", this.onVisibility);
    this.schedule(0);
  }

  stop() {
    this.running = false;
    this.cancel();
    document.removeEventListener("visibilitychange", this.onVisibility);
  }

  cancel() {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
  }

  schedule(delayMs) {
    this.cancel();
    if (!this.running || document.visibilityState === "hidden") return;
    this.timer = setTimeout(async () => {
      this.timer = null;
      await this.refresh();
      this.schedule(this.intervalMs);
    }, delayMs);
  }

  /** Poll once (one request at a time); the rows, or null when the poll failed. */
  refresh() {
    if (this.inFlight === null) {
      this.inFlight = this.poll().finally(() => {
        this.inFlight = null;
      });
    }
    return this.inFlight;
  }

  async poll() {
    let answer;
    try {
      const response = await boundedFetch(this.listUrl, {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      answer = await readJson(response);
    } catch (error) {
      this.showStale(`Could not load the subscribers: ${error.name === "AbortError" ? "no answer in time" : "network error"}.`);
      return null;
    }
    if (answer.status !== 200 || answer.body === null || !Array.isArray(answer.body.subscribers)) {
      this.showStale(describeApiError(answer.status, answer.body));
      return null;
    }
    this.render(answer.body.subscribers, answer.body.process);
    if (this.onRows) this.onRows(answer.body.subscribers);
    return answer.body.subscribers;
  }

  showStale(text) {
    this.table.classList.add("stale");
    this.status.textContent = `${text} Showing the last rows received.`;
    this.status.dataset.kind = "error";
  }

  render(rows, process) {
    this.rows = rows;
    this.table.classList.remove("stale");
    delete this.status.dataset.kind;
    const processes = new Set(rows.map((row) => row.process));
    this.status.textContent =
      rows.length === 0
        ? `No subscriber right now · updated ${new Date().toLocaleTimeString("en-GB", { hour12: false })}`
        : `${rows.length} subscriber${rows.length === 1 ? "" : "s"} in ${processes.size} server process${
            processes.size === 1 ? "" : "es"
          } · updated ${new Date().toLocaleTimeString("en-GB", { hour12: false })}`;
    const now = Date.now();
    const trs = rows.map((row) => this.renderRow(row, process, now));
    this.body.replaceChildren(...trs);
  }

  renderRow(row, process, now) {
    const tr = document.createElement("tr");
    tr.dataset.subscriberId = String(row.id);
    tr.dataset.clientId = String(row.clientId ?? "");
    const own = this.ownClientId !== "" && row.clientId === this.ownClientId;
    if (own) tr.classList.add("subs-own");
    const idCell = cell(String(row.id).slice(0, 8), "mono");
    idCell.title = String(row.id);
    if (own) idCell.append(Object.assign(document.createElement("span"), { className: "subs-tag", textContent: "this page" }));
    const processCell = cell(row.process, "mono");
    if (row.process === process) processCell.title = "the process that answered this page";
    const queue = `${row.queuedFrames} · ${formatBytes(row.queuedBytes)}`;
    const button = document.createElement("button");
    button.type = "button";
    button.className = "btn btn-small subs-disconnect";
    button.textContent = "Disconnect";
    button.title = "End this subscriber with a terminal stream_error; its client may reconnect";
    button.addEventListener("click", () => this.disconnect(row, button));
    const action = document.createElement("td");
    action.append(button);
    tr.append(
      idCell,
      processCell,
      cell(row.user || "—"),
      cell(row.clientId || "—", "mono"),
      cell(row.address || "—", "mono"),
      cell(formatAge(row.since, now)),
      cell(row.lastEventId ?? "—", "num mono"),
      cell(row.lag, "num mono"),
      cell(queue, "num mono"),
      cell(formatRate(row.bytesPerSecond), "num mono"),
      action,
    );
    tr.childNodes.forEach((td, index) => {
      if (index < COLUMNS.length) td.dataset.label = COLUMNS[index][0];
    });
    return tr;
  }

  async disconnect(row, button) {
    button.disabled = true;
    const who = [row.user, row.clientId].filter(Boolean).join(", ");
    const name = `subscriber ${String(row.id).slice(0, 8)}${who ? ` (${who})` : ""}`;
    let answer;
    try {
      const response = await boundedFetch(this.disconnectUrl(row.id), {
        method: "POST",
        credentials: "same-origin",
        headers: { Accept: "application/json", "X-CSRFToken": csrfToken() },
      });
      answer = await readJson(response);
    } catch (error) {
      this.say("error", `Could not disconnect ${name}: ${error.name === "AbortError" ? "no answer in time" : "network error"}.`);
      button.disabled = false;
      return;
    }
    if (answer.status === 200 && answer.body !== null && answer.body.disconnected === true) {
      const where = answer.body.relayed ? `; asked process ${answer.body.process} to end it` : "";
      this.say("ok", `Disconnected ${name}: it gets a terminal stream_error after what was queued${where}. Its client may reconnect.`);
    } else {
      this.say("error", `Could not disconnect ${name}: ${describeApiError(answer.status, answer.body)}`);
      button.disabled = false;
    }
    this.refresh();
  }

  say(kind, text) {
    this.result.dataset.kind = kind;
    this.result.textContent = text;
    this.result.hidden = false;
  }
}
