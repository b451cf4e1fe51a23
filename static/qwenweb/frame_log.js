/**
 * frame_log.js — the session page's log of frames (templates/sessions/session_page.html,
 * `#frame-log`): one row per applied event, per synthetic frame and per thing the page
 * noticed, newest at the bottom, at most 2,000 rows. Text goes in with textContent only.
 *
 * Follow mode (`Follower`, also used by the transcript): the log stays pinned to its newest
 * row until the user scrolls up; it survives reconnects, replay bursts and resyncs, because
 * only a scroll that moves up unpins it (the page's own scrolling, rows trimmed at the top
 * and a rebuild never do; the scroller has `overflow-anchor: none`). While unpinned, a
 * "N new — jump to latest" button counts the rows that arrived.
 *
 * Tools (optional elements, found by id): `#log-follow` (follow on/off), `#log-type` (one
 * type), `#log-incidents` (warnings, evictions, resyncs, stream errors and what the page
 * noticed), `#log-search` (text in the id, type or note), `#log-export` (the kept rows as
 * NDJSON, one `{"id", "type", "kind", "source", "time", "note"}` object per line).
 *
 * Each row's id cell links to its event (`#e<id>`, ./event_links.js; the id stays the
 * cell's text: the Gap repair checks read it), and a frame's type is a button that opens
 * its full JSON (`onOpen(row, payload)`; the payload is the envelope when it is at most
 * `MAX_KEPT_JSON_CHARS` long, else null: the page fetches it from the server).
 */

import { lookup } from "./lookup.js";

const MAX_LOG_ROWS = 2000;
/** A frame's envelope is kept for its JSON up to this size (characters); larger ones (the
 * 64 KiB probes of "Provoke backpressure": 2,000 rows would hold 128 MiB) are fetched. */
export const MAX_KEPT_JSON_CHARS = 16 * 1024;
const FOLLOW_SLACK_PX = 48;
const INCIDENT_TYPES = new Set([
  "slow_client_warning",
  "client_evicted",
  "state_resync_required",
  "history_truncated",
  "stream_error",
]);
const SIGNAL_CLASSES = {
  slow_client_warning: "warning",
  client_evicted: "evicted",
  state_resync_required: "resync",
  history_truncated: "resync",
  stream_error: "error",
  replay_complete: "replay",
};

/** Create an element; `text` is set with textContent (never parsed as HTML). */
export function h(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

export function setText(node, text) {
  const value = String(text);
  if (node.textContent !== value) node.textContent = value;
}

export function pad(number, width = 2) {
  return String(number).padStart(width, "0");
}

/** "HH:MM:SS.mmm" in local time for epoch milliseconds; "—" when not a number. */
export function formatTime(ms) {
  if (typeof ms !== "number" || !Number.isFinite(ms)) return "—";
  const d = new Date(ms);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

/** Keeps a scroll container pinned to its bottom unless the user scrolled up. */
export class Follower {
  /** `onChange(stick)` is called when follow mode turns on or off. */
  constructor(element, onChange = () => {}) {
    this.element = element;
    this.onChange = onChange;
    this.stick = true;
    this.frame = 0;
    this.lastTop = element.scrollTop;
    element.addEventListener(
      "scroll",
      () => {
        const top = element.scrollTop;
        const distance = element.scrollHeight - top - element.clientHeight;
        // Only a move up unpins: rows arriving between our scroll and its event, rows
        // trimmed at the top, or a rebuild that shrinks the content never do.
        if (distance < FOLLOW_SLACK_PX) this.setStick(true);
        else if (top < this.lastTop - 1) this.setStick(false);
        this.lastTop = top;
      },
      { passive: true },
    );
  }

  setStick(stick) {
    if (this.stick === stick) return;
    this.stick = stick;
    this.onChange(stick);
    if (stick) this.kick();
  }

  /** Pin again and scroll to the newest content now. */
  jump() {
    this.setStick(true);
    this.element.scrollTop = this.element.scrollHeight;
    this.lastTop = this.element.scrollTop;
  }

  /** Scroll to the bottom at the next frame if pinned (no layout read per append). */
  kick() {
    if (!this.stick || this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      if (!this.stick) return;
      this.element.scrollTop = this.element.scrollHeight;
      this.lastTop = this.element.scrollTop;
    });
  }
}

function findTools() {
  const byId = (id) => document.getElementById(id);
  return {
    follow: byId("log-follow"),
    type: byId("log-type"),
    incidents: byId("log-incidents"),
    search: byId("log-search"),
    exportButton: byId("log-export"),
    jump: byId("log-jump"),
  };
}

function isoTime(ms) {
  return typeof ms === "number" && Number.isFinite(ms) ? new Date(ms).toISOString() : null;
}

/** The log of frames: one row per applied event and per synthetic frame, newest at the bottom. */
export class FrameLog {
  constructor(body, countElement, scroller, tools = findTools()) {
    this.body = body;
    this.payloads = new WeakMap(); // row → {json} (null: too large to keep)
    this.onOpen = () => {};
    body.addEventListener("click", (event) => {
      const button = event.target.closest ? event.target.closest("button.frame-json") : null;
      const row = button !== null ? button.closest("tr") : null;
      if (row !== null && this.payloads.has(row)) this.onOpen(row, this.payloads.get(row).json);
    });
    this.countElement = countElement;
    this.tools = tools;
    this.records = [];
    this.types = new Set();
    this.unseen = 0;
    this.filter = { type: "", incidents: false, text: "" };
    this.follower = new Follower(scroller, (stick) => this._onFollow(stick));
    this._bindTools();
    this.clear();
  }

  clear() {
    this.body.replaceChildren();
    this.records = [];
    this.total = 0;
    this.unseen = 0;
    this._renderJump();
    this._renderCount();
    this.follower.kick();
  }

  /**
   * Add a row. kind: "event" (has an id), "synthetic" (a server frame without id) or
   * "local" (something this page noticed, e.g. a gap). `json`: the frame's envelope (or
   * its raw text), opened by a click on its type; `size`: its length in characters.
   */
  add({ id = null, type, timeMs, source = "", note = "", kind = "event", json, size = 0 }) {
    const row = h("tr", `row-${kind}`);
    row.dataset.kind = kind;
    row.dataset.type = type;
    if (id !== null) row.dataset.id = String(id);
    if (source) row.dataset.source = source;
    const signal = lookup(SIGNAL_CLASSES, type);
    if (signal) row.classList.add(`row-${signal}`);
    const idCell = h("td", "num mono");
    if (id !== null) {
      const link = h("a", "event-link", id);
      link.href = `#e${String(id).split("–")[0]}`;
      idCell.append(link);
    } else {
      idCell.textContent = kind === "synthetic" ? "◆" : "·";
      idCell.title = kind === "synthetic" ? "synthetic frame: no id, never moves the cursor" : "noted by this page";
    }
    const typeCell = h("td", "type");
    const name = h(json !== undefined ? "button" : "span", `type-name${signal ? ` sig sig-${signal}` : ""}`, type);
    if (json !== undefined) {
      name.type = "button";
      name.classList.add("frame-json");
      name.setAttribute("aria-haspopup", "dialog");
      name.title = "Show this frame's JSON";
      this.payloads.set(row, { json: size <= MAX_KEPT_JSON_CHARS ? json : null });
    }
    typeCell.append(name);
    const noteCell = h("td", "note");
    if (source) noteCell.append(h("span", `source source-${source}`, source));
    noteCell.append(document.createTextNode(note));
    noteCell.title = note;
    row.append(idCell, typeCell, h("td", "mono time", formatTime(timeMs)), noteCell);
    const record = { id, type, kind, source, time: isoTime(timeMs), note };
    row.hidden = !this._matches(record);
    this.body.append(row);
    this.records.push(record);
    this.total += 1;
    if (this.body.rows.length > MAX_LOG_ROWS) {
      this.body.deleteRow(0);
      this.records.shift();
    }
    this._addType(type);
    if (!row.hidden && !this.follower.stick) {
      this.unseen += 1;
      this._renderJump();
    }
    this._renderCount();
    this.follower.kick();
  }

  /** The row of event `id` (also a compacted row `a–b` holding it), or null. */
  rowFor(id) {
    for (const row of this.body.rows) {
      const [first, last] = (row.dataset.id ?? "").split("–").map(Number);
      if (first === id || (last !== undefined && first <= id && id <= last)) return row;
    }
    return null;
  }

  /** The ids of the first and the last event row kept, or null when there is none. */
  idRange() {
    const ids = [];
    for (const row of this.body.rows) if (row.dataset.id !== undefined) ids.push(row.dataset.id);
    if (ids.length === 0) return null;
    return { first: Number(ids[0].split("–")[0]), last: Number(ids.at(-1).split("–").at(-1)) };
  }

  /** Grey the rows kept so far (class `row-stale`): the view was continued after a resync. */
  retire() {
    for (const row of this.body.rows) row.classList.add("row-stale");
  }

  /** The kept rows as NDJSON text (one JSON object per line, oldest first). */
  toNdjson() {
    return this.records.map((record) => JSON.stringify(record)).join("\n") + (this.records.length ? "\n" : "");
  }

  _matches(record) {
    const { type, incidents, text } = this.filter;
    if (type && record.type !== type) return false;
    if (incidents && !(INCIDENT_TYPES.has(record.type) || record.kind === "local")) return false;
    if (text) {
      const haystack = `${record.id ?? ""} ${record.type} ${record.source} ${record.note}`.toLowerCase();
      if (!haystack.includes(text)) return false;
    }
    return true;
  }

  _applyFilter() {
    const { type, incidents, search } = this.tools;
    this.filter = {
      type: type ? type.value : "",
      incidents: incidents ? incidents.checked : false,
      text: search ? search.value.trim().toLowerCase() : "",
    };
    const rows = this.body.rows;
    for (let i = 0; i < rows.length; i += 1) rows[i].hidden = !this._matches(this.records[i]);
    this._renderCount();
    this.follower.kick();
  }

  _addType(type) {
    const select = this.tools.type;
    if (!select || this.types.has(type)) return;
    this.types.add(type);
    const option = h("option", "", type);
    option.value = type;
    select.append(option);
  }

  _bindTools() {
    const { follow, type, incidents, search, exportButton, jump } = this.tools;
    if (follow) {
      follow.checked = true;
      follow.addEventListener("change", () => {
        if (follow.checked) this.follower.jump();
        else this.follower.setStick(false);
      });
    }
    for (const control of [type, incidents]) if (control) control.addEventListener("change", () => this._applyFilter());
    if (search) search.addEventListener("input", () => this._applyFilter());
    if (jump) jump.addEventListener("click", () => this.follower.jump());
    if (exportButton) exportButton.addEventListener("click", () => this._export(exportButton));
  }

  _export(button) {
    const blob = new Blob([this.toNdjson()], { type: "application/x-ndjson" });
    const link = document.createElement("a");
    link.href = URL.createObjectURL(blob);
    link.download = button.dataset.filename || "frames.ndjson";
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(link.href), 10_000);
  }

  _onFollow(stick) {
    if (this.tools.follow) this.tools.follow.checked = stick;
    if (stick) this.unseen = 0;
    this._renderJump();
  }

  _renderJump() {
    const jump = this.tools.jump;
    if (!jump) return;
    jump.hidden = this.unseen === 0;
    setText(jump, `${this.unseen} new — jump to latest`);
  }

  _renderCount() {
    const kept = this.body.rows.length;
    let text = kept < this.total ? `last ${kept} of ${this.total}` : `${this.total} rows`;
    const { type, incidents, text: query } = this.filter;
    if (type || incidents || query) {
      const shown = this.records.filter((record) => this._matches(record)).length;
      text += ` · ${shown} shown`;
    }
    setText(this.countElement, text);
  }
}
