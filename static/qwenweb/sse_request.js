/**
 * sse_request.js — the HTTP edges of one attempt of the session page's stream.
 *
 * What `SessionEventStream` (./sse.js) sends on every attempt (its URL with `?maxQueued=`,
 * EB-14; its headers, SC-9) and what it does with an answer it does not read as a stream
 * (SC-10): the body is cancelled, an error body's JSON `code` / `error` becomes the stop's
 * `detail`. Pure helpers, no state, no DOM dependency; they run under Node 20. Rules cited
 * as `SC-n` and `EB-n` are in `docs/protocol.md` (its rule index).
 */

import { readErrorEnvelope } from "./api_error.js";

/**
 * Build the headers of one attempt: a fresh `Headers` each time, so that `Last-Event-ID` is
 * set exactly once (SC-9). The cursor goes only when it is not empty, and `X-Event-Epoch`
 * only with a cursor whose epoch is known (EB-13, EB-17). Never throws for a `token` and a
 * `lastEventId` free of CR, LF and NUL (the stream checks both).
 *
 * @param {string} token  The bearer token of this attempt.
 * @param {string} lastEventId  The cursor ("" = none).
 * @param {string|null} epoch  The epoch the cursor belongs to, or null.
 * @returns {Headers}
 */
export function requestHeaders(token, lastEventId, epoch) {
  const headers = new Headers();
  headers.set("Accept", "text/event-stream");
  headers.set("Authorization", `Bearer ${token}`);
  if (lastEventId !== "") {
    headers.set("Last-Event-ID", utf8ByteString(lastEventId));
    if (epoch !== null) headers.set("X-Event-Epoch", epoch);
  }
  return headers;
}

/** Cancel a response's body that will not be read, if it has one; never throws. */
export function discardBody(response) {
  if (response.body && !response.bodyUsed) response.body.cancel().catch(() => {});
}

/**
 * The `code: error` of a refusal's JSON body (either alone when the other is missing), or
 * undefined when the body is not such JSON. Reads the body; never throws.
 */
export async function readErrorDetail(response) {
  const { code, error } = await readErrorEnvelope(response);
  const parts = [code, error].filter((part) => part !== undefined);
  return parts.length > 0 ? parts.join(": ") : undefined;
}

/** Encode a string as UTF-8 and return one char per byte, so fetch sends UTF-8 (SC-9). */
function utf8ByteString(text) {
  const bytes = new TextEncoder().encode(text);
  let out = "";
  for (const byte of bytes) out += String.fromCharCode(byte);
  return out;
}

/** `url` with `name=value` added to its query, before any `#fragment`; never throws. */
export function withQueryParam(url, name, value) {
  const hash = url.indexOf("#");
  const base = hash === -1 ? url : url.slice(0, hash);
  const fragment = hash === -1 ? "" : url.slice(hash);
  const separator = base.includes("?") ? (base.endsWith("?") || base.endsWith("&") ? "" : "&") : "?";
  return `${base}${separator}${encodeURIComponent(name)}=${encodeURIComponent(value)}${fragment}`;
}
