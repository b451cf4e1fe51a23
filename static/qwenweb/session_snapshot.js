/**
 * session_snapshot.js — the session page's view rebuilt from the snapshot: at the start,
 * on `state_resync_required` (SC-12), and the "Load earlier events" pages.
 *
 * `SnapshotSync` draws a snapshot (`GET /session/<id>`, the newest events only, bounded)
 * into the transcript and the frame log, and the snapshot's `lastEventId` becomes the
 * view's cursor (step 2 of session_page.js's flow). On a resync it holds every frame the
 * stream delivers from the `state_resync_required` on, loads the snapshot again (3
 * attempts; a 403 or 404 gives up at once) and continues the view from it without throwing
 * anything on screen away (`continueFrom`): in the same epoch, what the ring lost since
 * the cursor is marked "#21–90 no longer on the server" (what was shown stays, greyed) and
 * the snapshot's events follow (a part of the ring beyond the snapshot's page is fetched
 * as a gap, SC-14); after a restart (another epoch) everything shown stays, greyed and
 * marked, and the new history starts below. Then it hands the held frames to the page,
 * which skips those the snapshot already had: no row twice, none missing. A resync asked
 * for while one runs makes it load once more when it is done.
 * "Load earlier events" pages back with `?before=<first id shown>` and draws that page
 * above the transcript, unless a rebuild moved that first id meanwhile.
 *
 * Compacted history: the resync and "Load earlier events" ask for the compacted snapshot
 * (`compact=1`, docs/protocol.md "Compacted history") unless the page's own URL says
 * `?compact=0`, and the first load does when it says `?compact=1`; `expandEntry` turns a
 * compacted entry back into what the transcript applies, and the frame log shows it as
 * one row `a–b` (`drawCompacted`). A resync hands the page each entry as one frame with
 * `firstId` (`snapshotFrame`); the page applies it after its cursor like an event, and
 * fetches raw what an entry that starts at or below its cursor covers above it (an entry
 * is never split). The first load is raw by default so that the frame log stays one row
 * per event id; gap repair (SC-14) asks for raw pages.
 */
import { describeEvent, isObject, serverTime } from "./envelopes.js";
import { h } from "./frame_log.js";
import { HttpError } from "./session_requests.js";
import { Transcript } from "./transcript.js";

const SNAPSHOT_ATTEMPTS = 3;

/**
 * A snapshot's entry as the page applies a frame (`source` "snapshot"): an event, or a
 * compacted entry as one frame whose `id` is its `lastId` and `firstId` its first id.
 */
export function snapshotFrame(envelope) {
  const data = JSON.stringify(envelope);
  if (envelope.type === "compacted") {
    const id = String(envelope.lastId);
    return { id, firstId: envelope.firstId, type: "compacted", data, json: envelope, source: "snapshot" };
  }
  return { id: String(envelope.id), type: String(envelope.type), data, json: envelope, source: "snapshot" };
}

/** Whether `entry` is a compacted entry with a sound id range (`firstId` ≤ `lastId`). */
export function isCompacted(entry) {
  return (
    isObject(entry) &&
    entry.type === "compacted" &&
    Number.isSafeInteger(entry.firstId) &&
    Number.isSafeInteger(entry.lastId) &&
    entry.firstId <= entry.lastId
  );
}

/** The length of an envelope's JSON (characters): whether the frame log keeps it. */
function jsonSize(envelope) {
  return JSON.stringify(envelope).length;
}

/**
 * The snapshot query for `params` (e.g. "before=120"): compacted unless the page was opened
 * with `?compact=0`; with `initial` (the first load) raw unless it was opened with
 * `?compact=1`. Returns "" or "?…".
 */
export function snapshotQuery(params = "", { initial = false } = {}) {
  const asked = new URLSearchParams(globalThis.location ? globalThis.location.search : "").get("compact");
  const raw = initial ? asked !== "1" : asked === "0";
  const query = [params, raw ? "" : "compact=1"].filter(Boolean).join("&");
  return query ? `?${query}` : "";
}

/**
 * The envelopes that draw `entry` in the transcript: the entry itself, or for a compacted
 * one (`{type: "compacted", firstId, lastId, event, data}`) its merged event with the last
 * id, after an empty chunk with the first id when it is a message (so the message block
 * names the same id range as the events would).
 */
export function expandEntry(entry) {
  if (entry.type !== "compacted") return [entry];
  const merged = { id: entry.lastId, v: 1, type: entry.event, data: entry.data, _meta: entry._meta };
  const data = isObject(entry.data) ? entry.data : {};
  if (!isObject(data.content) || entry.firstId === entry.lastId) return [merged];
  const opening = { ...merged, id: entry.firstId, data: { ...data, content: { ...data.content, text: "" } } };
  return [opening, merged];
}

/**
 * The snapshot side of the session page's view.
 *
 * @param {object} page  What it needs of the page:
 * @param {(query: string) => Promise<object>} page.load  `GET /session/<id>` + `query`
 *   (`fetchSnapshot` of ./session_requests.js); rejects with an `HttpError` or a network error.
 * @param {import("./transcript.js").Transcript} page.transcript
 * @param {import("./frame_log.js").FrameLog} page.log
 * @param {() => number|null} page.cursor  The highest event id applied to the view.
 * @param {(id: number) => void} page.setCursor
 * @param {(frame: object) => void} page.apply  Apply one frame held during a resync (or one
 *   of the snapshot's events continuing the view).
 * @param {(span: {from: number, to: number}) => void} page.markLost  Show a span the ring lost.
 * @param {(snapshot: object) => void} page.adoptCursor  The stream resumes from the
 *   snapshot's `lastEventId` and `epoch` (the connection panel shows them).
 * @param {(text: string, kind?: string) => void} page.notify
 * @param {() => void} page.render  Redraw the connection panel.
 */
export class SnapshotSync {
  constructor(page) {
    this.page = page;
    /** @type {object[]} frames held while the view is rebuilt (SC-12) */
    this.pending = [];
    this.holding = false;
    this.running = false;
    this.again = false;
    /** `{lastEventId, count}` of the last rebuild, or null */
    this.lastRebuild = null;
    this.olderBefore = null; // `before=` of the next "load earlier" page, null when none
    this.earlier = null;
    this.epoch = null; // the epoch of the events shown
    this.shownFrom = null; // the first event id shown (the top of the transcript)
  }

  /** Make the "Load earlier events" button, above the transcript element `transcript`. */
  addEarlierButton(transcript) {
    const button = h("button", "btn btn-small load-earlier", "Load earlier events");
    button.type = "button";
    button.id = "load-earlier";
    button.hidden = true;
    button.addEventListener("click", () => this.loadEarlier());
    transcript.before(button);
    this.earlier = button;
  }

  /** Hold every frame from now on until the resync's rebuild is done (see `hold`). */
  startHolding() {
    this.holding = true;
  }

  /** Keep `frame` to apply after the rebuild; only while `holding`. */
  hold(frame) {
    this.pending.push(frame);
  }

  /** Replace the transcript and the log with the snapshot; its lastEventId becomes the cursor. */
  rebuild(snapshot) {
    const { transcript, log } = this.page;
    transcript.clear();
    log.clear();
    let count = 0;
    for (const envelope of snapshot.events) {
      if (!isObject(envelope)) continue;
      if (envelope.type === "compacted") {
        this.drawCompacted(envelope, "snapshot");
        count += Number.isSafeInteger(envelope.count) ? envelope.count : 1;
      } else if (envelope.id === undefined || envelope.id === null) {
        this.drawSynthetic(envelope);
      } else {
        transcript.apply(envelope);
        count += 1;
        log.add({
          id: envelope.id,
          type: String(envelope.type),
          timeMs: serverTime(envelope),
          source: "snapshot",
          note: describeEvent(envelope, 0),
          json: envelope,
          size: jsonSize(envelope),
        });
      }
    }
    if (Number.isSafeInteger(snapshot.lastEventId)) this.page.setCursor(snapshot.lastEventId);
    if (snapshot.status === "closed") transcript.note("closed", "This session is closed.");
    this.lastRebuild = { lastEventId: this.page.cursor(), count };
    this.epoch = snapshot.epoch ?? null;
    this.shownFrom = Number.isSafeInteger(snapshot.firstEventId) ? snapshot.firstEventId : null;
    this.setOlder(snapshot);
  }

  /** Draw a compacted entry in the transcript (as its events would draw) and as one log row `a–b`. */
  drawCompacted(envelope, source) {
    for (const part of expandEntry(envelope)) this.page.transcript.apply(part);
    this.page.log.add({
      id: `${envelope.firstId}–${envelope.lastId}`,
      type: String(envelope.event),
      timeMs: serverTime(envelope),
      source,
      note: `${envelope.count} events compacted · ${describeEvent({ ...envelope, type: envelope.event }, 0)}`,
      json: envelope,
      size: jsonSize(envelope),
    });
  }

  /** Draw a synthetic entry of a snapshot (`history_truncated`) in the transcript and the log. */
  drawSynthetic(envelope) {
    const data = isObject(envelope.data) ? envelope.data : {};
    this.page.transcript.apply(envelope);
    this.page.log.add({
      kind: "synthetic",
      type: String(envelope.type),
      source: "snapshot",
      note: envelope.type === "history_truncated" ? `events before #${data.earliestAvailableId} are gone` : "",
      json: envelope,
    });
  }

  /**
   * Continue the view from a snapshot loaded for a resync, keeping what is shown (SC-12).
   * Same epoch: the span the ring lost after the cursor is marked and the entries that end
   * above the cursor are applied in order, a compacted one as one frame (the page fetches
   * a part beyond this page, or the part above the cursor of an entry that starts below
   * it, as a gap, SC-14). Another epoch (a restart): what is shown is kept greyed under a marker and the
   * snapshot is drawn below it; its `lastEventId` becomes the cursor. An empty view is
   * simply rebuilt.
   */
  continueFrom(snapshot) {
    const cursor = this.page.cursor();
    if (cursor === null) {
      this.rebuild(snapshot);
      return;
    }
    const { transcript, log } = this.page;
    const events = snapshot.events.filter((e) => (isObject(e) && Number.isSafeInteger(e.id)) || isCompacted(e));
    const lastOf = (e) => (e.type === "compacted" ? e.lastId : e.id);
    const sameEpoch = this.epoch !== null && snapshot.epoch === this.epoch;
    if (sameEpoch) {
      const earliest = Number.isSafeInteger(snapshot.earliestAvailableId) ? snapshot.earliestAvailableId : cursor + 1;
      if (earliest > cursor + 1) {
        transcript.retire();
        log.retire();
        this.page.markLost({ from: cursor + 1, to: earliest - 1 });
      }
    } else {
      transcript.retire();
      log.retire();
      const shown = this.shownFrom !== null && this.shownFrom <= cursor ? `#${this.shownFrom}–${cursor}` : `#${cursor}`;
      const text = `${shown} no longer on the server (it restarted); the history continues below`;
      transcript.note("lost", text);
      log.add({ kind: "local", type: "lost", timeMs: Date.now(), note: text });
      this.page.setCursor(null); // a new id sequence: nothing of it is shown yet
      this.setOlder({ hasOlder: false }); // "load earlier" would draw above the old epoch's events
      this.epoch = snapshot.epoch ?? null;
      this.shownFrom = events.length ? (events[0].type === "compacted" ? events[0].firstId : events[0].id) : null;
      for (const envelope of snapshot.events) {
        if (isObject(envelope) && envelope.type === "history_truncated") this.drawSynthetic(envelope);
      }
    }
    let count = 0;
    for (const envelope of events) {
      if (this.page.cursor() !== null && lastOf(envelope) <= this.page.cursor()) continue;
      count += envelope.type === "compacted" ? envelope.lastId - envelope.firstId + 1 : 1;
      this.page.apply(snapshotFrame(envelope));
    }
    const lastEventId = Number.isSafeInteger(snapshot.lastEventId) ? snapshot.lastEventId : this.page.cursor();
    if (!sameEpoch && lastEventId !== null && (this.page.cursor() === null || this.page.cursor() < lastEventId)) {
      this.page.setCursor(lastEventId);
    }
    if (snapshot.status === "closed") transcript.note("closed", "This session is closed.");
    this.lastRebuild = { lastEventId, count };
    this.page.adoptCursor(snapshot);
  }

  /** SC-12: reload the snapshot, rebuild the view, then apply the frames held meanwhile. */
  async resync() {
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = true;
    let failure = null;
    try {
      do {
        this.again = false;
        failure = null;
        for (let attempt = 1; attempt <= SNAPSHOT_ATTEMPTS; attempt += 1) {
          try {
            this.continueFrom(await this.page.load(snapshotQuery("")));
            break;
          } catch (error) {
            failure = error;
            if (error instanceof HttpError && [403, 404].includes(error.status)) break;
            if (attempt < SNAPSHOT_ATTEMPTS) await new Promise((resolve) => setTimeout(resolve, 500 * attempt));
          }
        }
      } while (this.again);
    } finally {
      this.running = false;
    }
    if (failure !== null) {
      this.page.notify(`Resync failed: ${failure.message}. The view may miss events.`, "error");
      this.page.log.add({ kind: "local", type: "resync failed", timeMs: Date.now(), note: failure.message });
    }
    const held = this.pending;
    this.pending = [];
    this.holding = false;
    for (const frame of held) this.page.apply(frame);
    this.page.render();
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
    let olderPage;
    try {
      olderPage = await this.page.load(snapshotQuery(`before=${before}`));
    } catch (error) {
      this.page.notify(`Could not load earlier events: ${error.message}`, "error");
      this.earlier.disabled = false;
      return;
    }
    if (this.olderBefore !== before) return; // a resync rebuilt the view meanwhile
    const holder = document.createElement("div");
    const older = new Transcript(holder, document.createElement("span"));
    for (const envelope of olderPage.events) {
      if (isObject(envelope)) for (const part of expandEntry(envelope)) older.apply(part);
    }
    const { transcript } = this.page;
    const root = transcript.root;
    const placeholder = transcript.placeholder;
    if (placeholder && placeholder.isConnected && holder.childNodes.length > 0) placeholder.remove();
    root.prepend(...holder.childNodes);
    const ids = olderPage.events
      .filter((e) => isObject(e) && (Number.isSafeInteger(e.id) || e.type === "compacted"))
      .flatMap((e) => (e.type === "compacted" ? [e.firstId, e.lastId] : [e.id]));
    const drawn = olderPage.events.reduce(
      (sum, e) => sum + (isObject(e) && e.type === "compacted" ? e.count : isObject(e) && Number.isSafeInteger(e.id) ? 1 : 0),
      0,
    );
    this.page.log.add({
      kind: "local",
      type: "earlier events",
      timeMs: Date.now(),
      note: ids.length ? `${drawn} earlier events drawn above (#${ids[0]}–#${ids.at(-1)})` : "no earlier events",
    });
    if (ids.length) this.shownFrom = ids[0];
    this.setOlder({ ...olderPage, hasOlder: olderPage.hasOlder && ids.length > 0 });
  }
}
