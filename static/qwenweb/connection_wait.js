/**
 * connection_wait.js — say when the browser is out of connections to this server.
 *
 * Over HTTP/1.1 a browser opens at most 6 connections per server (scheme, host, port);
 * a 7th request waits, without any error, until one is free. A request that has no response
 * headers after `CONNECTION_WAIT_MS` is most likely waiting for one: the session page and
 * the dashboard then show `CONNECTION_WAIT_TEXT` and keep waiting (the request is not
 * given up), and hide it once every waiting request got its answer.
 *
 * - `watchRequest(promise, onWait, ms)` → the same promise; `onWait(true)` after `ms`
 *   without settling, `onWait(false)` when it settles after that.
 * - `class ConnectionWaitNotice(anchor)` — a banner inserted after `anchor`;
 *   `set(source, waiting)` per waiting request kind ("stream", "snapshot", "feed" …).
 */

export const CONNECTION_WAIT_MS = 5000;

export const CONNECTION_WAIT_TEXT =
  "Waiting for a free connection: the browser has not been able to reach this server for 5 s. " +
  "Over HTTP/1.1 a browser opens at most 6 connections per server, and other tabs or streams " +
  "of this site hold them all. Close some tabs of this site, or serve it over HTTP/2 (one " +
  "connection carries every stream). This page keeps waiting and continues by itself.";

/**
 * Report a request that takes longer than `ms` to answer.
 * @template T
 * @param {Promise<T>} promise  e.g. a `fetch()` (it settles when the headers arrive)
 * @param {(waiting: boolean) => void} onWait
 * @param {number} [ms]
 * @returns {Promise<T>}
 */
export function watchRequest(promise, onWait, ms = CONNECTION_WAIT_MS) {
  let shown = false;
  const timer = setTimeout(() => {
    shown = true;
    onWait(true);
  }, ms);
  const settle = () => {
    clearTimeout(timer);
    if (shown) onWait(false);
  };
  promise.then(settle, settle);
  return promise;
}

/** The banner; created on first use right after `anchor` (no template change needed). */
export class ConnectionWaitNotice {
  constructor(anchor, { id = "connection-wait", text = CONNECTION_WAIT_TEXT } = {}) {
    this.anchor = anchor;
    this.id = id;
    this.text = text;
    this.sources = new Set();
    this.element = null;
  }

  /** Whether any request is waiting now. */
  get shown() {
    return this.sources.size > 0;
  }

  /** Mark `source` as waiting (or not); the banner shows while any source waits. */
  set(source, waiting) {
    if (waiting) this.sources.add(source);
    else this.sources.delete(source);
    const element = this._element();
    if (element === null) return;
    element.hidden = this.sources.size === 0;
    element.dataset.sources = [...this.sources].join(" ");
  }

  _element() {
    if (this.element !== null) return this.element;
    if (typeof document === "undefined" || !this.anchor) return null;
    const element = document.getElementById(this.id) ?? document.createElement("div");
    element.id = this.id;
    element.className = "banner";
    element.dataset.kind = "waiting";
    element.setAttribute("role", "status");
    element.textContent = this.text;
    element.hidden = true;
    if (!element.isConnected) this.anchor.after(element);
    this.element = element;
    return element;
  }
}
