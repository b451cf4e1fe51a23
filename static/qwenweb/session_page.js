/**
 * session_page.js — the live session page (`/sessions/<id>/`): its wiring.
 *
 * One `SessionEventStream` (./sse.js, fetch + the hand-written parser) feeds three views:
 * the transcript rebuilt from `session_update` events (./transcript.js), a log of frames
 * (id, type, time; synthetic frames marked; ./frame_log.js) and a connection panel (state,
 * cursor, reconnects, retry, the last `slow_client_warning` / `client_evicted` /
 * `state_resync_required` / `stream_error`; ./session_status.js). This module makes the
 * pieces, opens the stream and applies its frames; each piece has a module of its own.
 *
 * Flow
 *  1. A short-lived read token from `POST /session/<id>/token` (login session + CSRF
 *     header; ./session_requests.js); on a 401, and after a `stream_error` with code
 *     `token_revoked` or `token_expired`, the stream asks again with reason "unauthorized"
 *     (SC-10) and resumes with its cursor.
 *  2. The snapshot `GET /session/<id>` is rendered (./session_snapshot.js), then the stream
 *     opens with the snapshot's `lastEventId` and `epoch` as its cursor (SC-9, EB-13,
 *     EB-17), so events published in between come as replay.
 *  3. Each event id is applied at most once and in order: an id at or below the view's cursor
 *     is a duplicate and skipped (replay after a drop, the snapshot/replay overlap). An id
 *     above the next one is a gap: the range is fetched from the snapshot, raw, while the
 *     frames after it are held (SC-14, ./gap_repair.js).
 *  4. `state_resync_required` (SC-12): frames are held, the snapshot is loaded again
 *     (compacted: a run of token events is one frame `a–b`), the view continues from it
 *     (its `lastEventId` becomes the view's cursor) and the held frames are applied on
 *     top: no row twice, none missing (./session_snapshot.js).
 *  5. 204 → "session ended", and the client makes no more requests (SC-10, EB-15).
 *
 * Safety: text from events is only ever inserted with `textContent` / text nodes, never as
 * HTML. One stream per page (SC-13): a new one (maxQueued change) closes the old first, and
 * `pagehide` closes it so the server sees the disconnect (EB-20).
 *
 * Tabs: the tabs of one session share one stream (./shared_stream.js): one tab holds it and
 * posts every frame to the others; Drop, Pause reading and maxQueued give the tab a stream
 * of its own first (said on the page), the other tabs keep sharing; after a Drop or a
 * Pause/Resume it shares again once its stream caught up. The snapshot is the
 * newest events only (`GET /session/<id>`, bounded); "Load earlier events" pages back with
 * `?before=`. A request without response headers after 5 s shows that the browser waits
 * for a free connection (./connection_wait.js). While reading is paused, the page asks the
 * server whether it still holds this page's reader (./paused_reader.js).
 *
 * Controls: Drop, Pause reading and maxQueued are wired here. Below the grid, the debug
 * tools under their own heading, off once the session has ended: "Start demo agent"
 * (./demo_control.js), the publish console with its "Provoke backpressure" helper
 * (./publish_console.js; owner and staff); and, for staff, the live subscribers table
 * (./subscribers.js). The transcript has a search (./transcript_search.js); a frame's JSON
 * opens in a dialog (./event_json.js); `#e<id>` links show an event (./event_links.js).
 * The stream sends `X-Client-Id: page-<random>` so that both can tell this page's own
 * subscriber among the others. `?transport=ws` runs it over the WebSocket instead
 * (./stream_transport.js; no X-Client-Id there, so the paused-reader check is off).
 */
import { ConnectionWaitNotice } from "./connection_wait.js";
import { DemoControl } from "./demo_control.js";
import { EventJsonDialog } from "./event_json.js";
import { EventLinks } from "./event_links.js";
import { clip, describeEvent, isObject, serverTime, streamErrorText } from "./envelopes.js";
import { FrameLog, formatTime, setText } from "./frame_log.js";
import { GapRepair } from "./gap_repair.js";
import { PausedReaderWatch } from "./paused_reader.js";
import { PublishConsole } from "./publish_console.js";
import { HttpError, TokenSource, fetchSnapshot } from "./session_requests.js";
import { SnapshotSync, snapshotQuery } from "./session_snapshot.js";
import { StatusPanel, othersAfterDetach } from "./session_status.js";
import { SharedStream } from "./shared_stream.js";
import { SubscribersTable, formatBytes } from "./subscribers.js";
import { Transcript } from "./transcript.js";
import { StreamTransport } from "./stream_transport.js";
import { TranscriptSearch } from "./transcript_search.js";

class SessionPage {
  constructor(config, dom) {
    this.config = config;
    this.dom = dom;
    this.tokens = new TokenSource(config.urls.token, (count) => setText(dom.tokens, count));
    this.transcript = new Transcript(dom.transcript, dom.transcriptCount);
    this.log = new FrameLog(dom.logBody, dom.logCount, dom.logScroll);
    this.panel = new StatusPanel(dom);
    this.stream = null;
    this.state = "idle";
    this.cursor = null; // highest event id applied to the view
    this.replaying = false;
    this.framesReceived = 0;
    this.duplicates = 0;
    this.reconnectBase = 0;
    this.paused = false;
    this.maxQueued = undefined;
    this.evictedWhilePaused = false;
    this.debugTools = true;
    this.clientId = `page-${Math.random().toString(36).slice(2, 10)}`;
    // SSE, or the multiplexed WebSocket with `?transport=ws` (./stream_transport.js).
    const onCallbackError = (error) => this.onStreamCallbackError(error);
    this.transport = new StreamTransport({ config, tokens: this.tokens, clientId: this.clientId, onCallbackError });
    this.signalListeners = [];
    this.waitNotice = new ConnectionWaitNotice(dom.banner);
    this.snapshots = new SnapshotSync({
      load: (query) => this.loadSnapshot(query),
      transcript: this.transcript,
      log: this.log,
      cursor: () => this.cursor,
      setCursor: (id) => {
        this.cursor = id;
      },
      apply: (frame) => this.handleFrame(frame),
      markLost: (span) => this.showLost(span),
      adoptCursor: (snapshot) => this.adoptCursor(snapshot),
      notify: (text, kind) => this.panel.notify(text, kind),
      render: () => this.renderPanel(),
    });
    this.gaps = new GapRepair({
      load: (query) => this.loadSnapshot(query),
      applyEvent: (envelope) => this.applyEvent(envelope, JSON.stringify(envelope).length, "repair"),
      applyLost: (span) => this.showLost(span),
      applyFrame: (frame) => this.handleFrame(frame),
      resync: (held, why) => this.resyncAfterGap(held, why),
      epoch: () => (this.stream !== null ? this.stream.epoch : null),
    });
    this.readerWatch = new PausedReaderWatch({
      // The server knows a WebSocket reader by no X-Client-Id: nothing to ask about it.
      url: config.urls.reader && !this.transport.overWebSocket
        ? config.urls.reader.replace(config.subscriberPlaceholder, encodeURIComponent(this.clientId))
        : null,
      stillPaused: () => this.paused && this.state === "open",
      onEvicted: () => this.showEvictedWhilePaused(),
    });
    this.demo = new DemoControl({
      button: dom.demo,
      url: config.urls.demo,
      chunksPerS: config.demoChunksPerS,
      running: Boolean(config.demoRunning),
      notify: (text, kind) => this.panel.notify(text, kind),
      onChange: () => this.renderPanel(),
    });
    this.links = new EventLinks({ log: this.log, transcript: this.transcript, notify: (text, kind) => this.panel.notify(text, kind) });
    this.json = new EventJsonDialog(dom.eventJson);
  }

  /** Load the snapshot, render it, open the stream from its cursor. Never throws. */
  async start() {
    this.bindControls();
    this.bindViews();
    this.startTools();
    this.demo.setRunning(this.demo.running);
    setText(this.dom.streamUrl, this.transport.displayUrl);
    this.panel.addSharing();
    this.panel.addTransport(this.transport.overWebSocket);
    this.snapshots.addEarlierButton(this.dom.transcript);
    // Join the other tabs before the snapshot, so no frame they share meanwhile is missed.
    this.openStream("", null, { start: false });
    let snapshot = null;
    try {
      snapshot = await this.loadSnapshot(snapshotQuery("", { initial: true }));
    } catch (error) {
      if (error instanceof HttpError && [401, 403, 404].includes(error.status)) {
        this.stream.close(); // leaves the other tabs; this page streams nothing
        this.panel.showBanner("error", `Cannot read this session: ${error.message}`);
        this.setState("stopped", { reason: "token_error", detail: error.message });
        return;
      }
      this.panel.notify(`Could not load the snapshot (${error.message}); streaming live only.`, "error");
    }
    if (snapshot !== null) this.snapshots.rebuild(snapshot);
    this.transcript.setLoaded();
    if (snapshot !== null && snapshot.status === "closed") this.setDebugTools(false);
    this.links.showFromUrl();
    this.openStream(snapshot !== null ? snapshotCursor(snapshot) : "", snapshot !== null ? snapshot.epoch : null);
  }

  /** The transcript's search, the `#e<id>` links, the JSON of frames and transcript blocks. */
  bindViews() {
    const { dom } = this;
    new TranscriptSearch({
      root: dom.transcript,
      form: dom.searchForm,
      input: dom.searchInput,
      previous: dom.searchPrevious,
      count: dom.searchCount,
      follower: this.transcript.follower,
    }).bind();
    this.links.bind();
    this.log.onOpen = (row, json) => {
      const id = row.dataset.id;
      const title = id !== undefined ? `Event #${id} · ${row.dataset.type}` : `${row.dataset.type} (synthetic frame)`;
      this.json.show(title, json !== null ? json : this.fetchEvent(Number(id)));
    };
    dom.transcript.addEventListener("click", (event) => {
      const button = event.target.closest("button.btn-json");
      const block = button !== null ? button.closest(".msg, .tool, .marker") : null;
      if (block === null) return;
      const events = this.transcript.eventsOf(block);
      const ids = block.querySelector(".msg-ids, .event-link");
      this.json.show(`${events.length === 1 ? "Event" : `${events.length} events`} ${ids !== null ? ids.textContent : ""}`, events.length === 1 ? events[0] : events);
    });
  }

  /** Event `id` as the server holds it (`GET /session/<id>?limit=1&before=<id + 1>`, raw). */
  async fetchEvent(id) {
    const snapshot = await this.loadSnapshot(`?limit=1&before=${id + 1}`);
    const event = snapshot.events.find((entry) => isObject(entry) && entry.id === id);
    if (event === undefined) throw new Error(`the server no longer holds event #${id}`);
    return event;
  }

  /** The debug tools work while the session is live, and are off once it has ended. */
  setDebugTools(enabled) {
    this.debugTools = enabled;
    this.dom.debugEnded.hidden = enabled;
    this.publishConsole.setEnabled(enabled);
    this.renderPanel();
  }

  /** `GET /session/<id>` (the newest events; `query` e.g. "?before=120" pages back). */
  loadSnapshot(query = "") {
    return fetchSnapshot(`${this.config.urls.load}${query}`, this.tokens, (waiting) =>
      this.waitNotice.set("snapshot", waiting),
    );
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
    const options = this.transport.options();
    if (this.maxQueued !== undefined) options.maxQueued = this.maxQueued;
    const stream = new SharedStream({
      key: this.transport.shareKey,
      StreamClass: this.transport.StreamClass,
      own,
      streamOptions: options,
      lastEventId,
      epoch,
      onRoleChange: (role, info) => this.stream === stream && this.onRoleChange(role, info),
      onConnectionWait: (waiting) => this.stream === stream && this.waitNotice.set("stream", waiting),
      onEvent: (frame) => this.stream === stream && this.onFrame(frame),
      onStateChange: (state, info) => this.stream === stream && this.setState(state, info),
      onRetryScheduled: (delayMs) => this.stream === stream && this.onRetryScheduled(delayMs),
      onResyncRequired: () => this.stream === stream && this.snapshots.resync(),
      onComment: () => this.stream === stream && setText(this.dom.heartbeat, formatTime(Date.now())),
    });
    this.stream = stream;
    if (this.paused) stream.pause();
    if (start) stream.start();
    else stream.listen();
    this.renderPanel();
  }

  onStreamCallbackError(error) {
    console.error("session page:", error);
    this.panel.notify(`Page error: ${error}`, "error");
  }

  /** The stream's sharing changed: show it (the controls that detach this tab say so). */
  onRoleChange() {
    this.panel.renderSharing(this.stream);
  }

  setState(state, info = {}) {
    this.state = state;
    if (state === "ended" && this.debugTools) this.setDebugTools(false);
    this.evictedWhilePaused = false; // the stream speaks again: its state is the truth
    this.readerWatch.resetMisses();
    // A response to a request that carried a cursor starts with replay (EB-7).
    if (state === "open") this.replaying = this.stream !== null && this.stream.lastEventId !== "";
    this.panel.showState(state, info);
    this.renderPanel();
  }

  onRetryScheduled(delayMs) {
    this.panel.scheduleNextAttempt(delayMs);
    this.renderPanel();
  }

  onFrame(frame) {
    this.framesReceived += 1;
    if (frame.type === "state_resync_required") {
      this.snapshots.startHolding(); // hold every frame until the view is rebuilt (SC-12)
      for (const held of this.gaps.abort()) this.snapshots.hold(held); // the rebuild covers the gap
      this.panel.showSignal("resync", frame.json, "loading the snapshot…");
    }
    if (this.snapshots.holding) {
      this.snapshots.hold(frame);
    } else {
      this.handleFrame(frame);
    }
    this.renderPanel();
  }

  /**
   * Apply one frame to the view: events once each and in order, synthetic frames as
   * signals. A jump in the ids holds this frame and the next ones until the missing range
   * is fetched and applied (SC-14, ./gap_repair.js).
   */
  handleFrame(frame) {
    if (this.gaps.active) {
      this.gaps.hold(frame); // applied in order once the gap before it is repaired
      return;
    }
    const envelope = frame.json;
    if (frame.id === null) {
      this.handleSynthetic(frame.type, isObject(envelope) ? envelope : null, frame.data);
      return;
    }
    const id = Number(frame.id);
    const first = frame.firstId ?? id; // a compacted snapshot entry covers first … id
    if (!Number.isSafeInteger(id) || !isObject(envelope)) {
      this.log.add({ id: frame.id, type: frame.type, note: `unparsed: ${clip(frame.data, 80)}`, source: "live" });
      return;
    }
    if (this.cursor !== null && id <= this.cursor) {
      this.duplicates += 1; // already shown: replay after a reconnect, or in the snapshot
      return;
    }
    if (this.cursor !== null && first <= this.cursor) {
      // A compacted entry is never split: its part above the cursor is fetched raw (SC-14).
      this.log.add({
        kind: "local",
        type: "gap",
        timeMs: Date.now(),
        note: `#${first}–${id} compacted, shown up to #${this.cursor}: fetching #${this.cursor + 1}–${id} (SC-14)`,
      });
      this.gaps.start(this.cursor, null, id + 1);
      this.renderPanel();
      return;
    }
    if (this.cursor !== null && first !== this.cursor + 1) {
      this.log.add({
        kind: "local",
        type: "gap",
        timeMs: Date.now(),
        note: `expected #${this.cursor + 1}, got #${first}: fetching #${this.cursor + 1}–${first - 1} (SC-14)`,
      });
      this.gaps.start(this.cursor, frame);
      this.renderPanel();
      return;
    }
    this.applyEvent(envelope, frame.data.length, frame.source ?? (this.replaying ? "replay" : "live"));
  }

  /** After a resync: the stream resumes from the snapshot's cursor and epoch (SC-12). */
  adoptCursor(snapshot) {
    const cursor = snapshotCursor(snapshot);
    if (this.stream === null || snapshot.status === "closed" || cursor === "") return;
    this.stream.adoptCursor(cursor, snapshot.epoch ?? null);
  }

  /**
   * Draw one event (the next id) in the transcript and the log; it becomes the cursor. A
   * compacted entry (a resync's snapshot) is drawn as one row `a–b` and `b` becomes the cursor.
   */
  applyEvent(envelope, size, source) {
    if (envelope.type === "compacted") {
      if (this.cursor !== null && envelope.lastId <= this.cursor) return;
      this.cursor = envelope.lastId;
      if (this.snapshots.shownFrom === null) this.snapshots.shownFrom = envelope.firstId;
      this.snapshots.drawCompacted(envelope, source);
      return;
    }
    const id = envelope.id;
    if (this.cursor !== null && id <= this.cursor) return;
    this.cursor = id;
    if (this.snapshots.shownFrom === null) this.snapshots.shownFrom = id;
    this.transcript.apply(envelope);
    this.log.add({
      id,
      type: String(envelope.type),
      timeMs: serverTime(envelope),
      source,
      note: describeEvent(envelope, size),
      json: envelope,
      size,
    });
  }

  /** A range the ring no longer holds: said in the transcript and the log at its place (SC-14). */
  showLost({ from, to, unissued = false }) {
    const span = from === to ? `#${from}` : `#${from}–${to}`;
    if (unissued) {
      // A forked epoch's one jump in ids (EB-23): nothing was lost, nothing to show.
      this.log.add({ kind: "local", type: "ids skipped", timeMs: Date.now(), note: `${span} never issued in this epoch` });
      this.cursor = to;
      return;
    }
    this.transcript.note("lost", `${span} no longer on the server`);
    this.log.add({ kind: "local", type: "lost", timeMs: Date.now(), note: `${span} no longer on the server` });
    this.cursor = to;
  }

  /** The gap could not be repaired: rebuild from the snapshot, then apply `held` (SC-12). */
  resyncAfterGap(held, why) {
    this.log.add({ kind: "local", type: "gap not repaired", timeMs: Date.now(), note: `${why}; resyncing` });
    this.snapshots.startHolding();
    for (const frame of held) this.snapshots.hold(frame);
    this.snapshots.resync();
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
        this.panel.showSignal("warning", envelope, note);
        this.emitSignal(type, data);
        break;
      case "client_evicted":
        note = `${data.reason} after #${data.droppedAfter} · queue ${data.queueSize}/${data.maxQueued}; reconnecting with the cursor`;
        this.panel.showSignal("evicted", envelope, note);
        this.emitSignal(type, data);
        break;
      case "state_resync_required": {
        const rebuilt =
          this.snapshots.lastRebuild !== null
            ? ` → view rebuilt from the snapshot (${this.snapshots.lastRebuild.count} events up to #${this.snapshots.lastRebuild.lastEventId})`
            : "";
        note = `${data.reason}${data.detail ? ` (${data.detail})` : ""}: delivered #${data.lastDeliveredId}, earliest kept #${
          data.earliestAvailableId
        }${rebuilt}`;
        this.panel.showSignal("resync", envelope, note);
        break;
      }
      case "stream_error": {
        note = `${data.error ?? "error"}${data.code ? ` (${data.code}${data.reason ? `: ${data.reason}` : ""})` : ""}; reconnecting`;
        this.panel.showSignal("error", envelope, streamErrorText(data));
        break;
      }
      default:
        note = clip(raw, 160); // unknown types are shown raw, never fatal (SC-12)
        break;
    }
    this.log.add({ kind: "synthetic", type, timeMs, note, source: this.replaying ? "replay" : "", json: envelope ?? raw, size: raw.length });
  }

  // -- controls --

  bindControls() {
    const { drop, pause, demo, maxQueuedForm } = this.dom;
    drop.addEventListener("click", () => {
      if (this.stream === null) return;
      const { role, tabs } = this.stream;
      this.stream.drop();
      this.panel.notify(
        `Connection dropped; the client reconnects with Last-Event-ID after the retry delay.${
          role !== "own" ? ` This tab now reads a stream of its own${othersAfterDetach(role, tabs)}.` : ""
        }`,
        "info",
        ["open", "ended", "stopped"],
      );
    });
    pause.addEventListener("click", () => this.togglePause());
    demo.addEventListener("click", () => this.demo.start());
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
    this.publishConsole = new PublishConsole({
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
    });
    this.publishConsole.bind();
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
      this.panel.showResuming();
    }
    if (this.stream !== null) {
      const { role, tabs } = this.stream;
      if (this.paused) this.stream.pause();
      else this.stream.resume();
      if (role !== "own" && this.stream.role === "own") {
        this.panel.notify(`Pause reading: this tab now reads a stream of its own${othersAfterDetach(role, tabs)}.`);
      }
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
        this.panel.notify(`maxQueued must be an integer in [${min}, ${max}] (EB-14).`, "error");
        return;
      }
      this.maxQueued = value;
    }
    const cursor = this.stream !== null ? this.stream.lastEventId : "";
    const epoch = this.stream !== null ? this.stream.epoch : null;
    const { role, tabs } = this.stream ?? { role: "own", tabs: 1 };
    // A maxQueued of this tab's is a stream of its own; the default shares again.
    this.openStream(cursor, epoch, { own: this.maxQueued !== undefined });
    this.panel.notify(
      this.maxQueued === undefined
        ? "Reconnecting with the default maxQueued, shared with any other tab of this session."
        : `Reconnecting with ?maxQueued=${this.maxQueued}: this tab now reads a stream of its own${othersAfterDetach(role, tabs)}.`,
      "info",
      ["open", "ended", "stopped"],
    );
  }

  // -- a paused reader the server evicted (./paused_reader.js) --

  /** Ask the server about this page's reader while reading is paused on an open stream. */
  updateReaderPoll() {
    this.readerWatch.update(
      this.paused &&
        this.state === "open" &&
        this.stream !== null &&
        !this.evictedWhilePaused &&
        Boolean(this.config.urls.reader) &&
        !this.transport.overWebSocket,
    );
  }

  showEvictedWhilePaused() {
    this.evictedWhilePaused = true;
    this.panel.showEvicted();
    this.log.add({ kind: "local", type: "evicted while paused", timeMs: Date.now(), note: "the server no longer lists this page's reader" });
    this.panel.notify(
      "The server evicted this page's reader while reading was paused (its queue was full). Resume reading to catch up: the page reads what was sent, then reconnects with its cursor.",
      "error",
      ["reconnecting", "stopped", "ended"],
    );
    this.renderPanel();
  }

  // -- rendering (./session_status.js) --

  renderPanel() {
    this.panel.render({
      stream: this.stream,
      state: this.state,
      paused: this.paused,
      evictedWhilePaused: this.evictedWhilePaused,
      reconnectBase: this.reconnectBase,
      maxQueued: this.maxQueued,
      maxQueuedDefault: this.config.maxQueued.default,
      framesReceived: this.framesReceived,
      duplicates: this.duplicates,
      demoRunning: this.demo.running,
      debugTools: this.debugTools,
      viewCursor: this.cursor,
    });
    this.updateReaderPoll();
  }
}

/**
 * The stream cursor a snapshot hands over, as a string ("" when it has none): its
 * `lastEventId`, or, when that is null (an epoch that has issued no id yet, e.g. a
 * memory-only server after a restart), `earliestAvailableId - 1`: the cursor just below
 * the sequence's first id, which resumes without a resync (docs/protocol.md, snapshot).
 */
function snapshotCursor(snapshot) {
  if (Number.isSafeInteger(snapshot.lastEventId)) return String(snapshot.lastEventId);
  if (Number.isSafeInteger(snapshot.earliestAvailableId)) return String(snapshot.earliestAvailableId - 1);
  return "";
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
    debugEnded: byId("debug-ended"),
    searchForm: byId("transcript-search"),
    searchInput: byId("transcript-query"),
    searchPrevious: byId("search-previous"),
    searchCount: byId("search-count"),
    eventJson: byId("event-json"),
  };
}

const config = JSON.parse(document.getElementById("session-config").textContent);
new SessionPage(config, collectDom()).start();
