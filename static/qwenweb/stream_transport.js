/**
 * Which transport the session page's stream rides, and the client options for it: SSE
 * (./sse.js) by default, the multiplexed WebSocket (`GET /ws`, ./ws.js) with
 * `?transport=ws` in the page's URL. The page (./session_page.js) hands `options()` to its
 * SharedStream with `shareKey` (a WebSocket tab shares only with the session's other
 * WebSocket tabs: each tab reads its own transport) and `StreamClass`.
 *
 * Over SSE every attempt sends `X-Client-Id: <clientId>`, by which operators (and the
 * "Provoke backpressure" helper) find the page's subscriber. Over the WebSocket the token is
 * replaced in band (`refresh`) at TOKEN_REFRESH_AT of its lifetime.
 */
import { WsSessionStream, socketUrl } from "./ws.js";

/**
 * Over the WebSocket, a token is replaced in band at this fraction of its lifetime, counted
 * from when it arrived: half leaves room for a slow token request (and costs one token a
 * half-hour at the default lifetime).
 */
export const TOKEN_REFRESH_AT = 0.5;

export class StreamTransport {
  /**
   * @param {object} options
   * @param {object} options.config the page's config (`sessionId`, `urls.events`, `urls.socket`)
   * @param {object} options.tokens a TokenSource (./session_requests.js): `get(fresh)`,
   *   `expiresInS`, `issuedAtMs`
   * @param {string} options.clientId the page's `X-Client-Id`
   * @param {(error: unknown) => void} options.onCallbackError
   * @param {string} [options.search] the page URL's query (default `location.search`)
   */
  constructor({ config, tokens, clientId, onCallbackError, search = globalThis.location?.search ?? "" }) {
    this.config = config;
    this.tokens = tokens;
    this.clientId = clientId;
    this.onCallbackError = onCallbackError;
    this.overWebSocket = new URLSearchParams(search).get("transport") === "ws";
  }

  /** The SharedStream key: the session's id, with `:ws` over the WebSocket. */
  get shareKey() {
    return this.overWebSocket ? `${this.config.sessionId}:ws` : this.config.sessionId;
  }

  /** The stream class for SharedStream (undefined: its default, the SSE client). */
  get StreamClass() {
    return this.overWebSocket ? WsSessionStream : undefined;
  }

  /** The URL the connection panel shows. */
  get displayUrl() {
    return this.overWebSocket ? socketUrl(this.socketPath()) : this.config.urls.events;
  }

  /** A fresh options object for the chosen client (the caller may add `maxQueued`). */
  options() {
    return this.overWebSocket ? this.socketOptions() : this.sseOptions();
  }

  /** The SSE client's options (./sse.js). */
  sseOptions() {
    return {
      url: this.config.urls.events,
      // The same X-Client-Id on every attempt. sse.js builds the Headers; they are only added to.
      fetch: (input, init) => {
        init.headers.set("X-Client-Id", this.clientId);
        return fetch(input, init);
      },
      getToken: (reason) => this.tokens.get(reason === "unauthorized"),
      onCallbackError: this.onCallbackError,
    };
  }

  /** The WebSocket client's options (./ws.js): the token is refreshed in band before it expires. */
  socketOptions() {
    return {
      session: this.config.sessionId,
      url: this.socketPath(),
      getToken: (reason) => this.tokens.get(reason === "unauthorized" || reason === "refresh"),
      refreshAfterMs: () => this.tokenRefreshAfterMs(),
      onCallbackError: this.onCallbackError,
    };
  }

  /** Ms until the current token is TOKEN_REFRESH_AT through its life (from when it arrived), or null. */
  tokenRefreshAfterMs() {
    const { expiresInS, issuedAtMs } = this.tokens;
    if (!(expiresInS > 0)) return null;
    return Math.max(0, issuedAtMs + expiresInS * TOKEN_REFRESH_AT * 1000 - Date.now());
  }

  socketPath() {
    return this.config.urls.socket ?? "/ws";
  }
}
