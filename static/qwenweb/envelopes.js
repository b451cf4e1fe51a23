/**
 * envelopes.js — what an event envelope says, in words, for the session page.
 *
 * The snapshot and the stream carry envelopes `{id?, type, data, _meta?}` (docs/protocol.md,
 * "Frames"); `session_update` data are ACP shapes. These pure helpers read them: the text of
 * a content block, the server's timestamp, the one-line note of the frame log, the words
 * for a `stream_error`. No DOM, no state; used by session_page.js, transcript.js and
 * session_snapshot.js.
 */
import { lookup } from "./lookup.js";
import { formatBytes } from "./subscribers.js";

const DISCONNECT_REASONS = {
  operator_disconnect: "an operator disconnected this reader",
  server_shutdown: "the server is shutting down",
  epoch_reset: "the server's copy of the session was reset",
  mirror_gap: "the server's copy of the session fell behind",
};

/** Cut `text` to `length` characters, the last one an ellipsis when cut. */
export function clip(text, length) {
  return text.length > length ? `${text.slice(0, length - 1)}…` : text;
}

/** True for a plain object (not null, not an array). */
export function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/** The server's `_meta.serverTimestamp` (epoch ms), or undefined when it has none. */
export function serverTime(envelope) {
  return isObject(envelope) && isObject(envelope._meta) ? envelope._meta.serverTimestamp : undefined;
}

/** The text of an ACP content block (`{type: "text", text}`), or a placeholder. */
export function contentText(content) {
  if (isObject(content) && content.type === "text" && typeof content.text === "string") return content.text;
  if (isObject(content) && typeof content.type === "string") return `[${content.type}]`;
  return "";
}

/** A one-line summary of an event for the frame log (`rawLength`: its data's size, chars). */
export function describeEvent(envelope, rawLength) {
  const data = envelope.data;
  let note;
  if (envelope.type === "session_update" && isObject(data)) {
    const text = contentText(data.content);
    note = String(data.sessionUpdate ?? "?");
    if (text) note += ` “${clip(text.replace(/\s+/g, " "), 40)}”`;
    else if (typeof data.status === "string") note += ` · ${data.status}`;
  } else {
    note = data === undefined ? "" : clip(JSON.stringify(data) ?? "", 60);
  }
  if (rawLength > 4096) note = `${formatBytes(rawLength)} · ${note}`;
  return note;
}

/** The connection panel's words for a `stream_error` frame's data (`{error?, code?, reason?}`). */
export function streamErrorText(data) {
  const why = lookup(DISCONNECT_REASONS, data.reason) ?? (typeof data.reason === "string" ? data.reason.replace(/_/g, " ") : "");
  const code = [data.code, data.reason].filter((part) => typeof part === "string").join(": ");
  return `${data.error ?? "the server ended the stream"}${why ? `: ${why}` : ""}${code ? ` (${code})` : ""}; reconnecting`;
}
