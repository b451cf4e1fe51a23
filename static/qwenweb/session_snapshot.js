/**
 * session_snapshot.js — the session page's view rebuilt from the snapshot: at the start,
 * on `state_resync_required` (SC-12), and the "Load earlier events" pages.
 *
 * `SnapshotSync` draws a snapshot (`GET /session/<id>`, the newest events only, bounded)
 * into the transcript and the frame log, and the snapshot's `lastEventId` becomes the
 * view's cursor (step 2 of session_page.js's flow). On a resync it holds every frame the
 * stream delivers from the `state_resync_required` on, loads the snapshot again (3
 * attempts; a 403 or 404 gives up at once), rebuilds the view from it, and then hands the
 * held frames to the page, which skips those the snapshot already had: no row twice, none
 * missing. A resync asked for while one runs makes it load once more when it is done.
 * "Load earlier events" pages back with `?before=<first id shown>` and draws that page
 * above the transcript, unless a rebuild moved that first id meanwhile.
 *
 * Compacted history: the start, the resync and "Load earlier events" ask for the compacted
 * snapshot (`compact=1`, docs/protocol.md "Compacted history"), unless the page's own URL
 * says `?compact=0`; `expandEntry` turns a compacted entry back into what the transcript
 * applies, and the frame log shows it as one row `a–b`. (Gap repair asks for raw pages.)
 */
import { describeEvent, isObject, serverTime } from "./envelopes.js";
import { h } from "./frame_log.js";
import { HttpError } from "./session_requests.js";
import { Transcript } from "./transcript.js";

const SNAPSHOT_ATTEMPTS = 3;

/**
 * The snapshot query for `params` (e.g. "before=120"): compacted unless the page was opened
 * with `?compact=0`. Returns "" or "?…".
 */
export function snapshotQuery(params = "") {
  const raw = new URLSearchParams(globalThis.location ? globalThis.location.search : "").get("compact") === "0";
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
 * @param {(frame: object) => void} page.apply  Apply one frame held during a resync.
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
      for (const part of expandEntry(envelope)) transcript.apply(part);
      if (envelope.type === "compacted") {
        count += Number.isSafeInteger(envelope.count) ? envelope.count : 1;
        log.add({
          id: `${envelope.firstId}–${envelope.lastId}`,
          type: String(envelope.event),
          timeMs: serverTime(envelope),
          source: "snapshot",
          note: `${envelope.count} events compacted · ${describeEvent({ ...envelope, type: envelope.event }, 0)}`,
        });
      } else if (envelope.id === undefined || envelope.id === null) {
        const data = isObject(envelope.data) ? envelope.data : {};
        log.add({
          kind: "synthetic",
          type: String(envelope.type),
          source: "snapshot",
          note: envelope.type === "history_truncated" ? `events before #${data.earliestAvailableId} are gone` : "",
        });
      } else {
        count += 1;
        log.add({
          id: envelope.id,
          type: String(envelope.type),
          timeMs: serverTime(envelope),
          source: "snapshot",
          note: describeEvent(envelope, 0),
        });
      }
    }
    if (Number.isSafeInteger(snapshot.lastEventId)) this.page.setCursor(snapshot.lastEventId);
    if (snapshot.status === "closed") transcript.note("closed", "This session is closed.");
    this.lastRebuild = { lastEventId: this.page.cursor(), count };
    this.setOlder(snapshot);
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
            this.rebuild(await this.page.load(snapshotQuery()));
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
    this.setOlder({ ...olderPage, hasOlder: olderPage.hasOlder && ids.length > 0 });
  }
}
