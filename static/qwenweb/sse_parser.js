/**
 * sse_parser.js — the hand-written Server-Sent Events parser (SC-1..SC-8).
 *
 * The parsing algorithm of WHATWG HTML §9.2.6, as a push parser for one stream, and the
 * Content-Type check the client applies before parsing (SC-10). No DOM dependency and no
 * I/O: it runs unchanged in the browser and under Node 20 (`node --test tests/js/`). The
 * reconnecting client that feeds it is `SessionEventStream` (./sse.js, which re-exports
 * both functions: the shared spec's parser interface imports `createParser` from sse.js).
 * Rules cited as `SC-n` and `EB-n` are in `docs/protocol.md` (its rule index).
 *
 * Exports
 *
 * - `createParser({ onEvent, onRetry, onComment, lastEventId })` → `SseParser`
 *   `feed(text)`, `feedBytes(uint8)`, `end()`, getters `lastEventId` (string, "" if none)
 *   and `retry` (ms or null).
 * - `contentTypeEssence(value)` — the lower-cased MIME essence of a Content-Type value.
 *
 * Concurrency: synchronous; the callbacks run inside `feed()` / `feedBytes()` / `end()`.
 */

const LF = "\n";
const CR = "\r";
const BOM = 0xfeff;
const RETRY_DIGITS = /^[0-9]+$/;

/**
 * @typedef {object} ParsedEvent
 * @property {string} type         The `event` field, or "message" when the block had none.
 * @property {string} data         The data lines joined with LF (one trailing LF removed).
 * @property {string} lastEventId  The last event ID string in force at dispatch ("" if none).
 * @property {string|null} idField The `id` field of this event's own block, or null when the
 *   block had none (synthetic frames, SC-9). Not part of the shared vectors' shape.
 */

/**
 * @typedef {object} ParserCallbacks
 * @property {(event: ParsedEvent) => void} onEvent  Called once per dispatched event, as soon
 *   as its blank line is parsed (SC-8).
 * @property {(ms: number) => void} [onRetry]  Called for every valid `retry` field, in
 *   milliseconds (SC-5).
 * @property {(text: string) => void} [onComment]  Called for every comment line with the text
 *   after the colon, one leading space removed (heartbeats, SC-4).
 * @property {string} [lastEventId]  Initial last event ID string *and* buffer (default "").
 *   A reconnecting client passes its cursor so that a block without an `id` field (the
 *   server's leading `retry: 3000` block, EB-18) does not blank it; this is what browsers do
 *   for EventSource across reconnections.
 */

/**
 * @typedef {object} SseParser
 * @property {(text: string) => void} feed  Feed decoded text, split anywhere.
 * @property {(bytes: Uint8Array) => void} feedBytes  Feed raw UTF-8 bytes, split anywhere.
 * @property {() => void} end  End of stream: flush the decoder, discard the unfinished block.
 * @property {string} lastEventId  The last event ID string now in force ("" if none).
 * @property {number|null} retry  The last valid `retry` value in ms, or null if none yet.
 */

/**
 * Create a push parser for one event stream (WHATWG HTML §9.2.6, SC-1..SC-8).
 *
 * Feed it text with `feed()` or bytes with `feedBytes()` (never both on one parser unless
 * every byte chunk ended on a character boundary), then call `end()` once. Events, retry
 * values and comments are reported synchronously through the callbacks while feeding.
 *
 * Guarantees:
 * - exactly one leading U+FEFF of the stream is dropped; empty chunks before it do not count
 *   (SC-2); `feedBytes` decodes with one `TextDecoder("utf-8", {ignoreBOM: true})` in
 *   streaming mode, so a character split across chunks comes out whole (SC-1);
 * - lines end at CRLF, LF or CR only; a CR ending one chunk and an LF starting the next are
 *   one line ending (SC-3);
 * - an event is dispatched when its blank line arrives (SC-8); `end()` discards the
 *   unfinished block and its uncommitted id, and never processes an unterminated line (SC-7);
 * - O(n) in the total input, however it is split: each character is scanned once and a
 *   partial line is kept as a list of pieces joined once when its line ends.
 *
 * A callback that throws propagates out of `feed()`; the rest of that chunk is not parsed.
 *
 * @param {ParserCallbacks} callbacks
 * @returns {SseParser}
 * @throws {TypeError} if `onEvent` is not a function, or `lastEventId` is not a string.
 */
export function createParser({ onEvent, onRetry, onComment, lastEventId = "" } = {}) {
  if (typeof onEvent !== "function") throw new TypeError("createParser: onEvent must be a function");
  if (typeof lastEventId !== "string") throw new TypeError("createParser: lastEventId must be a string");

  let decoder = null;
  let started = false; // a non-empty chunk has been seen: the BOM window is closed (SC-2)
  let ended = false;
  let pendingCR = false; // the previous chunk ended with CR: a leading LF is part of it (SC-3)
  /** @type {string[]} pieces of the current, not yet terminated line */
  let linePieces = [];
  /** @type {string[]} values of the block's data fields (joined with LF at dispatch) */
  let dataLines = [];
  let eventType = "";
  let idBuffer = lastEventId;
  let idFieldInBlock = null;
  let lastEventIdString = lastEventId;
  let retryMs = null;

  function dispatch() {
    // HTML §9.2.6 "dispatch the event": the id buffer is committed but not reset (SC-6).
    lastEventIdString = idBuffer;
    const idField = idFieldInBlock;
    idFieldInBlock = null;
    if (dataLines.length === 0) {
      eventType = "";
      return;
    }
    const event = {
      type: eventType === "" ? "message" : eventType,
      data: dataLines.join(LF),
      lastEventId: lastEventIdString,
      idField,
    };
    dataLines = [];
    eventType = "";
    onEvent(event);
  }

  function processField(name, value) {
    switch (name) {
      case "data":
        dataLines.push(value);
        break;
      case "event":
        eventType = value;
        break;
      case "id":
        if (!value.includes("\u0000")) {
          idBuffer = value;
          idFieldInBlock = value;
        }
        break;
      case "retry":
        if (RETRY_DIGITS.test(value)) {
          retryMs = Number.parseInt(value, 10);
          if (onRetry) onRetry(retryMs);
        }
        break;
      default:
        break; // unknown fields are ignored (SC-5)
    }
  }

  function processLine(line) {
    if (line === "") {
      dispatch();
      return;
    }
    const colon = line.indexOf(":");
    if (colon === 0) {
      if (onComment) onComment(stripOneSpace(line.slice(1)));
      return;
    }
    if (colon === -1) {
      processField(line, "");
      return;
    }
    processField(line.slice(0, colon), stripOneSpace(line.slice(colon + 1)));
  }

  function feed(text) {
    if (ended) throw new Error("SseParser: feed() after end()");
    if (typeof text !== "string") throw new TypeError("SseParser: feed() takes a string");
    if (text.length === 0) return; // keeps pendingCR and the BOM window as they are
    let pos = 0;
    if (!started) {
      started = true;
      if (text.charCodeAt(0) === BOM) pos = 1;
    }
    if (pendingCR) {
      pendingCR = false;
      if (text.charCodeAt(pos) === 0x0a) pos += 1;
    }
    const length = text.length;
    // Next LF / CR at or after pos; -1 = none left in this chunk. Each is searched again only
    // once pos has passed it, so every character is scanned at most once per kind.
    let nextLF = -2;
    let nextCR = -2;
    while (pos < length) {
      if (nextLF !== -1 && nextLF < pos) nextLF = text.indexOf(LF, pos);
      if (nextCR !== -1 && nextCR < pos) nextCR = text.indexOf(CR, pos);
      const end = nextLF === -1 ? nextCR : nextCR === -1 ? nextLF : Math.min(nextLF, nextCR);
      if (end === -1) {
        linePieces.push(text.slice(pos));
        break;
      }
      let line = text.slice(pos, end);
      if (linePieces.length > 0) {
        linePieces.push(line);
        line = linePieces.join("");
        linePieces = [];
      }
      if (end === nextCR) {
        if (end + 1 < length) {
          pos = text.charCodeAt(end + 1) === 0x0a ? end + 2 : end + 1;
        } else {
          pendingCR = true;
          pos = length;
        }
      } else {
        pos = end + 1;
      }
      processLine(line);
    }
  }

  function feedBytes(bytes) {
    if (ended) throw new Error("SseParser: feedBytes() after end()");
    if (decoder === null) decoder = new TextDecoder("utf-8", { ignoreBOM: true });
    feed(decoder.decode(bytes, { stream: true }));
  }

  function end() {
    if (ended) return;
    if (decoder !== null) feed(decoder.decode()); // an incomplete sequence becomes U+FFFD
    ended = true;
    // SC-7: the unfinished block is discarded and its id is not committed.
    linePieces = [];
    dataLines = [];
    eventType = "";
    idBuffer = lastEventIdString;
    idFieldInBlock = null;
    pendingCR = false;
  }

  return {
    feed,
    feedBytes,
    end,
    get lastEventId() {
      return lastEventIdString;
    },
    get retry() {
      return retryMs;
    },
  };
}

function stripOneSpace(value) {
  return value.charCodeAt(0) === 0x20 ? value.slice(1) : value;
}

/**
 * Return the lower-cased essence (`type/subtype`) of a Content-Type header value.
 *
 * `"Text/Event-Stream; charset=utf-8"` → `"text/event-stream"`; null or "" → "". Used for
 * the SC-10 response check, where parameters and letter case are ignored. Never throws.
 *
 * @param {string|null|undefined} value
 * @returns {string}
 */
export function contentTypeEssence(value) {
  if (!value) return "";
  const semicolon = value.indexOf(";");
  return (semicolon === -1 ? value : value.slice(0, semicolon)).trim().toLowerCase();
}
