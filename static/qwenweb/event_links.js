/**
 * event_links.js — links to event ids on the session page: `#e<id>` in the URL scrolls the
 * frame log to that event's row and the transcript to the block drawn from it, and
 * highlights both (class `is-target`), or says that the page does not show that event.
 *
 * Every id cell of the frame log and every transcript block's ids are such links
 * (frame_log.js, transcript.js); a click on one puts it in the URL (history.pushState:
 * copy the address to share it) and shows it even when the URL already had it; the
 * browser's back and forward and an edited address come as `hashchange`. Showing an event
 * turns follow mode off in both views, so new events do not scroll it away.
 */

/** The event id of a URL hash `#e<id>` (a positive safe integer), else null. */
export function eventIdFromHash(hash) {
  const match = /^#e(\d{1,16})$/.exec(hash);
  if (match === null) return null;
  const id = Number(match[1]);
  return Number.isSafeInteger(id) && id > 0 ? id : null;
}

/** The transcript block drawn from event `id` (a tool card, a message, a marker), or null. */
export function blockFor(root, id) {
  for (const block of root.querySelectorAll(".tool[data-ids]")) {
    if (block.dataset.ids.split(" ").includes(String(id))) return block;
  }
  for (const block of root.querySelectorAll(".msg[data-first-id], .marker[data-id]")) {
    const first = Number(block.dataset.firstId ?? block.dataset.id);
    const last = Number(block.dataset.lastId ?? block.dataset.id);
    if (first <= id && id <= last) return block;
  }
  return null;
}

export class EventLinks {
  /**
   * @param {object} options
   * @param {import("./frame_log.js").FrameLog} options.log
   * @param {import("./transcript.js").Transcript} options.transcript
   * @param {(text: string, kind?: string) => void} options.notify
   */
  constructor({ log, transcript, notify }) {
    this.log = log;
    this.transcript = transcript;
    this.notify = notify;
    this.targets = [];
  }

  bind() {
    window.addEventListener("hashchange", () => this.showFromUrl());
    document.addEventListener("click", (event) => {
      const link = event.target instanceof Element ? event.target.closest("a.event-link") : null;
      if (link === null || event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey) return;
      event.preventDefault();
      if (location.hash !== link.hash) history.pushState(null, "", link.hash);
      this.showFromUrl();
    });
  }

  /** Show the event the URL names (`#e<id>`); nothing when it names none. */
  showFromUrl() {
    const id = eventIdFromHash(location.hash);
    if (id !== null) this.show(id);
  }

  /** Scroll to event `id` in the frame log and the transcript and highlight it; false when not shown. */
  show(id) {
    for (const node of this.targets) node.classList.remove("is-target");
    const row = this.log.rowFor(id);
    const block = blockFor(this.transcript.root, id);
    this.targets = [row, block].filter((node) => node !== null);
    if (this.targets.length === 0) {
      const range = this.log.idRange();
      this.notify(
        `Event #${id} is not shown on this page${
          range !== null ? ` (the frame log holds #${range.first}–${range.last}; older events: Load earlier events)` : ""
        }.`,
        "error",
      );
      return false;
    }
    this.log.follower.setStick(false);
    this.transcript.follower.setStick(false);
    for (const node of this.targets) {
      node.classList.add("is-target");
      node.scrollIntoView({ block: "center" });
    }
    if (row !== null && row.hidden) this.notify(`Event #${id}'s row is hidden by the frame log's filter.`);
    return true;
  }
}
