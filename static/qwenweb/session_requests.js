/**
 * session_requests.js — the session page's requests for its token and its snapshot.
 *
 * - `TokenSource` — short-lived read tokens from `POST /session/<id>/token` (login session +
 *   CSRF header), kept until the stream or the snapshot says one was rejected (SC-10).
 * - `fetchSnapshot(url, tokens, onWaiting)` — `GET /session/<id>` with a bearer token (one
 *   fresh token on a 401); a request without response headers after 5 s is reported to
 *   `onWaiting` (./connection_wait.js).
 * - `HttpError` (a failed request, with its `status`), `errorDetail(response)` and
 *   `failureText(response)`: a refusal in words, never a raw code.
 *
 * The stream's own requests are sse.js's; the publish console's and the subscribers
 * table's are theirs.
 */
import { readErrorEnvelope } from "./api_error.js";
import { watchRequest } from "./connection_wait.js";
import { isObject } from "./envelopes.js";
import { lookup } from "./lookup.js";
import { csrfToken } from "./subscribers.js";

/** A request that failed: `status` is its HTTP status (200 for a malformed answer). */
export class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** The server's words for a refusal (the JSON envelope's `error`), never its code. */
export async function errorDetail(response) {
  return (await readErrorEnvelope(response)).error ?? "";
}

const STATUS_WORDS = {
  400: "the request was refused",
  401: "not logged in",
  403: "not allowed",
  404: "unknown session",
  409: "not possible now",
  429: "too many requests",
};

/** A failed response in words: the server's message, else what its status means. */
export async function failureText(response) {
  const detail = await errorDetail(response);
  if (detail) return detail;
  if (response.status >= 500) return `the server failed (HTTP ${response.status})`;
  return lookup(STATUS_WORDS, response.status) ?? `HTTP ${response.status}`;
}

/** Short-lived read tokens from `POST /session/<id>/token` (login session + CSRF). */
export class TokenSource {
  constructor(url, onIssued) {
    this.url = url;
    this.onIssued = onIssued;
    this.token = null;
    this.pending = null;
    this.issued = 0;
    this.expiresInS = 0; // the last token's lifetime, seconds (0: not told)
    this.issuedAtMs = 0; // when it arrived (Date.now())
  }

  /** The current token, or a new one when `fresh` (the last one was rejected) or none yet. */
  get(fresh) {
    if (!fresh && this.token !== null) return Promise.resolve(this.token);
    if (this.pending === null) {
      this.pending = this._request().finally(() => {
        this.pending = null;
      });
    }
    return this.pending;
  }

  async _request() {
    const response = await fetch(this.url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrfToken() },
      body: JSON.stringify({ scope: "read" }),
    });
    if (!response.ok) {
      throw new HttpError(response.status, `could not get a read token: ${await failureText(response)}`);
    }
    const body = await response.json();
    if (!isObject(body) || typeof body.token !== "string" || body.token === "") {
      throw new HttpError(response.status, "token response carried no token");
    }
    this.token = body.token;
    this.expiresInS = Number.isFinite(body.expiresInS) ? body.expiresInS : 0;
    this.issuedAtMs = Date.now();
    this.issued += 1;
    this.onIssued(this.issued);
    return this.token;
  }
}

/**
 * `GET url` (the snapshot; `?before=` pages back) with a read token of `tokens`; one fresh
 * token on a 401. `onWaiting(waiting)` as `watchRequest` reports it.
 * @returns {Promise<object>} the snapshot, with its `events` array
 * @throws {HttpError} a status other than 2xx, or an answer without `events`; what the
 *   token source or `fetch` throw (a network failure) passes through
 */
export async function fetchSnapshot(url, tokens, onWaiting) {
  const get = (token) =>
    watchRequest(
      fetch(url, { headers: { Authorization: `Bearer ${token}`, Accept: "application/json" }, credentials: "omit" }),
      onWaiting,
    );
  let response = await get(await tokens.get(false));
  if (response.status === 401) response = await get(await tokens.get(true));
  if (!response.ok) throw new HttpError(response.status, `GET ${url}: HTTP ${response.status} ${await errorDetail(response)}`);
  const snapshot = await response.json();
  if (!isObject(snapshot) || !Array.isArray(snapshot.events)) throw new HttpError(200, "the snapshot is malformed");
  return snapshot;
}
