/**
 * gap_repair.js — a tab that sees event ids jump fetches the missing range (SC-14).
 *
 * Whatever made the jump (a shared stream that started above this tab's snapshot, a
 * handover, a follower joining late), the page never shows a hole: `GapRepair` asks the
 * snapshot for the range, `GET /session/<id>?before=<first id after the gap>&limit=<n>`
 * (the raw events, never a compacted page; paging back with `before=<firstEventId>` while
 * the answer stops short), holds every frame the stream delivers meanwhile in a bounded
 * buffer, and then hands the page the fetched events and the held frames, in id order. A
 * range the ring no longer holds is handed over as one "lost" span, which the page shows at
 * that place. It never opens a second stream (over HTTP/1.1 that costs one of the six
 * connections). Past `holdLimit` held frames, or when the range cannot be read (after
 * `attempts` tries) or belongs to another epoch, it gives up and asks for a resync (SC-12).
 *
 * `pagePlan` and `readPage` are pure (tests/js/gap_repair.test.mjs); no DOM dependency.
 */

/** Events asked for per request (the server's `SNAPSHOT_MAX_LIMIT` is 5000). */
export const GAP_PAGE_LIMIT = 500;
/** Frames held while a range is fetched; one more and the page resyncs instead. */
export const GAP_HOLD_LIMIT = 5000;
const ATTEMPTS = 3;

/**
 * The query of the next request for the events above `cursor` and below `before`.
 * @param {number} cursor  The last id applied (the gap starts at `cursor + 1`).
 * @param {number} before  The first id not wanted (the id after the gap, or where the
 *   previous page started).
 * @returns {string} `?before=<before>&limit=<n>`, n in 1 … GAP_PAGE_LIMIT
 */
export function pagePlan(cursor, before, pageLimit = GAP_PAGE_LIMIT) {
  const limit = Math.max(1, Math.min(before - cursor - 1, pageLimit));
  return `?before=${before}&limit=${limit}`;
}

/**
 * Read one raw snapshot page for the range `cursor + 1 … before - 1`.
 * @param {{events: object[], firstEventId: number|null, hasOlder: boolean}} page
 * @returns {{events: object[], next: number|null, lost: {from: number, to: number, unissued?: boolean}|null}}
 *   `events`: the page's real events inside the range, oldest first; `next`: the `before`
 *   of the following request (older events still to fetch), else null; `lost`: the part of
 *   the range at its start the ring no longer holds (only when `next` is null), with
 *   `unissued: true` when those ids were never issued (EB-23). Never throws.
 */
export function readPage(page, cursor, before) {
  const real = page.events.filter((e) => e !== null && typeof e === "object" && Number.isSafeInteger(e.id));
  const events = real.filter((e) => e.id > cursor && e.id < before).sort((a, b) => a.id - b.id);
  const lowest = events.length ? events[0].id : before;
  if (lowest <= cursor + 1) return { events, next: null, lost: null };
  // The ring still holds the cursor's event yet nothing between it and `lowest`: a ring only
  // loses its oldest events, so those ids were never issued (a forked epoch's jump, EB-23).
  if (real.some((e) => e.id <= cursor)) return { events, next: null, lost: { from: cursor + 1, to: lowest - 1, unissued: true } };
  if (page.hasOlder && events.length > 0) return { events, next: lowest, lost: null };
  return { events, next: null, lost: { from: cursor + 1, to: lowest - 1 } };
}

/**
 * Repairs one gap at a time for the session page.
 *
 * @param {object} options
 * @param {(query: string) => Promise<object>} options.load  `GET /session/<id>` + query.
 * @param {(envelope: object) => void} options.applyEvent  Apply a fetched event.
 * @param {(span: {from: number, to: number, unissued?: boolean}) => void} options.applyLost
 *   Show a lost span (or, `unissued`, move past ids never issued).
 * @param {(frame: object) => void} options.applyFrame  Apply a held frame (it may start
 *   the next repair: the frames after it are then held again).
 * @param {(held: object[], why: string) => void} options.resync  Give up: resync, then
 *   apply `held`.
 * @param {() => string|null} [options.epoch]  The stream's epoch (a page of another is refused).
 * @param {number} [options.holdLimit] @param {number} [options.pageLimit]
 * @param {(ms: number) => Promise<void>} [options.sleep]  Between attempts.
 */
export class GapRepair {
  constructor(options) {
    this.options = options;
    this.holdLimit = options.holdLimit ?? GAP_HOLD_LIMIT;
    this.pageLimit = options.pageLimit ?? GAP_PAGE_LIMIT;
    this.sleep = options.sleep ?? ((ms) => new Promise((resolve) => setTimeout(resolve, ms)));
    this.active = false;
    this.held = [];
    this.overflowed = false;
    this.generation = 0; // a repair whose generation is past is abandoned
    /** Gaps repaired, events fetched, spans lost, resyncs asked for (shown on the page). */
    this.stats = { gaps: 0, fetched: 0, lost: 0, resyncs: 0 };
  }

  /**
   * Start repairing the gap between `cursor` and `frame` (the first frame after it, held;
   * its first id is `frame.firstId` for a compacted snapshot entry, else `frame.id`), or
   * with `frame` null the range `cursor + 1 … before − 1` (what a compacted entry that
   * starts at or below the cursor covers above it: the entry itself is dropped).
   * @returns {Promise<void>} settles when the range and the held frames are applied
   */
  start(cursor, frame, before = Number(frame.firstId ?? frame.id)) {
    this.active = true;
    this.held = frame === null ? [] : [frame];
    this.overflowed = false;
    this.generation += 1;
    this.stats.gaps += 1;
    return this._run(cursor, before, this.generation);
  }

  /** Abandon the running repair (a resync rebuilds the view); returns the frames held. */
  abort() {
    const held = this.held;
    this.held = [];
    this.active = false;
    this.generation += 1;
    return held;
  }

  /** Hold `frame` until the range is applied; past the bound, the repair ends in a resync. */
  hold(frame) {
    if (this.held.length >= this.holdLimit) this.overflowed = true;
    this.held.push(frame);
  }

  async _run(cursor, firstAfter, generation) {
    const pages = [];
    let before = firstAfter;
    let lost = null;
    let failure = null;
    while (before !== null && !this.overflowed) {
      let page = null;
      try {
        page = await this._load(pagePlan(cursor, before, this.pageLimit));
      } catch (error) {
        failure = error.message;
        break;
      }
      if (generation !== this.generation) return;
      const epoch = this.options.epoch ? this.options.epoch() : null;
      if (epoch && page.epoch && page.epoch !== epoch) {
        failure = "the server's history has another epoch";
        break;
      }
      const read = readPage(page, cursor, before);
      pages.push(read.events);
      lost = read.lost;
      before = read.next;
    }
    if (generation !== this.generation) return;
    const held = this.held;
    this.held = [];
    this.active = false;
    if (this.overflowed || failure !== null) {
      this.stats.resyncs += 1;
      this.options.resync(held, this.overflowed ? `more than ${this.holdLimit} frames arrived meanwhile` : failure);
      return;
    }
    if (lost !== null) {
      if (!lost.unissued) this.stats.lost += 1;
      this.options.applyLost(lost);
    }
    for (const events of pages.reverse()) {
      for (const envelope of events) {
        this.stats.fetched += 1;
        this.options.applyEvent(envelope);
      }
    }
    for (let index = 0; index < held.length; index += 1) {
      if (this.active) {
        // A held frame opened the next gap: the rest wait for that repair.
        for (const frame of held.slice(index)) this.hold(frame);
        return;
      }
      this.options.applyFrame(held[index]);
    }
  }

  async _load(query) {
    let failure = null;
    for (let attempt = 1; attempt <= ATTEMPTS; attempt += 1) {
      try {
        return await this.options.load(query);
      } catch (error) {
        failure = error;
        if (error && [401, 403, 404].includes(error.status)) break;
        if (attempt < ATTEMPTS) await this.sleep(300 * attempt);
      }
    }
    throw failure;
  }
}
