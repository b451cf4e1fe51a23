/**
 * session_status.js — what the session page says about its stream: the state badge and its
 * reason, the connection panel, the banner and the notices.
 *
 * `StatusPanel` draws, and decides nothing:
 * - the badge (`#state-badge`) with the stream's state and its reason (`#state-reason`: the
 *   reasons of sse.js and shared_stream.js in words, `REASONS`; an unknown one as it is), or
 *   "evicted" when the paused-reader check says the server evicted this page's reader;
 * - the connection panel: cursor and epoch, reconnects, retry, the countdown to the next
 *   attempt (redrawn every 200 ms while one is scheduled, SC-11), reading or paused,
 *   maxQueued, frames and duplicates, the tab sharing line, and the last
 *   `slow_client_warning` / `client_evicted` / `state_resync_required` / `stream_error`;
 * - which controls are enabled (Drop while connecting or open; Pause and maxQueued until
 *   the session ended; the demo agent while the debug tools are on);
 * - the cursor only as an id that was issued (`cursorText`): never the position below an
 *   epoch's first id that a restarted server resumes from (docs/protocol.md, snapshot);
 * - the banner (`#banner`: the session ended (204, EB-15), the stream stopped, the page
 *   cannot read the session) and the notices (`#notice`: they fade after 6 s, 12 s for an
 *   error, or stay until the stream reaches one of the states they were given);
 * - what leaving the shared stream means for the other tabs (`othersAfterDetach`).
 *
 * The page (session_page.js) owns the state it shows and passes it to `render()`. Text only
 * ever goes in with `textContent`.
 */
import { clip, serverTime } from "./envelopes.js";
import { formatTime, h, setText } from "./frame_log.js";
import { lookup } from "./lookup.js";

const NOTICE_MS = { info: 6000, error: 12000 };
const REASONS = {
  start: "opening the stream",
  reconnect: "reconnecting with the cursor",
  token_refresh: "token rejected (401): one retry with a fresh token",
  end_of_stream: "the server ended the stream",
  network_error: "network error",
  server_error: "server error",
  bad_content_type: "not an event stream",
  unexpected_status: "unexpected status: not an event stream answer, the stream ends",
  shared_waiting: "waiting for the tab that holds this session's stream",
  shared_handover: "the tab that held the stream closed: another tab takes over",
  client_evicted: "evicted: this reader fell behind",
  stream_error: "the server reported a stream error",
  dropped: "dropped from this page",
  closed: "closed by this page",
  session_ended: "the session is closed",
  unauthorized: "not authorized (401 after a fresh token)",
  forbidden: "forbidden (403)",
  not_found: "unknown session (404)",
  client_error: "request refused",
  token_error: "could not obtain a token",
  internal_error: "client error",
};

/**
 * What a tab leaving the shared stream (Drop, Pause reading, a maxQueued of its own) means
 * for the other tabs, said after "this tab now reads a stream of its own": from the `role`
 * and `tabs` of its stream (shared_stream.js) before it left. A follower leaves a leader
 * and maybe more tabs behind, a leader its followers; a leader alone shared with nobody;
 * while electing the others are not known yet; an own stream shared nothing.
 */
export function othersAfterDetach(role, tabs) {
  if (role === "follower" || (role === "leader" && tabs > 1)) return "; the other tabs of this session keep sharing theirs";
  if (role === "leader") return " (no other tab of this session shared it)";
  return "";
}

/**
 * @typedef {object} PanelView  What `render()` shows (the page's state).
 * @property {import("./shared_stream.js").SharedStream|null} stream
 * @property {string} state  The stream's state (sse.js `STATES`).
 * @property {boolean} paused  Reading is paused.
 * @property {boolean} evictedWhilePaused
 * @property {number} reconnectBase  Reconnects of the streams this page closed before.
 * @property {number|undefined} maxQueued  This tab's `?maxQueued=`, undefined for the default.
 * @property {number} maxQueuedDefault
 * @property {number} framesReceived
 * @property {number} duplicates
 * @property {boolean} demoRunning
 * @property {boolean} debugTools  The debug tools are on (off once the session has ended).
 * @property {number|null} viewCursor  The highest event id the view applied, or null.
 */

/**
 * The connection panel's cursor: `{text, title}`. The stream's cursor (`lastEventId`, a
 * string, "" when none) is shown only when it names an issued event: one the view applied
 * (`viewCursor`, null when none of this epoch). A cursor with nothing applied is the position
 * a new session (0) or a restarted server's new epoch (the id below its first,
 * docs/protocol.md "snapshot") resumes from: "none yet", never an id that was not issued.
 */
export function cursorText(cursor, viewCursor) {
  if (cursor === "") return { text: "—", title: "" };
  if (viewCursor === null || viewCursor < 1) {
    return { text: "none yet", title: `no event of this epoch yet: the stream resumes after position ${cursor}` };
  }
  return { text: cursor, title: "" };
}

export class StatusPanel {
  /** @param {object} dom  The page's elements (session_page.js `collectDom()`). */
  constructor(dom) {
    this.dom = dom;
    this.nextAttemptAt = null;
    this.ticker = null;
    this.noticeTimer = null;
    this.noticeClearOn = null;
    this.sharing = null;
  }

  /** Add the "Sharing" line to the connection panel's facts. */
  addSharing() {
    const facts = this.dom.cursor.closest("dl");
    if (facts !== null) {
      const term = h("dt", "", "Sharing");
      this.sharing = h("dd", "", "—");
      this.sharing.id = "sharing";
      facts.append(term, this.sharing);
    }
  }

  /** Add the "Transport" line: which transport the stream rides (`?transport=ws`). */
  addTransport(overWebSocket) {
    const facts = this.dom.cursor.closest("dl");
    if (facts === null) return;
    const value = h("dd", "", overWebSocket ? "WebSocket (qwenweb.v1, one socket for every session)" : "SSE (fetch)");
    value.id = "transport";
    value.dataset.transport = overWebSocket ? "websocket" : "sse";
    facts.append(h("dt", "", "Transport"), value);
  }

  renderSharing(stream) {
    if (this.sharing === null || stream === null) return;
    const how = stream.mode === "locks" ? "Web Locks" : stream.mode === "lease" ? "localStorage lease" : "";
    const text = lookup(
      {
        idle: "—",
        electing: "joining the other tabs of this session…",
        leader: `this tab holds the stream, shared with ${stream.tabs - 1} other tab(s) (${how})`,
        follower: `shared: another tab holds the stream (${how})`,
        own: "this tab's own stream (not shared)",
      },
      stream.role,
    );
    this.sharing.dataset.role = stream.role;
    setText(this.sharing, text ?? stream.role);
  }

  /** Show the stream's new state: badge, reason, banner; hide the notices tied to it. */
  showState(state, info) {
    if (this.noticeClearOn !== null && this.noticeClearOn.includes(state)) this.hideNotice();
    const badge = this.dom.badge;
    badge.dataset.state = state;
    setText(badge, state);
    const parts = [lookup(REASONS, info.reason) ?? info.reason ?? ""];
    if (state === "open") parts[0] = `streaming since ${formatTime(Date.now())}`;
    else if (info.status) parts.push(`HTTP ${info.status}`);
    if (info.detail) parts.push(String(info.detail));
    const reason = parts.filter(Boolean).join(" · ");
    setText(this.dom.stateReason, reason);
    this.dom.stateReason.title = reason;
    if (state === "open") this.hideBanner();
    if (state !== "reconnecting") this.nextAttemptAt = null;
    if (state === "ended") {
      this.showBanner(
        "ended",
        "Session ended. The server answered 204 No Content: the session is closed, and this page makes no more requests.",
      );
    } else if (state === "stopped" && info.reason !== "closed") {
      this.showBanner("error", `Stream stopped: ${reason}. Use Reconnect to try again.`);
    }
  }

  /** The badge says "evicted": the server evicted this page's reader while it was paused. */
  showEvicted() {
    const badge = this.dom.badge;
    badge.dataset.state = "evicted";
    setText(badge, "evicted");
    const text = "the server evicted this reader while reading was paused: it fell behind";
    setText(this.dom.stateReason, text);
    this.dom.stateReason.title = text;
  }

  /** Reading resumes after such an eviction: say what comes first. */
  showResuming() {
    setText(this.dom.stateReason, "resuming: reading what the server sent before it evicted this reader");
  }

  /** Count down to the next attempt, `delayMs` from now, until the state changes. */
  scheduleNextAttempt(delayMs) {
    this.nextAttemptAt = Date.now() + delayMs;
    if (this.ticker === null) {
      this.ticker = setInterval(() => {
        this.renderNextAttempt();
        if (this.nextAttemptAt === null) {
          clearInterval(this.ticker);
          this.ticker = null;
        }
      }, 200);
    }
  }

  /** The last signal of its kind ("warning", "evicted", "resync", "error"), with its time. */
  showSignal(kind, envelope, text) {
    const target = lookup(
      {
        warning: this.dom.lastWarning,
        evicted: this.dom.lastEvicted,
        resync: this.dom.lastResync,
        error: this.dom.lastStreamError,
      },
      kind,
    );
    if (target === undefined) return;
    setText(target, `${formatTime(serverTime(envelope) ?? Date.now())} · ${text}`);
    target.classList.remove("muted");
    target.classList.add("signal-set");
  }

  /** @param {PanelView} view */
  render(view) {
    const { stream, state, paused, evictedWhilePaused } = view;
    const { dom } = this;
    const cursor = cursorText(stream !== null ? stream.lastEventId : "", view.viewCursor ?? null);
    setText(dom.cursor, cursor.text);
    dom.cursor.title = cursor.title;
    const epoch = stream !== null ? stream.epoch : null;
    setText(dom.epoch, epoch === null ? "—" : clip(epoch, 10));
    dom.epoch.title = epoch ?? "";
    // The 204 that ends a session answers a reconnect attempt: it is not counted as one.
    const attempts = stream !== null ? stream.reconnectCount : 0;
    setText(dom.reconnects, view.reconnectBase + (state === "ended" ? Math.max(0, attempts - 1) : attempts));
    setText(dom.retry, stream !== null ? `${stream.retryMs} ms` : "—");
    this.renderNextAttempt();
    const ended = state === "ended" || state === "stopped";
    let reading = paused ? "paused" : "reading";
    if (ended) reading = state === "ended" ? "ended (the session is closed)" : "stopped";
    else if (evictedWhilePaused) reading = "paused · evicted by the server";
    setText(dom.reading, reading);
    dom.reading.classList.toggle("text-warning", paused && !ended);
    dom.pausedChip.hidden = !paused || ended;
    setText(dom.pausedChip, evictedWhilePaused ? "paused · evicted" : "reading paused");
    setText(dom.maxQueuedCurrent, view.maxQueued === undefined ? `default (${view.maxQueuedDefault})` : view.maxQueued);
    setText(dom.frames, view.framesReceived);
    setText(dom.duplicates, view.duplicates);
    const terminal = state === "ended";
    dom.drop.disabled = !(state === "connecting" || state === "open");
    dom.pause.disabled = terminal;
    setText(dom.pause, paused ? "Resume reading" : "Pause reading");
    dom.pause.setAttribute("aria-pressed", String(paused));
    dom.demo.disabled = terminal || view.demoRunning || view.debugTools === false;
    for (const control of dom.maxQueuedForm.elements) control.disabled = terminal;
    this.renderSharing(stream);
  }

  renderNextAttempt() {
    if (this.nextAttemptAt === null) {
      setText(this.dom.nextAttempt, "—");
      return;
    }
    const left = Math.max(0, this.nextAttemptAt - Date.now());
    setText(this.dom.nextAttempt, `in ${(left / 1000).toFixed(1)} s`);
  }

  showBanner(kind, text) {
    const banner = this.dom.banner;
    banner.dataset.kind = kind;
    setText(banner, text);
    banner.hidden = false;
  }

  hideBanner() {
    this.dom.banner.hidden = true;
  }

  /**
   * Show a notice. It hides after a while, or, given `clearOn`, as soon as the stream
   * reaches one of those states (e.g. "Connection dropped" once it is open again).
   */
  notify(text, kind = "info", clearOn = null) {
    const notice = this.dom.notice;
    notice.dataset.kind = kind;
    setText(notice, text);
    notice.hidden = false;
    this.noticeClearOn = clearOn;
    clearTimeout(this.noticeTimer);
    // A notice tied to states stays until it stops being true; others fade after a while.
    if (clearOn === null) this.noticeTimer = setTimeout(() => this.hideNotice(), lookup(NOTICE_MS, kind) ?? NOTICE_MS.info);
  }

  hideNotice() {
    clearTimeout(this.noticeTimer);
    this.noticeClearOn = null;
    this.dom.notice.hidden = true;
  }
}
