/**
 * event_json.js — the session page's dialog that shows a frame's full JSON (a click on a
 * frame's type in the frame log, or on a transcript block's "JSON" button).
 *
 * `EventJsonDialog` fills the template's `<dialog id="event-json">` and opens it modal
 * (Escape and its Close button close it; focus returns to what opened it, HTML §6.12's
 * dialog behaviour). Text goes in with `textContent` only. A value given as a promise (an
 * event too large to keep on the page, fetched from the server) shows "Loading…" first,
 * then the value or the error in words.
 */
import { setText } from "./frame_log.js";

/** `value` as the dialog shows it: JSON text (2-space indent) for an object, a string as it is. */
export function jsonText(value) {
  if (typeof value === "string") {
    try {
      return JSON.stringify(JSON.parse(value), null, 2);
    } catch {
      return value; // not JSON (an unparsed frame): shown raw
    }
  }
  return JSON.stringify(value, null, 2) ?? String(value);
}

export class EventJsonDialog {
  /** @param {HTMLDialogElement} dialog  With `.json-title`, `.json-body`, `.json-note`, `[data-close]`, `[data-copy]`. */
  constructor(dialog) {
    this.dialog = dialog;
    this.title = dialog.querySelector(".json-title");
    this.body = dialog.querySelector(".json-body");
    this.note = dialog.querySelector(".json-note");
    this.shown = 0;
    dialog.querySelector("[data-close]").addEventListener("click", () => dialog.close());
    dialog.querySelector("[data-copy]").addEventListener("click", () => this.copy());
  }

  /** Open the dialog titled `title` on `value` (object, string, or a promise of one). */
  async show(title, value) {
    const shown = ++this.shown;
    setText(this.title, title);
    setText(this.note, "");
    if (!this.dialog.open) this.dialog.showModal();
    if (!(value instanceof Promise)) {
      setText(this.body, jsonText(value));
      return;
    }
    setText(this.body, "Loading…");
    try {
      const loaded = await value;
      if (shown === this.shown) setText(this.body, jsonText(loaded));
    } catch (error) {
      if (shown === this.shown) setText(this.body, `Could not load it: ${error.message ?? error}`);
    }
  }

  async copy() {
    try {
      await navigator.clipboard.writeText(this.body.textContent);
      setText(this.note, "Copied.");
    } catch {
      setText(this.note, "The browser did not allow copying: select the text instead.");
    }
  }
}
