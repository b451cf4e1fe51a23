/**
 * demo_control.js — the session page's "Start demo agent" button.
 *
 * `DemoControl` starts the scripted demo agent with `POST <demo url>` (login session + CSRF
 * header; `sessions/web/demo.py`): 202 started it, a `demo_running` refusal means one runs
 * already (one at a time per session); any other answer is said in words. The button says
 * whether an agent runs, and while one does the control asks `GET <demo url>` every 3 s
 * (not while the tab is hidden) until it answers `running: false`.
 */
import { isObject } from "./envelopes.js";
import { setText } from "./frame_log.js";
import { failureText } from "./session_requests.js";
import { csrfToken } from "./subscribers.js";

const DEMO_POLL_MS = 3000;

export class DemoControl {
  /**
   * @param {object} options
   * @param {HTMLButtonElement} options.button
   * @param {string} options.url  The session's demo endpoint.
   * @param {number} options.chunksPerS  The demo agent's pace, said when it starts.
   * @param {boolean} options.running  Whether an agent ran when the page was made.
   * @param {(text: string, kind?: string) => void} options.notify
   * @param {() => void} options.onChange  Redraw the page's controls (`running` changed).
   */
  constructor({ button, url, chunksPerS, running, notify, onChange }) {
    this.button = button;
    this.url = url;
    this.chunksPerS = chunksPerS;
    this.running = running;
    this.notify = notify;
    this.onChange = onChange;
    this.timer = null;
  }

  /** Ask the server to start the demo agent; says the outcome. Never throws. */
  async start() {
    this.button.disabled = true;
    try {
      const response = await fetch(this.url, {
        method: "POST",
        credentials: "same-origin",
        headers: { Accept: "application/json", "X-CSRFToken": csrfToken() },
      });
      if (response.status === 202) {
        this.notify(`Demo agent started: about ${this.chunksPerS} chunks per second.`);
        this.setRunning(true);
        return;
      }
      const body = await response.clone().json().catch(() => ({}));
      if (isObject(body) && body.code === "demo_running") {
        this.notify("A demo agent is already running in this session.");
        this.setRunning(true);
        return;
      }
      this.notify(`Could not start the demo agent: ${await failureText(response)}.`, "error");
    } catch (error) {
      this.notify(`Could not start the demo agent: the server did not answer (${error.message ?? error}).`, "error");
    } finally {
      this.onChange();
    }
  }

  /** The button says whether an agent runs; while one does, ask every 3 s until it ends. */
  setRunning(running) {
    this.running = running;
    setText(this.button, running ? "Demo agent running" : "Start demo agent");
    this.button.title = running
      ? "The scripted demo agent is publishing into this session (one at a time)"
      : "Play the scripted demo agent into this session";
    if (running && this.timer === null) {
      this.timer = setInterval(() => this.check(), DEMO_POLL_MS);
    } else if (!running && this.timer !== null) {
      clearInterval(this.timer);
      this.timer = null;
    }
    this.onChange();
  }

  async check() {
    if (document.hidden) return;
    try {
      const response = await fetch(this.url, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) return;
      const body = await response.json();
      if (isObject(body) && body.running === false) this.setRunning(false);
    } catch {
      // the next tick asks again
    }
  }
}
