/**
 * paused_reader.js — whether the server still holds the session page's reader while
 * reading is paused.
 *
 * While reading is paused the page does not read the body (EB-21), so it would never see
 * the server's `client_evicted` nor the stream's end. `PausedReaderWatch` asks
 * `GET /session/<id>/readers/<client id>` (`sessions/web/subscribers.py`) every 1.5 s
 * instead, while the page wants it (`update(true)`: paused on an open stream); two answers
 * in a row without this page's reader (one could race a report of another process) mean
 * the server evicted it. A failed question says nothing about the reader; at most one is
 * in flight.
 */
import { isObject } from "./envelopes.js";

const READER_POLL_MS = 1500;

export class PausedReaderWatch {
  /**
   * @param {object} options
   * @param {string|null} options.url  This page's reader (its `X-Client-Id`); null: no check.
   * @param {() => boolean} options.stillPaused  Whether an answer still counts (reading is
   *   paused on an open stream); one that arrives after is ignored.
   * @param {() => void} options.onEvicted  Two answers in a row without the reader.
   */
  constructor({ url, stillPaused, onEvicted }) {
    this.url = url;
    this.stillPaused = stillPaused;
    this.onEvicted = onEvicted;
    this.timer = null;
    this.busy = false;
    this.misses = 0;
  }

  /** Ask every 1.5 s while `wanted`, from a count of 0; stop asking when not. Idempotent. */
  update(wanted) {
    if (wanted && this.timer === null) {
      this.misses = 0;
      this.timer = setInterval(() => this.check(), READER_POLL_MS);
    } else if (!wanted && this.timer !== null) {
      clearInterval(this.timer);
      this.timer = null;
    }
  }

  /** Forget the answers so far (the stream spoke: its state is the truth). */
  resetMisses() {
    this.misses = 0;
  }

  async check() {
    if (this.busy) return;
    this.busy = true;
    try {
      const response = await fetch(this.url, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) return; // a failed question says nothing about the reader
      const body = await response.json();
      if (!this.stillPaused() || !isObject(body)) return;
      this.misses = body.connected === false ? this.misses + 1 : 0;
      if (this.misses >= 2) this.onEvicted();
    } catch {
      // the next tick asks again
    } finally {
      this.busy = false;
    }
  }
}
