// Helpers of the WebSocket client tests (tests/js/ws_client.test.mjs): a fake WebSocket the
// test drives as the server would (open, reply, push frames, close with a code), and
// (./timer_support.mjs) timers fired by hand and `until()`, which yields to the event loop a
// bounded number of times. No wall clock.
import { SessionSocket, WsSessionStream } from "../../static/qwenweb/ws.js";
import { fakeTimers, settle, T, until } from "./timer_support.mjs";

export { settle, T, until };

export const BASE = "http://127.0.0.1:8000/sessions/s1/";

/**
 * Fake WebSockets: every socket the client makes is recorded; the test plays the server.
 * `sent` holds the parsed messages the client sent; `close()` by the client records its
 * code and (like a browser) no event reaches handlers the client already removed.
 */
export function fakeSockets() {
  const sockets = [];
  class FakeWebSocket {
    constructor(url, protocols) {
      this.url = url;
      this.protocols = protocols;
      this.readyState = 0;
      this.protocol = "";
      this.sent = [];
      this.closedBy = null;
      this.onopen = this.onmessage = this.onclose = this.onerror = null;
      sockets.push(this);
    }

    send(text) {
      if (this.readyState !== 1) throw new Error("InvalidStateError: not open");
      this.sent.push(JSON.parse(text));
    }

    close(code, reason) {
      if (this.readyState >= 2) return;
      this.readyState = 3;
      this.closedBy = { code, reason };
      if (this.onclose) this.onclose({ code, reason, wasClean: true });
    }

    // -- the server's side --

    accept(protocol = "qwenweb.v1") {
      this.readyState = 1;
      this.protocol = protocol;
      if (this.onopen) this.onopen({});
    }

    push(message) {
      if (this.onmessage) this.onmessage({ data: JSON.stringify(message) });
    }

    /** Answer the client message `message` (found in `sent`) with `body`. */
    reply(message, body = { ok: true }) {
      this.push({ op: "reply", ref: message.ref, session: message.session, ...body });
    }

    frame(session, envelope) {
      this.push({ op: "frame", session, frame: envelope });
    }

    /** The server (or the network) ends the socket. */
    cut(code = 1006, reason = "") {
      this.readyState = 3;
      if (this.onclose) this.onclose({ code, reason, wasClean: code !== 1006 });
    }

    ops(op) {
      return this.sent.filter((message) => message.op === op);
    }
  }
  return { WebSocket: FakeWebSocket, sockets, last: () => sockets.at(-1) };
}

/** A real event's envelope (with its id) or a synthetic frame's (without). */
export const envelope = (id, type, data = {}) => ({ ...(id === null ? {} : { id }), v: 1, type, data });

/** Streams over one fake socket (or one of their own), recording every callback. */
export function harness({ tokens, shared = true } = {}) {
  const net = fakeSockets();
  const timers = fakeTimers();
  const base = {
    url: "/ws",
    WebSocket: net.WebSocket,
    random: () => 0.5,
    setTimeout: timers.setTimeout,
    clearTimeout: timers.clearTimeout,
  };
  globalThis.location = { href: BASE };
  const socket = shared ? new SessionSocket(base) : undefined;
  const made = [];
  const make = (session, options = {}) => {
    const log = { states: [], events: [], delays: [], resyncs: [], tokenReasons: [], comments: [] };
    const list = options.tokens ?? tokens ?? ["t1", "t2", "t3", "t4", "t5", "t6"];
    const stream = new WsSessionStream({
      ...base,
      socket,
      session,
      getToken: options.getToken ?? (async (reason) => {
        log.tokenReasons.push(reason);
        return `${session}-${list[Math.min(log.tokenReasons.length, list.length) - 1]}`;
      }),
      onEvent: (event) => log.events.push(event),
      onStateChange: (state, info) => log.states.push([state, info.reason]),
      onRetryScheduled: (delayMs) => log.delays.push(delayMs),
      onResyncRequired: (frame) => log.resyncs.push(frame),
      onComment: (text) => log.comments.push(text),
      onCallbackError: (error) => {
        throw error;
      },
      ...options.stream,
    });
    const entry = { stream, log, lastState: () => log.states.at(-1)?.[0] };
    made.push(entry);
    return entry;
  };
  return { net, timers, socket, make, made };
}

/**
 * Accept the newest socket (unless open), wait for its `total`-th subscribe and answer the
 * last `count` with ok and `epoch`.
 */
export async function acceptAndSubscribe(h, count, epoch = "E1", total = count) {
  const ws = h.net.last();
  if (ws.readyState === 0) ws.accept();
  await until(() => ws.ops("subscribe").length >= total, `${total} subscribe messages`);
  for (const message of ws.ops("subscribe").slice(-count)) ws.reply(message, { ok: true, epoch, lastEventId: 0 });
  return ws;
}

/**
 * A harness (`shared`: one socket for all its streams) with one stream on session "s1"
 * (`make`'s other options), started and subscribed: `{h, a, ws}`.
 */
export async function openStream({ shared = true, ...options } = {}) {
  const h = harness({ shared });
  const a = h.make("s1", options);
  a.stream.start();
  const ws = await acceptAndSubscribe(h, 1);
  return { h, a, ws };
}

/** Accept the newest socket, wait for its first subscribe and refuse it with `error`. */
export async function refuseFirstSubscribe(h, error) {
  const ws = h.net.last();
  ws.accept();
  await until(() => ws.ops("subscribe").length === 1, "subscribe");
  ws.reply(ws.ops("subscribe")[0], { ok: false, error });
  return ws;
}
