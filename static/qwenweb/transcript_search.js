/**
 * transcript_search.js — the search in the session page's transcript: type a word, every
 * match is highlighted, the current one in its own colour and scrolled to; Enter (or ↓)
 * goes to the next match, Shift+Enter (or ↑) to the previous one, wrapping around; the
 * count says "3 of 12".
 *
 * Matches are found in the text of messages, tool titles and outputs and markers
 * (./transcript_model.js `findMatches`, case-insensitive) and drawn with the CSS Custom
 * Highlight API (`CSS.highlights`, names `transcript-match` and `transcript-current`): the
 * transcript's text nodes are never split, so chunks keep arriving into them. The matches
 * are found again at each step, so text that arrived meanwhile is searched too. Going to a
 * match turns the transcript's follow mode off.
 */
import { setText } from "./frame_log.js";
import { findMatches } from "./transcript_model.js";

const SEARCHED = ".msg-text, .tool-title, .tool-output, .marker-text";
const MATCH = "transcript-match";
const CURRENT = "transcript-current";

export class TranscriptSearch {
  /**
   * @param {object} options
   * @param {HTMLElement} options.root  The transcript element.
   * @param {HTMLFormElement} options.form  Holds the input; its submit goes to the next match.
   * @param {HTMLInputElement} options.input
   * @param {HTMLButtonElement} options.previous
   * @param {HTMLElement} options.count  "3 of 12", "no match".
   * @param {import("./frame_log.js").Follower} options.follower  The transcript's.
   */
  constructor({ root, form, input, previous, count, follower }) {
    this.root = root;
    this.form = form;
    this.input = input;
    this.previous = previous;
    this.count = count;
    this.follower = follower;
    this.ranges = [];
    this.index = -1;
    this.highlights = typeof CSS !== "undefined" && CSS.highlights !== undefined && typeof Highlight === "function";
  }

  bind() {
    this.input.addEventListener("input", () => this.go(0, { restart: true }));
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.go(1);
    });
    this.input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && event.shiftKey) {
        event.preventDefault();
        this.go(-1);
      }
    });
    this.previous.addEventListener("click", () => this.go(-1));
  }

  /** The ranges of every match in the transcript now, in document order. */
  collect(query) {
    const ranges = [];
    if (query.trim() === "") return ranges;
    const walker = document.createTreeWalker(this.root, NodeFilter.SHOW_TEXT, {
      acceptNode: (node) =>
        node.parentElement !== null && node.parentElement.closest(SEARCHED) !== null
          ? NodeFilter.FILTER_ACCEPT
          : NodeFilter.FILTER_REJECT,
    });
    for (let node = walker.nextNode(); node !== null; node = walker.nextNode()) {
      for (const [start, end] of findMatches(node.data, query)) {
        const range = document.createRange();
        range.setStart(node, start);
        range.setEnd(node, end);
        ranges.push(range);
      }
    }
    return ranges;
  }

  /** Move `step` matches on (0: stay; `restart`: from the first), draw and scroll there. */
  go(step, { restart = false } = {}) {
    const previous = restart ? null : this.ranges[this.index] ?? null;
    this.ranges = this.collect(this.input.value);
    const total = this.ranges.length;
    if (total === 0) {
      this.index = -1;
    } else {
      // Find the match that was current again (the list may have grown), then step from it.
      let at = previous === null ? -1 : this.ranges.findIndex((range) => sameRange(range, previous));
      if (at < 0) at = step > 0 ? -1 : 0;
      this.index = (((at + step) % total) + total) % total;
      if (previous === null && step <= 0) this.index = 0;
    }
    this.draw();
  }

  draw() {
    const total = this.ranges.length;
    const query = this.input.value.trim();
    setText(this.count, query === "" ? "" : total === 0 ? "no match" : `${this.index + 1} of ${total}`);
    this.input.setAttribute("aria-invalid", String(query !== "" && total === 0));
    if (this.highlights) {
      CSS.highlights.set(MATCH, new Highlight(...this.ranges));
      CSS.highlights.set(CURRENT, new Highlight(...(this.index >= 0 ? [this.ranges[this.index]] : [])));
    }
    if (this.index >= 0) this.scrollTo(this.ranges[this.index]);
  }

  scrollTo(range) {
    this.follower.setStick(false);
    const box = this.root.getBoundingClientRect();
    const rect = range.getBoundingClientRect();
    this.root.scrollTop += rect.top - box.top - this.root.clientHeight / 2;
  }
}

function sameRange(a, b) {
  return a.startContainer === b.startContainer && a.startOffset === b.startOffset;
}
