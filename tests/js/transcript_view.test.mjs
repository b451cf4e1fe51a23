// The session page's transcript drawn on ./fake_dom.mjs (static/qwenweb/transcript.js), and
// the small pure helpers of its event links, JSON dialog and cursor (issue 30).
import assert from "node:assert/strict";
import { test } from "node:test";

import { element, installFakeDom } from "./fake_dom.mjs";
import { jsonText } from "../../static/qwenweb/event_json.js";
import { eventIdFromHash } from "../../static/qwenweb/event_links.js";
import { cursorText } from "../../static/qwenweb/session_status.js";
import { Transcript } from "../../static/qwenweb/transcript.js";

installFakeDom();

const at = (ms) => ({ _meta: { serverTimestamp: ms } });
const tool = (id, sessionUpdate, status, ms) => ({
  id, type: "session_update", data: { sessionUpdate, toolCallId: "c1", title: "Run", status }, ...at(ms),
});
const byClass = (root, cls) => root.descendants().filter((node) => node.classList.contains(cls));

test("a tool call's card says its duration and marks it failed, inside its turn", () => {
  const root = element("section");
  const transcript = new Transcript(root, element("span"));
  transcript.apply(tool(1, "tool_call", "in_progress", 1000));
  transcript.apply(tool(2, "tool_call_update", "failed", 2500));
  transcript.apply({ id: 3, type: "turn_complete", data: { turn: 4, stopReason: "end_turn" }, ...at(2600) });
  const [turn] = byClass(root, "turn");
  assert.equal(turn.dataset.complete, "true");
  assert.equal(byClass(turn, "turn-title")[0].textContent, "Turn 4");
  const [card] = byClass(turn, "tool");
  assert.equal(card.dataset.outcome, "failed");
  assert.equal(card.dataset.ids, "1 2");
  assert.equal(byClass(card, "tool-duration")[0].textContent, "1.5 s");
  assert.equal(byClass(card, "tool-status")[0].textContent, "✕ failed");
  assert.deepEqual(transcript.eventsOf(card).map((e) => e.id), [1, 2]);
  assert.equal(transcript.countElement.textContent, "1 turn · through #3");
});

test("a resync greys what is drawn, inside turns too, and what follows opens a new turn", () => {
  const root = element("section");
  const transcript = new Transcript(root, element("span"));
  transcript.apply({ id: 1, type: "session_update", data: { sessionUpdate: "agent_message_chunk", content: { type: "text", text: "a" } } });
  transcript.retire();
  transcript.apply({ id: 9, type: "session_update", data: { sessionUpdate: "agent_message_chunk", content: { type: "text", text: "b" } } });
  const messages = byClass(root, "msg-agent");
  assert.deepEqual(messages.map((m) => m.classList.contains("stale")), [true, false]);
  assert.equal(byClass(root, "turn").length, 2);
});

test("only #e<positive id> names an event", () => {
  assert.equal(eventIdFromHash("#e123"), 123);
  for (const hash of ["", "#e", "#e0", "#e12a", "#x12", "#e99999999999999999"]) assert.equal(eventIdFromHash(hash), null, hash);
});

test("the JSON dialog indents JSON and shows anything else raw", () => {
  assert.equal(jsonText({ a: 1 }), '{\n  "a": 1\n}');
  assert.equal(jsonText('{"a":1}'), '{\n  "a": 1\n}');
  assert.equal(jsonText("not json"), "not json");
});

test("the cursor is never an id that was not issued", () => {
  assert.equal(cursorText("100000", null).text, "none yet"); // a restarted server's new epoch
  assert.equal(cursorText("0", 0).text, "none yet"); // a new session
  assert.equal(cursorText("", null).text, "—");
  assert.equal(cursorText("42", 41).text, "42");
});

test("a turn the session's close interrupts says it is unfinished, not in progress", () => {
  const root = element("section");
  const transcript = new Transcript(root, element("span"));
  transcript.apply({ id: 1, type: "session_update", data: { sessionUpdate: "agent_message_chunk", content: { type: "text", text: "bye" } } });
  transcript.apply({ id: 2, type: "session_closed", data: { reason: "closed" } });
  assert.equal(byClass(root, "turn-meta")[0].textContent, "unfinished: the session closed");
});
