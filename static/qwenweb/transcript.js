/**
 * transcript.js — the session page's transcript (`#transcript`), drawn from its events.
 *
 * `Transcript` renders the ACP shapes of `session_update` events (agent and user messages,
 * thoughts, one card per tool call with its duration and outcome) grouped into turns
 * (`turn_complete` ends one; ./transcript_model.js), and markers for `session_closed`,
 * `history_truncated` and lost spans between turns; every other type is shown in the frame
 * log only, and counted for the empty state ("No agent messages or tool calls yet: 1,206
 * events of other types (note ×1,206)"). Every block links to its event ids (`#e<id>`,
 * ./event_links.js) and keeps its events for the JSON dialog (`eventsOf`). It keeps no cursor:
 * the page applies each event once and in order (session_page.js), and clears and redraws
 * it from the snapshot on a resync (SC-12, session_snapshot.js), which also draws the "load
 * earlier" pages with a Transcript of their own. Follow mode is frame_log.js's `Follower`.
 *
 * Safety: text from events only ever goes in as text nodes / `textContent`, never as HTML.
 */
import { contentText, isObject, serverTime } from "./envelopes.js";
import { Follower, h, setText } from "./frame_log.js";
import { lookup } from "./lookup.js";
import { TurnTracker, emptyText, formatDuration, nextToolState } from "./transcript_model.js";

const ROLE_LABELS = { agent: "Agent", user: "User", thought: "Thinking" };

/** The text of an ACP tool call's `content` list (content blocks, diffs, terminals). */
function toolContentText(items) {
  if (!Array.isArray(items)) return "";
  return items
    .map((item) => {
      if (!isObject(item)) return "";
      if (item.type === "content") return contentText(item.content);
      if (item.type === "diff") return `[diff ${typeof item.path === "string" ? item.path : ""}]`;
      return `[${String(item.type)}]`;
    })
    .filter(Boolean)
    .join("\n");
}

/** Events kept per block for its JSON (a long message keeps its first ones). */
const MAX_BLOCK_EVENTS = 500;
/** Block → its envelopes; shared by every Transcript, so blocks that "Load earlier events"
 * drew with a Transcript of their own open their JSON too. */
const BLOCK_EVENTS = new WeakMap();

/** A link to event `id` (`#e<id>`, ./event_links.js), its text `#<id>` unless given. */
export function eventLink(id, text = `#${id}`) {
  const link = h("a", "event-link", text);
  link.href = `#e${id}`;
  return link;
}

/**
 * The agent's transcript from `session_update` events (ACP shapes), in turns: consecutive
 * `agent_message_chunk` texts are joined into one message, `user_message_chunk` into the
 * user's, and `tool_call` / `tool_call_update` are one card per `toolCallId` with its
 * status, its duration (server timestamps of its first and its final event) and its outcome
 * (`failed` marked). `root` is the element drawn into (its `.transcript-empty` child is the
 * placeholder shown while it is empty, with words true to what was applied);
 * `countElement` says "N turns · through #<last id>".
 */
export class Transcript {
  constructor(root, countElement) {
    this.root = root;
    this.countElement = countElement;
    this.placeholder = root.querySelector(".transcript-empty");
    this.follower = new Follower(root);
    this.loaded = false;
    this.clear();
  }

  clear() {
    this.root.replaceChildren(...(this.placeholder ? [this.placeholder] : []));
    this.current = null;
    this.tools = new Map();
    this.turns = new TurnTracker();
    this.turn = null; // the open turn's {section, meta, info}
    this.turnCount = 0;
    this.entries = 0;
    this.events = 0;
    this.otherTypes = new Map();
    this.closed = false;
    this.lastId = null;
    this._renderCount();
  }

  /** The snapshot was drawn (or could not be): the empty state may now say what there is. */
  setLoaded() {
    this.loaded = true;
    this._renderCount();
  }

  /** The envelopes a transcript block (message, tool card, marker) was drawn from. */
  eventsOf(block) {
    return BLOCK_EVENTS.get(block) ?? [];
  }

  /** Render one envelope (`{id?, type, data}`); types without a transcript form are counted. */
  apply(envelope) {
    const id = Number.isSafeInteger(envelope.id) ? envelope.id : null;
    if (id !== null) {
      this.lastId = id;
      this.events += 1;
    }
    const data = isObject(envelope.data) ? envelope.data : null;
    switch (envelope.type) {
      case "session_update":
        this._turnOf(envelope);
        if (data !== null) this._sessionUpdate(data, envelope);
        break;
      case "turn_complete":
        this._turnComplete(envelope, data ?? {});
        break;
      case "session_closed":
        this.closed = true;
        this._outsideTurn("unfinished: the session closed");
        this._marker(
          "closed",
          `Session closed${data && data.closedBy ? ` by ${data.closedBy}` : ""}${data && data.reason ? ` (${data.reason})` : ""}`,
          envelope,
        );
        break;
      case "history_truncated":
        this._outsideTurn("continued below");
        this._marker(
          "truncated",
          `Earlier events are no longer kept by the server: history starts at #${data ? data.earliestAvailableId : "?"}.`,
          null,
        );
        break;
      default:
        // shown in the frame log only; counted for the empty state
        if (id !== null) this.otherTypes.set(String(envelope.type), (this.otherTypes.get(String(envelope.type)) ?? 0) + 1);
        break;
    }
    this._renderCount();
  }

  /**
   * Keep what is drawn, greyed (class `stale`): what follows starts new turns, messages and
   * tool cards below it (a resync or a restart, SC-12; nothing on screen is thrown away).
   */
  retire() {
    for (const node of this.root.children) {
      if (node === this.placeholder) continue;
      if (node.classList.contains("turn")) for (const child of node.children) child.classList.add("stale");
      else node.classList.add("stale");
    }
    this._outsideTurn("continued below");
    this.tools = new Map();
  }

  /** Add a note that is not an event (e.g. the session is closed, a span was lost). */
  note(kind, text) {
    if (kind === "closed") this.closed = true;
    this._outsideTurn(kind === "closed" ? "unfinished: the session closed" : "continued below");
    this._marker(kind, text, null);
    this._renderCount();
  }

  // -- turns --

  /** The open turn's section, opened for `envelope` when none is. */
  _turnOf(envelope) {
    const { turn, opened } = this.turns.add(envelope);
    if (!opened) return this.turn;
    const section = h("section", "turn");
    const head = h("header", "turn-head");
    const title = h("h3", "turn-title", turn.number === null ? "Turn" : `Turn ${turn.number}`);
    const meta = h("span", "turn-meta", "in progress");
    head.append(title, meta);
    section.append(head);
    if (turn.firstId !== null) section.dataset.firstId = String(turn.firstId);
    this.current = null;
    this._append(section);
    this.turnCount += 1;
    this.turn = { section, title, meta, info: turn };
    return this.turn;
  }

  _turnComplete(envelope, data) {
    const open = this._turnOf(envelope);
    const { info, section, title, meta } = open;
    if (info.number !== null) setText(title, `Turn ${info.number}`);
    const took = info.startMs !== null && info.endMs !== null ? ` · ${formatDuration(info.endMs - info.startMs)}` : "";
    setText(meta, `${info.stopReason ? info.stopReason.replace(/_/g, " ") : "complete"}${took}`);
    section.dataset.complete = "true";
    if (info.lastId !== null) section.dataset.lastId = String(info.lastId);
    this._marker(
      "turn",
      `Turn${data.turn !== undefined ? ` ${data.turn}` : ""} complete${typeof data.stopReason === "string" ? ` · ${data.stopReason}` : ""}`,
      envelope,
    );
    this.turn = null;
  }

  /**
   * A marker between turns: the open turn stays unfinished (its head says `why`), what
   * follows opens a new one.
   */
  _outsideTurn(why) {
    if (this.turn !== null) setText(this.turn.meta, why);
    this.turns.interrupt();
    this.turn = null;
    this.current = null;
  }

  // -- blocks --

  _sessionUpdate(update, envelope) {
    switch (update.sessionUpdate) {
      case "agent_message_chunk":
        this._chunk("agent", update.content, envelope);
        break;
      case "user_message_chunk":
        this._chunk("user", update.content, envelope);
        break;
      case "agent_thought_chunk":
        this._chunk("thought", update.content, envelope);
        break;
      case "tool_call":
      case "tool_call_update":
        this._tool(update, envelope);
        break;
      default:
        break;
    }
  }

  _append(node) {
    if (this.placeholder && this.placeholder.isConnected) this.placeholder.remove();
    (this.turn !== null && node.tagName !== "SECTION" ? this.turn.section : this.root).append(node);
    this.entries += 1;
    this.follower.kick();
  }

  /** Keep `envelope` for the JSON of `block`; its id becomes the block's last. */
  _keep(block, envelope) {
    let events = BLOCK_EVENTS.get(block);
    if (events === undefined) {
      events = [];
      BLOCK_EVENTS.set(block, events);
    }
    if (events.length < MAX_BLOCK_EVENTS) events.push(envelope);
    if (Number.isSafeInteger(envelope.id)) {
      if (block.dataset.firstId === undefined) block.dataset.firstId = String(envelope.id);
      block.dataset.lastId = String(envelope.id);
    }
    if (this.turn !== null && Number.isSafeInteger(envelope.id)) this.turn.section.dataset.lastId = String(envelope.id);
  }

  /** A head's ids and its JSON button: `#a–b` links to the first and the last event. */
  _ids(block, ids, envelope) {
    const id = Number.isSafeInteger(envelope.id) ? envelope.id : null;
    if (id === null) return;
    const first = Number(block.dataset.firstId);
    if (ids.childNodes.length === 0) ids.append(eventLink(first));
    if (id !== first) {
      if (ids.childNodes.length === 1) ids.append("–", eventLink(id, String(id)));
      const last = ids.childNodes[2];
      last.href = `#e${id}`;
      setText(last, String(id));
    }
  }

  _jsonButton(label) {
    const button = h("button", "btn-json", "JSON");
    button.type = "button";
    button.setAttribute("aria-label", `JSON of ${label}`);
    button.setAttribute("aria-haspopup", "dialog");
    return button;
  }

  _chunk(role, content, envelope) {
    let current = this.current;
    if (current === null || current.role !== role) {
      const block = h("article", `msg msg-${role}`);
      block.dataset.role = role;
      const head = h("header", "msg-head");
      const ids = h("span", "msg-ids mono");
      head.append(h("span", "msg-role", lookup(ROLE_LABELS, role)), ids, this._jsonButton(`this ${role} message`));
      const body = h("div", "msg-text");
      const textNode = document.createTextNode("");
      body.append(textNode);
      block.append(head, body);
      this._append(block);
      current = { role, block, ids, textNode };
      this.current = current;
    }
    current.textNode.appendData(contentText(content));
    this._keep(current.block, envelope);
    this._ids(current.block, current.ids, envelope);
    this.follower.kick();
  }

  _tool(update, envelope) {
    const id = Number.isSafeInteger(envelope.id) ? envelope.id : null;
    const callId = typeof update.toolCallId === "string" ? update.toolCallId : `event-${id}`;
    let card = this.tools.get(callId);
    if (card === undefined) {
      const element = h("article", "tool");
      element.dataset.toolCallId = callId;
      const head = h("header", "tool-head");
      const kind = h("span", "tool-kind", "tool");
      const title = h("span", "tool-title", callId);
      const duration = h("span", "tool-duration mono", "");
      const status = h("span", "tool-status", "pending");
      status.dataset.status = "pending";
      const ids = h("span", "msg-ids mono");
      head.append(kind, title, duration, status, ids, this._jsonButton(`tool call ${callId}`));
      const output = h("pre", "tool-output");
      output.hidden = true;
      element.append(head, output);
      card = { element, kind, title, duration, status, ids, output, state: null };
      this.tools.set(callId, card);
      this.current = null; // text after a tool call is a new message
      this._append(element);
    }
    card.state = nextToolState(card.state, update, serverTime(envelope));
    const { state } = card;
    if (typeof update.title === "string" && update.title) card.title.textContent = update.title;
    if (typeof update.kind === "string" && update.kind) card.kind.textContent = update.kind;
    setText(card.status, state.outcome === "failed" ? "✕ failed" : state.status.replace(/_/g, " "));
    card.status.dataset.status = state.status;
    card.element.dataset.status = state.status;
    if (state.outcome !== null) card.element.dataset.outcome = state.outcome;
    else delete card.element.dataset.outcome;
    setText(card.duration, state.durationMs !== null ? formatDuration(state.durationMs) : "");
    card.duration.title = state.durationMs !== null ? "from the call's first event to its final status (server time)" : "";
    if (Array.isArray(update.content)) {
      const text = toolContentText(update.content);
      card.output.textContent = text;
      card.output.hidden = text === "";
    }
    this._keep(card.element, envelope);
    this._ids(card.element, card.ids, envelope);
    if (id !== null) card.element.dataset.ids = `${card.element.dataset.ids ?? ""} ${id}`.trim();
  }

  _marker(kind, text, envelope) {
    const marker = h("div", `marker marker-${kind}`);
    marker.append(h("span", "marker-text", text));
    if (envelope !== null && Number.isSafeInteger(envelope.id)) {
      marker.dataset.id = String(envelope.id);
      marker.append(eventLink(envelope.id), this._jsonButton(`event ${envelope.id}`));
    }
    this.current = null;
    this._append(marker);
    if (envelope !== null) this._keep(marker, envelope);
  }

  _renderCount() {
    const turns = this.turnCount === 0 ? "" : `${this.turnCount} turn${this.turnCount === 1 ? "" : "s"} · `;
    setText(this.countElement, this.lastId === null ? "" : `${turns}through #${this.lastId}`);
    if (this.placeholder) {
      setText(this.placeholder, emptyText({ events: this.events, otherTypes: this.otherTypes, closed: this.closed, loaded: this.loaded }));
    }
  }
}
