/**
 * transcript.js — the session page's transcript (`#transcript`), drawn from its events.
 *
 * `Transcript` renders the ACP shapes of `session_update` events (agent and user messages,
 * thoughts, one card per tool call) and markers for `turn_complete`, `session_closed` and
 * `history_truncated`; every other type is shown in the frame log only. It keeps no cursor:
 * the page applies each event once and in order (session_page.js), and clears and redraws
 * it from the snapshot on a resync (SC-12, session_snapshot.js), which also draws the "load
 * earlier" pages with a Transcript of their own. Follow mode is frame_log.js's `Follower`.
 *
 * Safety: text from events only ever goes in as text nodes / `textContent`, never as HTML.
 */
import { contentText, isObject } from "./envelopes.js";
import { Follower, h, setText } from "./frame_log.js";
import { lookup } from "./lookup.js";

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

/**
 * The agent's transcript from `session_update` events (ACP shapes): consecutive
 * `agent_message_chunk` texts are joined into one message, `user_message_chunk` into the
 * user's, and `tool_call` / `tool_call_update` are one card per `toolCallId` with its status.
 * `root` is the element drawn into (its `.transcript-empty` child is the placeholder shown
 * while it is empty); `countElement` says "through #<last id>".
 */
export class Transcript {
  constructor(root, countElement) {
    this.root = root;
    this.countElement = countElement;
    this.placeholder = root.querySelector(".transcript-empty");
    this.follower = new Follower(root);
    this.clear();
  }

  clear() {
    this.root.replaceChildren(...(this.placeholder ? [this.placeholder] : []));
    this.current = null;
    this.tools = new Map();
    this.entries = 0;
    this.lastId = null;
    this._renderCount();
  }

  /** Render one envelope (`{id?, type, data}`); types without a transcript form are ignored. */
  apply(envelope) {
    const id = envelope.id ?? null;
    if (id !== null) this.lastId = id;
    const data = envelope.data;
    switch (envelope.type) {
      case "session_update":
        if (isObject(data)) this._sessionUpdate(data, id);
        break;
      case "turn_complete":
        this._marker(
          "turn",
          `Turn${isObject(data) && data.turn !== undefined ? ` ${data.turn}` : ""} complete${
            isObject(data) && typeof data.stopReason === "string" ? ` · ${data.stopReason}` : ""
          }`,
          id,
        );
        break;
      case "session_closed":
        this._marker(
          "closed",
          `Session closed${isObject(data) && data.closedBy ? ` by ${data.closedBy}` : ""}${
            isObject(data) && data.reason ? ` (${data.reason})` : ""
          }`,
          id,
        );
        break;
      case "history_truncated":
        this._marker(
          "truncated",
          `Earlier events are no longer kept by the server: history starts at #${
            isObject(data) ? data.earliestAvailableId : "?"
          }.`,
          null,
        );
        break;
      default:
        break; // shown in the frame log only
    }
    this._renderCount();
  }

  /**
   * Keep what is drawn, greyed (class `stale`): what follows starts new messages and tool
   * cards below it (a resync or a restart, SC-12; nothing on screen is thrown away).
   */
  retire() {
    for (const node of this.root.children) if (node !== this.placeholder) node.classList.add("stale");
    this.current = null;
    this.tools = new Map();
  }

  /** Add a note that is not an event (e.g. the session is closed). */
  note(kind, text) {
    this._marker(kind, text, null);
    this._renderCount();
  }

  _sessionUpdate(update, id) {
    switch (update.sessionUpdate) {
      case "agent_message_chunk":
        this._chunk("agent", update.content, id);
        break;
      case "user_message_chunk":
        this._chunk("user", update.content, id);
        break;
      case "agent_thought_chunk":
        this._chunk("thought", update.content, id);
        break;
      case "tool_call":
      case "tool_call_update":
        this._tool(update, id);
        break;
      default:
        break;
    }
  }

  _append(node) {
    if (this.placeholder && this.placeholder.isConnected) this.placeholder.remove();
    this.root.append(node);
    this.entries += 1;
    this.follower.kick();
  }

  _chunk(role, content, id) {
    let current = this.current;
    if (current === null || current.role !== role) {
      const block = h("article", `msg msg-${role}`);
      block.dataset.role = role;
      const head = h("header", "msg-head");
      const ids = h("span", "msg-ids mono");
      head.append(h("span", "msg-role", lookup(ROLE_LABELS, role)), ids);
      const body = h("div", "msg-text");
      const textNode = document.createTextNode("");
      body.append(textNode);
      block.append(head, body);
      this._append(block);
      current = { role, block, ids, textNode, firstId: id };
      this.current = current;
      if (id !== null) block.dataset.firstId = String(id);
    }
    current.textNode.appendData(contentText(content));
    this.follower.kick();
    if (id !== null) {
      current.block.dataset.lastId = String(id);
      current.ids.textContent = current.firstId === id ? `#${id}` : `#${current.firstId}–${id}`;
    }
  }

  _tool(update, id) {
    const callId = typeof update.toolCallId === "string" ? update.toolCallId : `event-${id}`;
    let card = this.tools.get(callId);
    if (card === undefined) {
      const element = h("article", "tool");
      element.dataset.toolCallId = callId;
      const head = h("header", "tool-head");
      const kind = h("span", "tool-kind", "tool");
      const title = h("span", "tool-title", callId);
      const status = h("span", "tool-status", "pending");
      status.dataset.status = "pending";
      head.append(kind, title, status);
      const output = h("pre", "tool-output");
      output.hidden = true;
      element.append(head, output);
      card = { element, kind, title, status, output };
      this.tools.set(callId, card);
      this.current = null; // text after a tool call is a new message
      this._append(element);
    }
    if (typeof update.title === "string" && update.title) card.title.textContent = update.title;
    if (typeof update.kind === "string" && update.kind) card.kind.textContent = update.kind;
    if (typeof update.status === "string" && update.status) {
      card.status.textContent = update.status.replace(/_/g, " ");
      card.status.dataset.status = update.status;
      card.element.dataset.status = update.status;
    }
    if (Array.isArray(update.content)) {
      const text = toolContentText(update.content);
      card.output.textContent = text;
      card.output.hidden = text === "";
    }
    if (id !== null) card.element.dataset.lastId = String(id);
  }

  _marker(kind, text, id) {
    const marker = h("div", `marker marker-${kind}`, text);
    if (id !== null) marker.dataset.id = String(id);
    this.current = null;
    this._append(marker);
  }

  _renderCount() {
    setText(this.countElement, this.lastId === null ? "" : `through #${this.lastId}`);
  }
}
