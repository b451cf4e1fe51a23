/**
 * frame_log.js — the session page's log of frames (templates/sessions/session_page.html,
 * `#frame-log`): one row per applied event, per synthetic frame and per thing the page
 * noticed, newest at the bottom, at most 2,000 rows. Text goes in with textContent only.
 *
 * `Follower` keeps a scroll container pinned to its bottom unless the user scrolled up (also
 * used by the transcript).
 */

const MAX_LOG_ROWS = 2000;
const FOLLOW_SLACK_PX = 48;
const SIGNAL_CLASSES = {
  slow_client_warning: "warning",
  client_evicted: "evicted",
  state_resync_required: "resync",
  history_truncated: "resync",
  stream_error: "error",
  replay_complete: "replay",
};

/** Create an element; `text` is set with textContent (never parsed as HTML). */
function h(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function setText(node, text) {
  const value = String(text);
  if (node.textContent !== value) node.textContent = value;
}

function pad(number, width = 2) {
  return String(number).padStart(width, "0");
}

/** "HH:MM:SS.mmm" in local time for epoch milliseconds; "—" when not a number. */
function formatTime(ms) {
  if (typeof ms !== "number" || !Number.isFinite(ms)) return "—";
  const d = new Date(ms);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

/** Keeps a scroll container pinned to its bottom unless the user scrolled up. */
export class Follower {
  constructor(element) {
    this.element = element;
    this.stick = true;
    this.frame = 0;
    element.addEventListener(
      "scroll",
      () => {
        this.stick = element.scrollHeight - element.scrollTop - element.clientHeight < FOLLOW_SLACK_PX;
      },
      { passive: true },
    );
  }

  /** Scroll to the bottom at the next frame if pinned (no layout read per append). */
  kick() {
    if (!this.stick || this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.element.scrollTop = this.element.scrollHeight;
    });
  }
}

/** The log of frames: one row per applied event and per synthetic frame, newest at the bottom. */
export class FrameLog {
  constructor(body, countElement, scroller) {
    this.body = body;
    this.countElement = countElement;
    this.follower = new Follower(scroller);
    this.clear();
  }

  clear() {
    this.body.replaceChildren();
    this.total = 0;
    this._renderCount();
  }

  /**
   * Add a row. kind: "event" (has an id), "synthetic" (a server frame without id) or
   * "local" (something this page noticed, e.g. a gap).
   */
  add({ id = null, type, timeMs, source = "", note = "", kind = "event" }) {
    const row = h("tr", `row-${kind}`);
    row.dataset.kind = kind;
    row.dataset.type = type;
    if (id !== null) row.dataset.id = String(id);
    if (source) row.dataset.source = source;
    const signal = SIGNAL_CLASSES[type];
    if (signal) row.classList.add(`row-${signal}`);
    const idCell = h("td", "num mono", id !== null ? id : kind === "synthetic" ? "◆" : "·");
    if (id === null) idCell.title = kind === "synthetic" ? "synthetic frame: no id, never moves the cursor" : "noted by this page";
    const typeCell = h("td", "type");
    typeCell.append(h("span", `type-name${signal ? ` sig sig-${signal}` : ""}`, type));
    const noteCell = h("td", "note");
    if (source) noteCell.append(h("span", `source source-${source}`, source));
    noteCell.append(document.createTextNode(note));
    row.append(idCell, typeCell, h("td", "mono time", formatTime(timeMs)), noteCell);
    this.body.append(row);
    this.total += 1;
    if (this.body.rows.length > MAX_LOG_ROWS) this.body.deleteRow(0);
    this._renderCount();
    this.follower.kick();
  }

  _renderCount() {
    const shown = this.body.rows.length;
    setText(this.countElement, shown < this.total ? `last ${shown} of ${this.total}` : `${this.total} rows`);
  }
}
