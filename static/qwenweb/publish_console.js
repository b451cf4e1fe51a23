/**
 * publish_console.js — the session page's publish console and its "Provoke backpressure"
 * helper (owner and staff).
 *
 * Publish: an event type and its JSON data, posted to `POST /session/<id>/events` with a
 * publish token from `POST /session/<id>/token` (`{"scope": "publish"}`, login session +
 * CSRF header); one fresh token on a 401. Each publish carries an `Idempotency-Key` (a new
 * random key per event, the same on its retry), so a retry never publishes it twice
 * (docs/protocol.md, "Idempotent publish"). The answer's id and epoch are shown, or the
 * error in words (docs/protocol.md, "Endpoints"; never a raw code).
 *
 * Provoke backpressure: the page's own stream is made a slow client, from the page alone.
 *  1. Reading is paused (the page's "Pause reading"), so the server's `send` for this page
 *     waits once the socket and the browser's buffers are full (EB-21) — on a default Linux
 *     machine those hold tens of MiB (~1,000 events of 64 KiB).
 *  2. Events of 64 KiB (`backpressure_probe`) are published, a few at a time, bounded:
 *     at most `MAX_EVENTS` (2,000) and `MAX_BYTES` (128 MiB), and a Stop button.
 *  3. A paused page cannot see its own frames, so staff watch this page's subscriber on the
 *     server (the live subscribers list, found by the page's `X-Client-Id`): its queue
 *     passing 75 % means `slow_client_warning` is queued (EB-4), its row vanishing means
 *     `client_evicted` (EB-5). Publishing stops at the eviction (a few events after the
 *     warning). Without staff rights the page cannot see the server's queue: it publishes up
 *     to the bounds. Publishing also stops as soon as the page's stream itself shows
 *     `slow_client_warning` (when reading was not paused).
 *  4. Reading resumes (if the helper paused it): the page shows the backlog, then
 *     `slow_client_warning`, then `client_evicted`, and reconnects with its cursor (SC-12).
 *     The helper waits for those frames (bounded) and says what happened.
 */
import { lookup } from "./lookup.js";
import { boundedFetch, csrfToken, describeApiError, formatBytes, readJson } from "./subscribers.js";

/** A new idempotency key: a UUID4 (`crypto.randomUUID`, or 122 random bits where the page
 * is not a secure context and that function is missing). */
export function newIdempotencyKey(random = globalThis.crypto) {
  if (typeof random.randomUUID === "function") return random.randomUUID();
  const bytes = random.getRandomValues(new Uint8Array(16));
  bytes[6] = (bytes[6] & 0x0f) | 0x40;
  bytes[8] = (bytes[8] & 0x3f) | 0x80;
  const hex = Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

export const PROBE_EVENT_BYTES = 64 * 1024;
export const MAX_EVENTS = 2000;
export const MAX_BYTES = 128 * 1024 * 1024;
const IN_FLIGHT = 3; // the stream and the watcher use two of the browser's 6 connections
const WATCH_INTERVAL_MS = 300;
const SHOW_WAIT_MS = 60_000;
const WARN_RATIO = 0.75; // EB-4
const PROBE_TYPE = "backpressure_probe";

/** Parse the console's data field: `{ok: true, value}` (undefined when empty) or `{ok: false, error}`. */
export function parseData(text) {
  if (text.trim() === "") return { ok: true, value: undefined };
  try {
    return { ok: true, value: JSON.parse(text) };
  } catch (error) {
    return { ok: false, error: `The data is not valid JSON: ${error.message}.` };
  }
}

/**
 * The body of probe event `n`: its JSON is `PROBE_EVENT_BYTES` long, padded with random
 * letters and digits: the page's stream is gzipped (docs/protocol.md, "Compression"), and a
 * run of one letter would shrink a thousandfold on the way, never filling the buffers.
 */
export function probeBody(n) {
  const skeleton = JSON.stringify({ type: PROBE_TYPE, data: { n, pad: "" } });
  return JSON.stringify({ type: PROBE_TYPE, data: { n, pad: randomText(PROBE_EVENT_BYTES - skeleton.length) } });
}

const PAD_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/** `length` random letters and digits (about 6 bits each, so gzip keeps about 75 %). */
function randomText(length) {
  const bytes = new Uint8Array(Math.max(0, length));
  for (let start = 0; start < bytes.length; start += 65536) {
    crypto.getRandomValues(bytes.subarray(start, start + 65536)); // at most 64 KiB per call
  }
  let text = "";
  for (const byte of bytes) text += PAD_ALPHABET[byte % PAD_ALPHABET.length];
  return text;
}

/**
 * Whether a subscriber row's queue has reached the warning threshold (EB-4: 75 % of either
 * cap), for `maxQueued` frames and `maxQueuedBytes` bytes.
 */
export function queuePastWarning(row, maxQueued, maxQueuedBytes) {
  return row.queuedFrames >= WARN_RATIO * maxQueued || row.queuedBytes >= WARN_RATIO * maxQueuedBytes;
}

/** Whether a run must stop publishing now, and why (a key of `STOP_REASONS`), else null. */
export function stopReason(run) {
  if (run.ended) return "ended";
  if (run.stopRequested) return "stopped";
  if (run.failure !== null) return "failed";
  if (run.evictedOnServer) return "evicted";
  if (run.warnedOnPage) return "warned";
  if (run.published >= MAX_EVENTS) return "max_events";
  if (run.bytes + PROBE_EVENT_BYTES > MAX_BYTES) return "max_bytes";
  return null;
}

/** Publish tokens from `POST /session/<id>/token`; one request at a time. */
class PublishTokens {
  constructor(url) {
    this.url = url;
    this.token = null;
    this.pending = null;
  }

  get(fresh) {
    if (!fresh && this.token !== null) return Promise.resolve(this.token);
    if (this.pending === null) {
      this.pending = this.request().finally(() => {
        this.pending = null;
      });
    }
    return this.pending;
  }

  async request() {
    const response = await boundedFetch(this.url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrfToken() },
      body: JSON.stringify({ scope: "publish" }),
    });
    const answer = await readJson(response);
    if (answer.status !== 200 || answer.body === null || typeof answer.body.token !== "string") {
      throw new Error(`No publish token: ${describeApiError(answer.status, answer.body)}`);
    }
    this.token = answer.body.token;
    return this.token;
  }
}

/**
 * The console. `dom`: form, type, data, result, provoke, stop, provokeStatus. `urls`: token,
 * events, subscribers (staff only, else null). `page`: the session page's interface —
 * `isPaused()`, `setPaused(bool)`, `clientId`, `maxQueued()`, `maxQueuedBytes`,
 * `onSignal(callback(type, data))`.
 */
export class PublishConsole {
  constructor({ dom, urls, page }) {
    this.dom = dom;
    this.urls = urls;
    this.page = page;
    this.tokens = new PublishTokens(urls.token);
    this.run = null;
    this.enabled = true;
    page.onSignal((type) => {
      if (this.run === null) return;
      if (type === "slow_client_warning") this.run.warnedOnPage = true;
      if (type === "client_evicted") this.run.evictedOnPage = true;
      this.run.wake();
    });
  }

  bind() {
    this.dom.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.publishFromForm();
    });
    this.dom.provoke.addEventListener("click", () => this.provoke());
    this.dom.stop.addEventListener("click", () => {
      if (this.run !== null) {
        this.run.stopRequested = true;
        this.run.wake();
      }
    });
  }

  /**
   * Turn the console on or off (off once the session has ended: nothing more can be
   * published). Turning it off stops a running "Provoke backpressure" at its next step and
   * hides the last results, whose words are about a live session. Idempotent.
   */
  setEnabled(enabled) {
    this.enabled = enabled;
    for (const control of this.dom.form.elements) control.disabled = !enabled;
    this.dom.provoke.disabled = !enabled || this.run !== null;
    this.dom.stop.disabled = !enabled || this.run === null;
    if (!enabled) {
      this.dom.result.hidden = true;
      if (this.run !== null) {
        this.run.ended = true;
        this.run.wake();
      } else {
        this.dom.provokeStatus.hidden = true;
      }
    }
  }

  /** POST one event; `{ok: true, id, epoch}` or `{ok: false, text}` (words). Never throws. */
  async publish(body) {
    const key = newIdempotencyKey(); // one per event, reused by its retry
    for (const fresh of [false, true]) {
      let answer;
      try {
        const token = await this.tokens.get(fresh);
        const response = await boundedFetch(this.urls.events, {
          method: "POST",
          credentials: "omit",
          headers: {
            Authorization: `Bearer ${token}`,
            "Content-Type": "application/json",
            Accept: "application/json",
            "Idempotency-Key": key,
          },
          body,
        });
        answer = await readJson(response);
      } catch (error) {
        const text = error.name === "AbortError" ? "The server gave no answer in time." : error.message;
        return { ok: false, text };
      }
      if (answer.status === 200 && answer.body !== null && Number.isSafeInteger(answer.body.id)) {
        return { ok: true, id: answer.body.id, epoch: answer.body.epoch };
      }
      if (answer.status !== 401 || fresh) return { ok: false, text: describeApiError(answer.status, answer.body) };
    }
    return { ok: false, text: "Not authorized." };
  }

  async publishFromForm() {
    const type = this.dom.type.value;
    if (type.trim() === "") {
      this.say("error", "Give the event a type.");
      return;
    }
    const data = parseData(this.dom.data.value);
    if (!data.ok) {
      this.say("error", data.error);
      return;
    }
    const event = data.value === undefined ? { type } : { type, data: data.value };
    const submit = this.dom.form.querySelector("button[type=submit]");
    submit.disabled = true;
    const outcome = await this.publish(JSON.stringify(event));
    submit.disabled = !this.enabled;
    if (outcome.ok) this.say("ok", `Published event #${outcome.id} (epoch ${outcome.epoch}).`);
    else this.say("error", `Not published: ${outcome.text}`);
  }

  say(kind, text) {
    this.dom.result.dataset.kind = kind;
    this.dom.result.textContent = text;
    this.dom.result.hidden = false;
  }

  status(kind, text) {
    this.dom.provokeStatus.dataset.kind = kind;
    this.dom.provokeStatus.textContent = text;
    this.dom.provokeStatus.hidden = false;
  }

  // -- provoke backpressure --

  async provoke() {
    if (this.run !== null) return;
    const run = newRun();
    this.run = run;
    this.dom.provoke.disabled = true;
    this.dom.stop.disabled = false;
    const pausedByUs = !this.page.isPaused();
    if (pausedByUs) this.page.setPaused(true);
    const watched = this.urls.subscribers !== null;
    this.status(
      "busy",
      `Reading paused${pausedByUs ? " by the helper" : ""}: publishing 64 KiB events until the server warns and evicts this page's reader${
        watched ? "" : " (without staff rights this page cannot see the server's queue: it publishes up to 2,000 events)"
      }…`,
    );
    try {
      const watcher = watched ? this.watch(run) : Promise.resolve();
      await Promise.all(Array.from({ length: IN_FLIGHT }, () => this.publishProbes(run)));
      run.done = true;
      run.wake();
      await watcher;
      await this.finish(run, pausedByUs);
    } finally {
      this.run = null;
      this.dom.provoke.disabled = !this.enabled;
      this.dom.stop.disabled = true;
    }
  }

  async publishProbes(run) {
    while (stopReason(run) === null) {
      const n = run.published;
      const body = probeBody(n);
      run.published += 1;
      run.bytes += body.length;
      const outcome = await this.publish(body);
      if (!outcome.ok) run.failure = outcome.text;
      else run.lastId = Math.max(run.lastId, outcome.id);
      this.progress(run);
    }
  }

  /** Follow this page's own subscriber on the server until publishing is over (staff). */
  async watch(run) {
    const maxQueued = this.page.maxQueued();
    const maxQueuedBytes = this.page.maxQueuedBytes;
    while (!run.done) {
      try {
        const response = await boundedFetch(this.urls.subscribers, {
          credentials: "same-origin",
          headers: { Accept: "application/json" },
        });
        const answer = await readJson(response);
        if (answer.status === 200 && answer.body !== null && Array.isArray(answer.body.subscribers)) {
          const mine = answer.body.subscribers.filter((row) => row.clientId === this.page.clientId);
          if (run.ownId === null && mine.length > 0) run.ownId = mine[mine.length - 1].id;
          const row = mine.find((candidate) => candidate.id === run.ownId);
          if (row !== undefined) {
            run.queue = row;
            if (queuePastWarning(row, maxQueued, maxQueuedBytes)) run.warnedOnServer = true;
          } else if (run.ownId !== null) {
            run.evictedOnServer = true; // detached: evicted (EB-5), or otherwise ended
          }
          this.progress(run);
        }
      } catch {
        // one failed look is not a reason to stop: the bounds still hold
      }
      await run.sleep(WATCH_INTERVAL_MS);
    }
  }

  progress(run) {
    if (run.done) return;
    const queue =
      run.queue !== null
        ? ` · this page's queue on the server: ${run.queue.queuedFrames} frames, ${formatBytes(run.queue.queuedBytes)}${
            run.warnedOnServer ? " (slow_client_warning queued)" : ""
          }`
        : "";
    this.status("busy", `Published ${run.published} events (${formatBytes(run.bytes)})${queue}…`);
  }

  async finish(run, pausedByUs) {
    const why = stopReason(run);
    const sent = `${run.published} events (${formatBytes(run.bytes)})`;
    if (why === "ended") {
      this.status("ok", `Stopped: the session has ended (after ${sent}).`);
      if (pausedByUs) this.page.setPaused(false);
      return;
    }
    if (why === "failed") {
      this.status("error", `Stopped after ${sent}: ${run.failure}`);
      if (pausedByUs) this.page.setPaused(false);
      return;
    }
    if (this.page.isPaused() && !pausedByUs) {
      this.status(
        "ok",
        `Stopped after ${sent} (${lookup(STOP_REASONS, why)}). Resume reading to see slow_client_warning, then client_evicted.`,
      );
      return;
    }
    if (pausedByUs) this.page.setPaused(false);
    this.status("busy", `Stopped publishing after ${sent} (${lookup(STOP_REASONS, why)}); reading the backlog…`);
    const expectEviction = run.evictedOnServer;
    await run.until(() => run.warnedOnPage && (run.evictedOnPage || !expectEviction), SHOW_WAIT_MS);
    if (run.warnedOnPage && run.evictedOnPage) {
      this.status(
        "ok",
        `Done: after ${sent} this page's stream showed slow_client_warning, then client_evicted; it reconnects with its cursor and replay fills the gap.`,
      );
    } else if (run.warnedOnPage) {
      this.status("ok", `Done: after ${sent} this page's stream showed slow_client_warning (no eviction).`);
    } else {
      this.status(
        "error",
        `Stopped after ${sent} (${lookup(STOP_REASONS, why)}), and this page's stream showed no slow_client_warning: the buffers between the server and this page held everything. Set maxQueued to 16 and try again.`,
      );
    }
  }
}

const STOP_REASONS = {
  stopped: "stopped by you",
  ended: "the session has ended",
  evicted: "the server evicted this page's reader",
  warned: "this page's stream showed slow_client_warning",
  max_events: `the limit of ${MAX_EVENTS.toLocaleString("en-US")} events`,
  max_bytes: `the limit of ${formatBytes(MAX_BYTES)}`,
};

/** The state of one run, with a wake-up signal for waits that must end early. */
function newRun() {
  const run = {
    published: 0,
    bytes: 0,
    lastId: 0,
    failure: null,
    ended: false,
    stopRequested: false,
    done: false,
    ownId: null,
    queue: null,
    warnedOnServer: false,
    evictedOnServer: false,
    warnedOnPage: false,
    evictedOnPage: false,
    waiters: [],
    wake() {
      const waiters = run.waiters;
      run.waiters = [];
      for (const resolve of waiters) resolve();
    },
    /** Wait `ms`, or less if woken. */
    sleep(ms) {
      return new Promise((resolve) => {
        const timer = setTimeout(resolve, ms);
        run.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    },
    /** Wait until `predicate()` holds (checked at each wake-up), at most `ms`. */
    async until(predicate, ms) {
      const deadline = Date.now() + ms;
      while (!predicate() && Date.now() < deadline) await run.sleep(Math.min(500, deadline - Date.now()));
    },
  };
  return run;
}
