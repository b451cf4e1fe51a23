/**
 * session_page.js — the live session page (`/sessions/<id>/`).
 *
 * One `SessionEventStream` (./sse.js, fetch + the hand-written parser) feeds three views:
 * the transcript rebuilt from `session_update` events, a log of frames (id, type, time;
 * synthetic frames marked) and a connection panel (state, cursor, reconnects, retry, the last
 * `slow_client_warning` / `client_evicted` / `state_resync_required` / `stream_error`).
 *
 * Flow
 *  1. A short-lived read token from `POST /session/<id>/token` (login session + CSRF
 *     header); on a 401, and after a `stream_error` with code `token_revoked` or
 *     `token_expired`, the stream asks again with reason "unauthorized" (SC-10) and
 *     resumes with its cursor.
 *  2. The snapshot `GET /session/<id>` is rendered, then the stream opens with the
 *     snapshot's `lastEventId` and `epoch` as its cursor (SC-9, EB-13, EB-17), so events
 *     published in between come as replay.
 *  3. Each event id is applied at most once and in order: an id at or below the view's cursor
 *     is a duplicate and skipped (replay after a drop, the snapshot/replay overlap).
 *  4. `state_resync_required` (SC-12): frames are held, the snapshot is loaded again, the
 *     transcript and the log are rebuilt from it (its `lastEventId` becomes the view's cursor)
 *     and the held frames are applied on top: no row twice, none missing.
 *  5. 204 → "session ended", and the client makes no more requests (SC-10, EB-15).
 *
 * Safety: text from events is only ever inserted with `textContent` / text nodes, never as
 * HTML. One stream per page (SC-13): a new one (maxQueued change) closes the old first, and
 * `pagehide` closes it so the server sees the disconnect (EB-20).
 *
 * Tabs: the tabs of one session share one stream (./shared_stream.js): one tab holds it and
 * posts every frame to the others; Drop, Pause reading and maxQueued give the tab a stream
 * of its own first (said on the page), the other tabs keep sharing. The snapshot is the
 * newest events only (`GET /session/<id>`, bounded); "Load earlier events" pages back with
 * `?before=`. A request without response headers after 5 s shows that the browser waits
 * for a free connection (./connection_wait.js).
 *
 * Tools below the grid: the publish console with its "Provoke backpressure" helper
 * (./publish_console.js; owner and staff) and, for staff, the live subscribers table
 * (./subscribers.js). The stream sends `X-Client-Id: page-<random>` so that both can tell
 * this page's own subscriber among the others.
 */
import { ConnectionWaitNotice, watchRequest } from "./connection_wait.js";
import { Follower, FrameLog, formatTime, h, setText } from "./frame_log.js";
import { PublishConsole } from "./publish_console.js";
import { SharedStream } from "./shared_stream.js";
import { SubscribersTable } from "./subscribers.js";

const SNAPSHOT_ATTEMPTS = 3;
const READER_POLL_MS = 1500;
const DEMO_POLL_MS = 3000;
const NOTICE_MS = { info: 6000, error: 12000 };
const DISCONNECT_REASONS = {
  operator_disconnect: "an operator disconnected this reader",
  server_shutdown: "the server is shutting down",
  epoch_reset: "the server's copy of the session was reset",
  mirror_gap: "the server's copy of the session fell behind",
};
const ROLE_LABELS = { agent: "Agent", user: "User", thought: "Thinking" };
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

// ---- small helpers ---------------------------------------------------------------------

// h, setText, formatTime: frame_log.js (one copy of the DOM helpers).

function formatBytes(bytes) {
  if (typeof bytes !== "number" || !Number.isFinite(bytes)) return "?";
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / (1024 * 1024)).toFixed(1)} MiB`;
}

function clip(text, length) {
  return text.length > length ? `${text.slice(0, length - 1)}…` : text;
}

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

function serverTime(envelope) {
  return isObject(envelope) && isObject(envelope._meta) ? envelope._meta.serverTimestamp : undefined;
}

/** The CSRF token: the `{% csrf_token %}` input, else the `csrftoken` cookie. */
function csrfToken() {
  const input = document.querySelector("input[name=csrfmiddlewaretoken]");
  if (input && input.value) return input.value;
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  return match ? decodeURIComponent(match[1]) : "";
}

class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** The server's words for a refusal (the JSON envelope's `error`), never its code. */
async function errorDetail(response) {
  try {
    const body = await response.json();
    if (isObject(body) && typeof body.error === "string") return body.error;
  } catch {
    // not JSON: the status says enough
  }
  return "";
}

const STATUS_WORDS = {
  400: "the request was refused",
  401: "not logged in",
  403: "not allowed",
  404: "unknown session",
  409: "not possible now",
  429: "too many requests",
};

/** A failed response in words: the server's message, else what its status means. */
async function failureText(response) {
  const detail = await errorDetail(response);
  if (detail) return detail;
  if (response.status >= 500) return `the server failed (HTTP ${response.status})`;
  return STATUS_WORDS[response.status] ?? `HTTP ${response.status}`;
}

/** The text of an ACP content block (`{type: "text", text}`), or a placeholder. */
function contentText(content) {
  if (isObject(content) && content.type === "text" && typeof content.text === "string") return content.text;
  if (isObject(content) && typeof content.type === "string") return `[${content.type}]`;
  return "";
}

/** The text of an ACP tool call's `content` list (content blocks, diffs, terminals). */
function toolContentText(items) {
  if (!Array.isArray(items)) return "";
  return items
    .map((item) => {
      if (!isObject(item)) return "";
      if (item.type === "content") return contentText(item.content);
      if (item.type === "diff") return `[diff ${typeof item.path === "string" ? item.path : ""}]`;
      return `[${String(item.type)}]`;
    })
    .filter(Boolean)
    .join("\n");
}

/** A one-line summary of an event for the frame log. */
function describeEvent(envelope, rawLength) {
  const data = envelope.data;
  let note;
  if (envelope.type === "session_update" && isObject(data)) {
    const text = contentText(data.content);
    note = String(data.sessionUpdate ?? "?");
    if (text) note += ` “${clip(text.replace(/\s+/g, " "), 40)}”`;
    else if (typeof data.status === "string") note += ` · ${data.status}`;
  } else {
    note = data === undefined ? "" : clip(JSON.stringify(data) ?? "", 60);
  }
  if (rawLength > 4096) note = `${formatBytes(rawLength)} · ${note}`;
  return note;
}

// ---- the transcript --------------------------------------------------------------------

/**
 * The agent's transcript from `session_update` events (ACP shapes): consecutive
 * `agent_message_chunk` texts are joined into one message, `user_message_chunk` into the
 * user's, and `tool_call` / `tool_call_update` are one card per `toolCallId` with its status.
 */
class Transcript {
  constructor(root, countElement) {
    this.root = root;
    this.countElement = countElement;
    this.placeholder = root.querySelector(".transcript-empty");
    this.follower = new Follower(root);
    this.clear();
  }

  clear() {
    this.root.replaceChildren(...(this.placeholder ? [this.placeholder] : []));
    this.current = null;
    this.tools = new Map();
    this.entries = 0;
    this.lastId = null;
    this._renderCount();
  }

  /** Render one envelope (`{id?, type, data}`); types without a transcript form are ignored. */
  apply(envelope) {
    const id = envelope.id ?? null;
    if (id !== null) this.lastId = id;
    const data = envelope.data;
    switch (envelope.type) {
      case "session_update":
        if (isObject(data)) this._sessionUpdate(data, id);
        break;
      case "turn_complete":
        this._marker(
          "turn",
          `Turn${isObject(data) && data.turn !== undefined ? ` ${data.turn}` : ""} complete${
            isObject(data) && typeof data.stopReason === "string" ? ` · ${data.stopReason}` : ""
          }`,
          id,
        );
        break;
      case "session_closed":
        this._marker(
          "closed",
          `Session closed${isObject(data) && data.closedBy ? ` by ${data.closedBy}` : ""}${
            isObject(data) && data.reason ? ` (${data.reason})` : ""
          }`,
          id,
        );
        break;
      case "history_truncated":
        this._marker(
          "truncated",
          `Earlier events are no longer kept by the server: history starts at #${
            isObject(data) ? data.earliestAvailableId : "?"
          }.`,
          null,
        );
        break;
      default:
        break; // shown in the frame log only
    }
    this._renderCount();
  }

  /** Add a note that is not an event (e.g. the session is closed). */
  note(kind, text) {
    this._marker(kind, text, null);
    this._renderCount();
  }

  _sessionUpdate(update, id) {
    switch (update.sessionUpdate) {
      case "agent_message_chunk":
        this._chunk("agent", update.content, id);
        break;
      case "user_message_chunk":
        this._chunk("user", update.content, id);
        break;
      case "agent_thought_chunk":
        this._chunk("thought", update.content, id);
        break;
      case "tool_call":
      case "tool_call_update":
        this._tool(update, id);
        break;
      default:
        break;
    }
  }

  _append(node) {
    if (this.placeholder && this.placeholder.isConnected) this.placeholder.remove();
    this.root.append(node);
    this.entries += 1;
    this.follower.kick();
  }

  _chunk(role, content, id) {
    let current = this.current;
    if (current === null || current.role !== role) {
      const block = h("article", `msg msg-${role}`);
      block.dataset.role = role;
      const head = h("header", "msg-head");
      const ids = h("span", "msg-ids mono");
      head.append(h("span", "msg-role", ROLE_LABELS[role]), ids);
      const body = h("div", "msg-text");
      const textNode = document.createTextNode("");
      body.append(textNode);
      block.append(head, body);
      this._append(block);
      current = { role, block, ids, textNode, firstId: id };
      this.current = current;
      if (id !== null) block.dataset.firstId = String(id);
    }
    current.textNode.appendData(contentText(content));
    this.follower.kick();
    if (id !== null) {
      current.block.dataset.lastId = String(id);
      current.ids.textContent = current.firstId === id ? `#${id}` : `#${current.firstId}–${id}`;
    }
  }

  _tool(update, id) {
    const callId = typeof update.toolCallId === "string" ? update.toolCallId : `event-${id}`;
    let card = this.tools.get(callId);
    if (card === undefined) {
      const element = h("article", "tool");
      element.dataset.toolCallId = callId;
      const head = h("header", "tool-head");
      const kind = h("span", "tool-kind", "tool");
      const title = h("span", "tool-title", callId);
      const status = h("span", "tool-status", "pending");
      status.dataset.status = "pending";
      head.append(kind, title, status);
      const output = h("pre", "tool-output");
      output.hidden = true;
      element.append(head, output);
      card = { element, kind, title, status, output };
      this.tools.set(callId, card);
      this.current = null; // text after a tool call is a new message
      this._append(element);
    }
    if (typeof update.title === "string" && update.title) card.title.textContent = update.title;
    if (typeof update.kind === "string" && update.kind) card.kind.textContent = update.kind;
    if (typeof update.status === "string" && update.status) {
      card.status.textContent = update.status.replace(/_/g, " ");
      card.status.dataset.status = update.status;
      card.element.dataset.status = update.status;
    }
    if (Array.isArray(update.content)) {
      const text = toolContentText(update.content);
      card.output.textContent = text;
      card.output.hidden = text === "";
    }
    if (id !== null) card.element.dataset.lastId = String(id);
  }

  _marker(kind, text, id) {
    const marker = h("div", `marker marker-${kind}`, text);
    if (id !== null) marker.dataset.id = String(id);
    this.current = null;
    this._append(marker);
  }

  _renderCount() {
    setText(this.countElement, this.lastId === null ? "" : `through #${this.lastId}`);
  }
}

// ---- tokens ----------------------------------------------------------------------------

/** Short-lived read tokens from `POST /session/<id>/token` (login session + CSRF). */
class TokenSource {
  constructor(url, onIssued) {
    this.url = url;
    this.onIssued = onIssued;
    this.token = null;
    this.pending = null;
    this.issued = 0;
  }

  /** The current token, or a new one when `fresh` (the last one was rejected) or none yet. */
  get(fresh) {
    if (!fresh && this.token !== null) return Promise.resolve(this.token);
    if (this.pending === null) {
      this.pending = this._request().finally(() => {
        this.pending = null;
      });
    }
    return this.pending;
  }

  async _request() {
    const response = await fetch(this.url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrfToken() },
      body: JSON.stringify({ scope: "read" }),
    });
    if (!response.ok) {
      throw new HttpError(response.status, `could not get a read token: ${await failureText(response)}`);
    }
    const body = await response.json();
    if (!isObject(body) || typeof body.token !== "string" || body.token === "") {
      throw new HttpError(response.status, "token response carried no token");
    }
    this.token = body.token;
    this.issued += 1;
    this.onIssued(this.issued);
    return this.token;
  }
}

// ---- the page --------------------------------------------------------------------------

class SessionPage {
  constructor(config, dom) {
    this.config = config;
    this.dom = dom;
    this.tokens = new TokenSource(config.urls.token, (count) => setText(dom.tokens, count));
    this.transcript = new Transcript(dom.transcript, dom.transcriptCount);
    this.log = new FrameLog(dom.logBody, dom.logCount, dom.logScroll);
    this.stream = null;
    this.state = "idle";
    this.cursor = null; // highest event id applied to the view
    this.resyncing = false;
    this.pending = [];
    this.resyncRunning = false;
    this.resyncAgain = false;
    this.lastRebuild = null;
    this.replaying = false;
    this.framesReceived = 0;
    this.duplicates = 0;
    this.reconnectBase = 0;
    this.paused = false;
    this.maxQueued = undefined;
    this.nextAttemptAt = null;
    this.ticker = null;
    this.noticeTimer = null;
    this.noticeClearOn = null;
    this.readerTimer = null;
    this.readerBusy = false;
    this.readerMisses = 0;
    this.evictedWhilePaused = false;
    this.demoRunning = Boolean(config.demoRunning);
    this.demoTimer = null;
    this.clientId = `page-${Math.random().toString(36).slice(2, 10)}`;
    this.signalListeners = [];
    this.waitNotice = new ConnectionWaitNotice(dom.banner);
    this.olderBefore = null; // `before=` of the next "load earlier" page, null when none
    this.earlier = null;
    this.sharing = null;
  }

  /** Load the snapshot, render it, open the stream from its cursor. Never throws. */
  async start() {
    this.bindControls();
    this.startTools();
    this.setDemoRunning(this.demoRunning);
    setText(this.dom.streamUrl, this.config.urls.events);
    this.addShareUi();
    // Join the other tabs before the snapshot, so no frame they share meanwhile is missed.
    this.openStream("", null, { start: false });
    let snapshot = null;
    try {
      snapshot = await this.loadSnapshot();
    } catch (error) {
      if (error instanceof HttpError && [401, 403, 404].includes(error.status)) {
        this.stream.close(); // leaves the other tabs; this page streams nothing
        this.showBanner("error", `Cannot read this session: ${error.message}`);
        this.setState("stopped", { reason: "token_error", detail: error.message });
        return;
      }
      this.notify(`Could not load the snapshot (${error.message}); streaming live only.`, "error");
    }
    if (snapshot !== null) this.rebuild(snapshot);
    this.openStream(snapshot !== null ? String(snapshot.lastEventId) : "", snapshot !== null ? snapshot.epoch : null);
  }

  // -- stream wiring --

  /**
   * Open the stream from the cursor: shared with the session's other tabs, or (`own`, as
   * with a maxQueued) this tab's own. `start: false` only joins the tabs (frames are held
   * until the next openStream starts it with the snapshot's cursor).
   */
  openStream(lastEventId, epoch, { own = false, start = true } = {}) {
    const prepared = this.stream;
    if (prepared !== null && !prepared.started && start && !own) {
      prepared.start({ lastEventId, epoch });
      this.renderPanel();
      return;
    }
    const previous = this.stream;
    this.stream = null; // callbacks of the old stream are ignored from here on
    if (previous !== null) {
      this.reconnectBase += previous.reconnectCount + (previous.started ? 1 : 0);
      previous.close();
    }
    const options = {
      url: this.config.urls.events,
      // The same X-Client-Id on every attempt: operators (and the backpressure helper) find
      // this page's subscriber by it. sse.js builds the Headers; they are only added to.
      fetch: (input, init) => {
        init.headers.set("X-Client-Id", this.clientId);
        return fetch(input, init);
      },
      getToken: (reason) => this.tokens.get(reason === "unauthorized"),
      onCallbackError: (error) => {
        console.error("session page:", error);
        this.notify(`Page error: ${error}`, "error");
      },
    };
    if (this.maxQueued !== undefined) options.maxQueued = this.maxQueued;
    const stream = new SharedStream({
      key: this.config.sessionId,
      own,
      streamOptions: options,
      lastEventId,
      epoch,
      onRoleChange: (role, info) => this.stream === stream && this.onRoleChange(role, info),
      onConnectionWait: (waiting) => this.stream === stream && this.waitNotice.set("stream", waiting),
      onEvent: (frame) => this.stream === stream && this.onFrame(frame),
      onStateChange: (state, info) => this.stream === stream && this.setState(state, info),
      onRetryScheduled: (delayMs) => this.stream === stream && this.onRetryScheduled(delayMs),
      onResyncRequired: () => this.stream === stream && this.resync(),
      onComment: () => this.stream === stream && setText(this.dom.heartbeat, formatTime(Date.now())),
    });
    this.stream = stream;
    if (this.paused) stream.pause();
    if (start) stream.start();
    else stream.listen();
    this.renderPanel();
  }

  /** The stream's sharing changed: show it; say so when a control detached this tab. */
  onRoleChange(role, info) {
    if (role === "own" && info.reason === "pause") {
      this.notify("Pause reading: this tab now reads a stream of its own; the other tabs of this session keep sharing theirs.");
    }
    this.renderSharing();
  }

  /** The "Sharing" line of the connection panel and the "load earlier" button (made here). */
  addShareUi() {
    const facts = this.dom.cursor.closest("dl");
    if (facts !== null) {
      const term = h("dt", "", "Sharing");
      this.sharing = h("dd", "", "—");
      this.sharing.id = "sharing";
      facts.append(term, this.sharing);
    }
    const button = h("button", "btn btn-small load-earlier", "Load earlier events");
    button.type = "button";
    button.id = "load-earlier";
    button.hidden = true;
    button.addEventListener("click", () => this.loadEarlier());
    this.dom.transcript.before(button);
    this.earlier = button;
  }

  renderSharing() {
    const stream = this.stream;
    if (this.sharing === null || stream === null) return;
    const how = stream.mode === "locks" ? "Web Locks" : stream.mode === "lease" ? "localStorage lease" : "";
    const text = {
      idle: "—",
      electing: "joining the other tabs of this session…",
      leader: `this tab holds the stream, shared with ${stream.tabs - 1} other tab(s) (${how})`,
      follower: `shared: another tab holds the stream (${how})`,
      own: "this tab's own stream (not shared)",
    }[stream.role];
    this.sharing.dataset.role = stream.role;
    setText(this.sharing, text ?? stream.role);
  }

  setState(state, info = {}) {
    this.state = state;
    this.evictedWhilePaused = false; // the stream speaks again: its state is the truth
    this.readerMisses = 0;
    if (this.noticeClearOn !== null && this.noticeClearOn.includes(state)) this.hideNotice();
    const badge = this.dom.badge;
    badge.dataset.state = state;
    setText(badge, state);
    const parts = [REASONS[info.reason] ?? info.reason ?? ""];
    if (state === "open") parts[0] = `streaming since ${formatTime(Date.now())}`;
    else if (info.status) parts.push(`HTTP ${info.status}`);
    if (info.detail) parts.push(String(info.detail));
    const reason = parts.filter(Boolean).join(" · ");
    setText(this.dom.stateReason, reason);
    this.dom.stateReason.title = reason;
    if (state === "open") {
      // A response to a request that carried a cursor starts with replay (EB-7).
      this.replaying = this.stream !== null && this.stream.lastEventId !== "";
      this.hideBanner();
    }
    if (state !== "reconnecting") this.nextAttemptAt = null;
    if (state === "ended") {
      this.showBanner(
        "ended",
        "Session ended. The server answered 204 No Content: the session is closed, and this page makes no more requests.",
      );
    } else if (state === "stopped" && info.reason !== "closed") {
      this.showBanner("error", `Stream stopped: ${reason}. Use Reconnect to try again.`);
    }
    this.renderPanel();
  }

  onRetryScheduled(delayMs) {
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
    this.renderPanel();
  }

  onFrame(frame) {
    this.framesReceived += 1;
    if (frame.type === "state_resync_required") {
      this.resyncing = true; // hold every frame until the view is rebuilt (SC-12)
      this.showSignal("resync", frame.json, "loading the snapshot…");
    }
    if (this.resyncing) {
      this.pending.push(frame);
    } else {
      this.handleFrame(frame);
    }
    this.renderPanel();
  }

  /** Apply one frame to the view: events once each and in order, synthetic frames as signals. */
  handleFrame(frame) {
    const envelope = frame.json;
    if (frame.id === null) {
      this.handleSynthetic(frame.type, isObject(envelope) ? envelope : null, frame.data);
      return;
    }
    const id = Number(frame.id);
    if (!Number.isSafeInteger(id) || !isObject(envelope)) {
      this.log.add({ id: frame.id, type: frame.type, note: `unparsed: ${clip(frame.data, 80)}`, source: "live" });
      return;
    }
    if (this.cursor !== null && id <= this.cursor) {
      this.duplicates += 1; // already shown: replay after a reconnect, or in the snapshot
      return;
    }
    if (this.cursor !== null && id !== this.cursor + 1) {
      this.log.add({ kind: "local", type: "gap", timeMs: Date.now(), note: `expected #${this.cursor + 1}, got #${id}` });
    }
    this.cursor = id;
    this.transcript.apply(envelope);
    this.log.add({
      id,
      type: frame.type,
      timeMs: serverTime(envelope),
      source: this.replaying ? "replay" : "live",
      note: describeEvent(envelope, frame.data.length),
    });
  }

  handleSynthetic(type, envelope, raw) {
    const data = envelope !== null && isObject(envelope.data) ? envelope.data : {};
    const timeMs = serverTime(envelope) ?? Date.now();
    let note;
    switch (type) {
      case "replay_complete":
        this.replaying = false;
        note = `${data.replayedCount ?? 0} replayed${
          data.lastReplayedEventId !== undefined ? ` up to #${data.lastReplayedEventId}` : ""
        }; live from here`;
        break;
      case "slow_client_warning":
        note = `queue ${data.queueSize}/${data.maxQueued} frames, ${formatBytes(data.queuedBytes)} of ${formatBytes(
          data.maxQueuedBytes,
        )} at #${data.lastEventId} (${data.threshold})`;
        this.showSignal("warning", envelope, note);
        this.emitSignal(type, data);
        break;
      case "client_evicted":
        note = `${data.reason} after #${data.droppedAfter} · queue ${data.queueSize}/${data.maxQueued}; reconnecting with the cursor`;
        this.showSignal("evicted", envelope, note);
        this.emitSignal(type, data);
        break;
      case "state_resync_required": {
        const rebuilt =
          this.lastRebuild !== null
            ? ` → view rebuilt from the snapshot (${this.lastRebuild.count} events up to #${this.lastRebuild.lastEventId})`
            : "";
        note = `${data.reason}${data.detail ? ` (${data.detail})` : ""}: delivered #${data.lastDeliveredId}, earliest kept #${
          data.earliestAvailableId
        }${rebuilt}`;
        this.showSignal("resync", envelope, note);
        break;
      }
      case "stream_error": {
        note = `${data.error ?? "error"}${data.code ? ` (${data.code}${data.reason ? `: ${data.reason}` : ""})` : ""}; reconnecting`;
        const why = DISCONNECT_REASONS[data.reason] ?? (typeof data.reason === "string" ? data.reason.replace(/_/g, " ") : "");
        const code = [data.code, data.reason].filter((part) => typeof part === "string").join(": ");
        this.showSignal(
          "error",
          envelope,
          `${data.error ?? "the server ended the stream"}${why ? `: ${why}` : ""}${code ? ` (${code})` : ""}; reconnecting`,
        );
        break;
      }
      default:
        note = clip(raw, 160); // unknown types are shown raw, never fatal (SC-12)
        break;
    }
    this.log.add({ kind: "synthetic", type, timeMs, note, source: this.replaying ? "replay" : "" });
  }

  showSignal(kind, envelope, text) {
    const target = {
      warning: this.dom.lastWarning,
      evicted: this.dom.lastEvicted,
      resync: this.dom.lastResync,
      error: this.dom.lastStreamError,
    }[kind];
    setText(target, `${formatTime(serverTime(envelope) ?? Date.now())} · ${text}`);
    target.classList.remove("muted");
    target.classList.add("signal-set");
  }

  // -- snapshot and resync --

  /** `GET /session/<id>` (the newest events; `query` e.g. "?before=120" pages back). */
  async loadSnapshot(query = "") {
    const url = `${this.config.urls.load}${query}`;
    const get = (token) =>
      watchRequest(
        fetch(url, { headers: { Authorization: `Bearer ${token}`, Accept: "application/json" }, credentials: "omit" }),
        (waiting) => this.waitNotice.set("snapshot", waiting),
      );
    let response = await get(await this.tokens.get(false));
    if (response.status === 401) response = await get(await this.tokens.get(true));
    if (!response.ok) throw new HttpError(response.status, `GET ${url}: HTTP ${response.status} ${await errorDetail(response)}`);
    const snapshot = await response.json();
    if (!isObject(snapshot) || !Array.isArray(snapshot.events)) throw new HttpError(200, "the snapshot is malformed");
    return snapshot;
  }

  /** Replace the transcript and the log with the snapshot; its lastEventId becomes the cursor. */
  rebuild(snapshot) {
    this.transcript.clear();
    this.log.clear();
    let count = 0;
    for (const envelope of snapshot.events) {
      if (!isObject(envelope)) continue;
      this.transcript.apply(envelope);
      if (envelope.id === undefined || envelope.id === null) {
        const data = isObject(envelope.data) ? envelope.data : {};
        this.log.add({
          kind: "synthetic",
          type: String(envelope.type),
          source: "snapshot",
          note: envelope.type === "history_truncated" ? `events before #${data.earliestAvailableId} are gone` : "",
        });
      } else {
        count += 1;
        this.log.add({
          id: envelope.id,
          type: String(envelope.type),
          timeMs: serverTime(envelope),
          source: "snapshot",
          note: describeEvent(envelope, 0),
        });
      }
    }
    if (Number.isSafeInteger(snapshot.lastEventId)) this.cursor = snapshot.lastEventId;
    if (snapshot.status === "closed") this.transcript.note("closed", "This session is closed.");
    this.lastRebuild = { lastEventId: this.cursor, count };
    this.setOlder(snapshot);
  }

  /** SC-12: reload the snapshot, rebuild the view, then apply the frames held meanwhile. */
  async resync() {
    if (this.resyncRunning) {
      this.resyncAgain = true;
      return;
    }
    this.resyncRunning = true;
    let failure = null;
    try {
      do {
        this.resyncAgain = false;
        failure = null;
        for (let attempt = 1; attempt <= SNAPSHOT_ATTEMPTS; attempt += 1) {
          try {
            this.rebuild(await this.loadSnapshot());
            break;
          } catch (error) {
            failure = error;
            if (error instanceof HttpError && [403, 404].includes(error.status)) break;
            if (attempt < SNAPSHOT_ATTEMPTS) await new Promise((resolve) => setTimeout(resolve, 500 * attempt));
          }
        }
      } while (this.resyncAgain);
    } finally {
      this.resyncRunning = false;
    }
    if (failure !== null) {
      this.notify(`Resync failed: ${failure.message}. The view may miss events.`, "error");
      this.log.add({ kind: "local", type: "resync failed", timeMs: Date.now(), note: failure.message });
    }
    const held = this.pending;
    this.pending = [];
    this.resyncing = false;
    for (const frame of held) this.handleFrame(frame);
    this.renderPanel();
  }

  /** Remember where "load earlier" continues (`firstEventId` while `hasOlder`). */
  setOlder(snapshot) {
    this.olderBefore = snapshot.hasOlder && Number.isSafeInteger(snapshot.firstEventId) ? snapshot.firstEventId : null;
    if (this.earlier !== null) {
      this.earlier.hidden = this.olderBefore === null;
      this.earlier.disabled = false;
    }
  }

  /** Draw the page of events before the first one shown above the transcript. */
  async loadEarlier() {
    const before = this.olderBefore;
    if (before === null) return;
    this.earlier.disabled = true;
    let page;
    try {
      page = await this.loadSnapshot(`?before=${before}`);
    } catch (error) {
      this.notify(`Could not load earlier events: ${error.message}`, "error");
      this.earlier.disabled = false;
      return;
    }
    if (this.olderBefore !== before) return; // a resync rebuilt the view meanwhile
    const holder = document.createElement("div");
    const older = new Transcript(holder, document.createElement("span"));
    for (const envelope of page.events) if (isObject(envelope)) older.apply(envelope);
    const root = this.transcript.root;
    const placeholder = this.transcript.placeholder;
    if (placeholder && placeholder.isConnected && holder.childNodes.length > 0) placeholder.remove();
    root.prepend(...holder.childNodes);
    const ids = page.events.filter((e) => isObject(e) && Number.isSafeInteger(e.id)).map((e) => e.id);
    this.log.add({
      kind: "local",
      type: "earlier events",
      timeMs: Date.now(),
      note: ids.length ? `${ids.length} earlier events drawn above (#${ids[0]}–#${ids.at(-1)})` : "no earlier events",
    });
    this.setOlder({ ...page, hasOlder: page.hasOlder && ids.length > 0 });
  }

  // -- controls --

  bindControls() {
    const { drop, pause, demo, maxQueuedForm } = this.dom;
    drop.addEventListener("click", () => {
      if (this.stream === null) return;
      const shared = this.stream.role !== "own";
      this.stream.drop();
      this.notify(
        `Connection dropped; the client reconnects with Last-Event-ID after the retry delay.${
          shared ? " This tab now reads a stream of its own; the other tabs of this session keep sharing theirs." : ""
        }`,
        "info",
        ["open", "ended", "stopped"],
      );
    });
    pause.addEventListener("click", () => this.togglePause());
    demo.addEventListener("click", () => this.startDemo());
    maxQueuedForm.addEventListener("submit", (event) => {
      event.preventDefault();
      this.applyMaxQueued();
    });
    window.addEventListener("pagehide", () => {
      if (this.stream !== null) this.stream.close();
    });
  }

  /** Tell `callback(type, data)` about each `slow_client_warning` / `client_evicted` shown. */
  onSignal(callback) {
    this.signalListeners.push(callback);
  }

  emitSignal(type, data) {
    for (const callback of this.signalListeners) {
      try {
        callback(type, data);
      } catch (error) {
        console.error("session page:", error);
      }
    }
  }

  setPaused(paused) {
    if (this.paused !== paused) this.togglePause();
  }

  /** The publish console (owner and staff) and, for staff, the live subscribers table. */
  startTools() {
    const { urls } = this.config;
    const page = {
      isPaused: () => this.paused,
      setPaused: (paused) => this.setPaused(paused),
      clientId: this.clientId,
      maxQueued: () => this.maxQueued ?? this.config.maxQueued.default,
      maxQueuedBytes: this.config.maxQueuedBytes,
      onSignal: (callback) => this.onSignal(callback),
    };
    const { dom } = this;
    new PublishConsole({
      dom: {
        form: dom.publishForm,
        type: dom.publishType,
        data: dom.publishData,
        result: dom.publishResult,
        provoke: dom.provoke,
        stop: dom.provokeStop,
        provokeStatus: dom.provokeStatus,
      },
      urls: { token: urls.token, events: urls.publish, subscribers: urls.subscribers },
      page,
    }).bind();
    const root = document.getElementById("subscribers");
    if (urls.subscribers && root !== null) {
      this.subscribers = new SubscribersTable({
        root,
        listUrl: urls.subscribers,
        disconnectUrl: (id) => urls.disconnect.replace(this.config.subscriberPlaceholder, encodeURIComponent(id)),
        ownClientId: this.clientId,
      });
      this.subscribers.start();
    }
  }

  togglePause() {
    this.paused = !this.paused;
    if (!this.paused && this.evictedWhilePaused) {
      setText(this.dom.stateReason, "resuming: reading what the server sent before it evicted this reader");
    }
    if (this.stream !== null) {
      if (this.paused) this.stream.pause();
      else this.stream.resume();
    }
    this.renderPanel();
  }

  applyMaxQueued() {
    if (this.state === "ended") return;
    const raw = this.dom.maxQueued.value.trim();
    const { min, max } = this.config.maxQueued;
    if (raw === "") {
      this.maxQueued = undefined;
    } else {
      const value = Number(raw);
      if (!Number.isInteger(value) || value < min || value > max) {
        this.notify(`maxQueued must be an integer in [${min}, ${max}] (EB-14).`, "error");
        return;
      }
      this.maxQueued = value;
    }
    const cursor = this.stream !== null ? this.stream.lastEventId : "";
    const epoch = this.stream !== null ? this.stream.epoch : null;
    // A maxQueued of this tab's is a stream of its own; the default shares again.
    this.openStream(cursor, epoch, { own: this.maxQueued !== undefined });
    this.notify(
      this.maxQueued === undefined
        ? "Reconnecting with the default maxQueued, shared with the other tabs of this session."
        : `Reconnecting with ?maxQueued=${this.maxQueued}: this tab now reads a stream of its own; the other tabs of this session keep sharing theirs.`,
      "info",
      ["open", "ended", "stopped"],
    );
  }

  async startDemo() {
    const button = this.dom.demo;
    button.disabled = true;
    try {
      const response = await fetch(this.config.urls.demo, {
        method: "POST",
        credentials: "same-origin",
        headers: { Accept: "application/json", "X-CSRFToken": csrfToken() },
      });
      if (response.status === 202) {
        this.notify(`Demo agent started: about ${this.config.demoChunksPerS} chunks per second.`);
        this.setDemoRunning(true);
        return;
      }
      const body = await response.clone().json().catch(() => ({}));
      if (isObject(body) && body.code === "demo_running") {
        this.notify("A demo agent is already running in this session.");
        this.setDemoRunning(true);
        return;
      }
      this.notify(`Could not start the demo agent: ${await failureText(response)}.`, "error");
    } catch (error) {
      this.notify(`Could not start the demo agent: the server did not answer (${error.message ?? error}).`, "error");
    } finally {
      this.renderPanel();
    }
  }

  /** The Start button says whether an agent runs; while one does, ask every 3 s until it ends. */
  setDemoRunning(running) {
    this.demoRunning = running;
    setText(this.dom.demo, running ? "Demo agent running" : "Start demo agent");
    this.dom.demo.title = running
      ? "The scripted demo agent is publishing into this session (one at a time)"
      : "Play the scripted demo agent into this session";
    if (running && this.demoTimer === null) {
      this.demoTimer = setInterval(() => this.checkDemo(), DEMO_POLL_MS);
    } else if (!running && this.demoTimer !== null) {
      clearInterval(this.demoTimer);
      this.demoTimer = null;
    }
    this.renderPanel();
  }

  async checkDemo() {
    if (document.hidden) return;
    try {
      const response = await fetch(this.config.urls.demo, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) return;
      const body = await response.json();
      if (isObject(body) && body.running === false) this.setDemoRunning(false);
    } catch {
      // the next tick asks again
    }
  }

  // -- a paused reader the server evicted --

  /**
   * While reading is paused the page does not read the body, so it would never see the
   * server's `client_evicted` nor the stream's end. Ask `GET /session/<id>/readers/<client
   * id>` every 1.5 s instead; two answers in a row without this page's reader (one could
   * race a report of another process) mean the server evicted it.
   */
  updateReaderPoll() {
    const wanted =
      this.paused && this.state === "open" && this.stream !== null && !this.evictedWhilePaused && Boolean(this.config.urls.reader);
    if (wanted && this.readerTimer === null) {
      this.readerMisses = 0;
      this.readerTimer = setInterval(() => this.checkReader(), READER_POLL_MS);
    } else if (!wanted && this.readerTimer !== null) {
      clearInterval(this.readerTimer);
      this.readerTimer = null;
    }
  }

  async checkReader() {
    if (this.readerBusy) return;
    this.readerBusy = true;
    try {
      const url = this.config.urls.reader.replace(this.config.subscriberPlaceholder, encodeURIComponent(this.clientId));
      const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) return; // a failed question says nothing about the reader
      const body = await response.json();
      if (!(this.paused && this.state === "open") || !isObject(body)) return;
      this.readerMisses = body.connected === false ? this.readerMisses + 1 : 0;
      if (this.readerMisses >= 2) this.showEvictedWhilePaused();
    } catch {
      // the next tick asks again
    } finally {
      this.readerBusy = false;
    }
  }

  showEvictedWhilePaused() {
    this.evictedWhilePaused = true;
    const badge = this.dom.badge;
    badge.dataset.state = "evicted";
    setText(badge, "evicted");
    const text = "the server evicted this reader while reading was paused: it fell behind";
    setText(this.dom.stateReason, text);
    this.dom.stateReason.title = text;
    this.log.add({ kind: "local", type: "evicted while paused", timeMs: Date.now(), note: "the server no longer lists this page's reader" });
    this.notify(
      "The server evicted this page's reader while reading was paused (its queue was full). Resume reading to catch up: the page reads what was sent, then reconnects with its cursor.",
      "error",
      ["reconnecting", "stopped", "ended"],
    );
    this.renderPanel();
  }

  // -- rendering --

  renderPanel() {
    const stream = this.stream;
    const { dom } = this;
    const cursor = stream !== null ? stream.lastEventId : "";
    setText(dom.cursor, cursor === "" ? "—" : cursor);
    const epoch = stream !== null ? stream.epoch : null;
    setText(dom.epoch, epoch === null ? "—" : clip(epoch, 10));
    dom.epoch.title = epoch ?? "";
    // The 204 that ends a session answers a reconnect attempt: it is not counted as one.
    const attempts = stream !== null ? stream.reconnectCount : 0;
    setText(dom.reconnects, this.reconnectBase + (this.state === "ended" ? Math.max(0, attempts - 1) : attempts));
    setText(dom.retry, stream !== null ? `${stream.retryMs} ms` : "—");
    this.renderNextAttempt();
    const ended = this.state === "ended" || this.state === "stopped";
    let reading = this.paused ? "paused" : "reading";
    if (ended) reading = this.state === "ended" ? "ended (the session is closed)" : "stopped";
    else if (this.evictedWhilePaused) reading = "paused · evicted by the server";
    setText(dom.reading, reading);
    dom.reading.classList.toggle("text-warning", this.paused && !ended);
    dom.pausedChip.hidden = !this.paused || ended;
    setText(dom.pausedChip, this.evictedWhilePaused ? "paused · evicted" : "reading paused");
    setText(dom.maxQueuedCurrent, this.maxQueued === undefined ? `default (${this.config.maxQueued.default})` : this.maxQueued);
    setText(dom.frames, this.framesReceived);
    setText(dom.duplicates, this.duplicates);
    const terminal = this.state === "ended";
    dom.drop.disabled = !(this.state === "connecting" || this.state === "open");
    dom.pause.disabled = terminal;
    setText(dom.pause, this.paused ? "Resume reading" : "Pause reading");
    dom.pause.setAttribute("aria-pressed", String(this.paused));
    dom.demo.disabled = terminal || this.demoRunning;
    for (const control of dom.maxQueuedForm.elements) control.disabled = terminal;
    this.renderSharing();
    this.updateReaderPoll();
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
    if (clearOn === null) this.noticeTimer = setTimeout(() => this.hideNotice(), NOTICE_MS[kind] ?? NOTICE_MS.info);
  }

  hideNotice() {
    clearTimeout(this.noticeTimer);
    this.noticeClearOn = null;
    this.dom.notice.hidden = true;
  }
}

function collectDom() {
  const byId = (id) => {
    const element = document.getElementById(id);
    if (element === null) throw new Error(`session page: #${id} is missing`);
    return element;
  };
  return {
    badge: byId("state-badge"),
    stateReason: byId("state-reason"),
    pausedChip: byId("paused-chip"),
    banner: byId("banner"),
    notice: byId("notice"),
    transcript: byId("transcript"),
    transcriptCount: byId("transcript-count"),
    logBody: byId("frame-log").tBodies[0],
    logCount: byId("log-count"),
    logScroll: byId("log-scroll"),
    streamUrl: byId("stream-url"),
    cursor: byId("cursor"),
    epoch: byId("epoch"),
    reconnects: byId("reconnects"),
    retry: byId("retry"),
    nextAttempt: byId("next-attempt"),
    reading: byId("reading"),
    maxQueuedCurrent: byId("max-queued-current"),
    frames: byId("frames"),
    duplicates: byId("duplicates"),
    tokens: byId("tokens"),
    heartbeat: byId("heartbeat"),
    lastWarning: byId("last-warning"),
    lastEvicted: byId("last-evicted"),
    lastResync: byId("last-resync"),
    lastStreamError: byId("last-stream-error"),
    drop: byId("drop"),
    pause: byId("pause"),
    demo: byId("demo"),
    maxQueuedForm: byId("max-queued-form"),
    maxQueued: byId("max-queued"),
    publishForm: byId("publish-form"),
    publishType: byId("publish-type"),
    publishData: byId("publish-data"),
    publishResult: byId("publish-result"),
    provoke: byId("provoke"),
    provokeStop: byId("provoke-stop"),
    provokeStatus: byId("provoke-status"),
  };
}

const config = JSON.parse(document.getElementById("session-config").textContent);
new SessionPage(config, collectDom()).start();
