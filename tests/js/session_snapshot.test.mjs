// The compacted snapshot on the page (docs/protocol.md, "Compacted history").
import assert from "node:assert/strict";
import { test } from "node:test";

import { expandEntry, snapshotQuery } from "../../static/qwenweb/session_snapshot.js";

const chunk = (text) => ({ sessionUpdate: "agent_message_chunk", content: { type: "text", text } });

test("a compacted message is drawn as an empty first chunk, then the whole text", () => {
  const entry = { v: 1, type: "compacted", firstId: 3, lastId: 9, count: 7, event: "session_update", data: chunk("abc") };
  const [opening, merged] = expandEntry(entry);
  assert.deepEqual([opening.id, opening.data.content.text], [3, ""]);
  assert.deepEqual([merged.id, merged.type, merged.data.content.text], [9, "session_update", "abc"]);
});

test("a compacted tool call update is one update with the last id", () => {
  const data = { sessionUpdate: "tool_call_update", toolCallId: "c", status: "completed" };
  const parts = expandEntry({ type: "compacted", firstId: 4, lastId: 5, count: 2, event: "session_update", data });
  assert.deepEqual(parts.map((p) => [p.id, p.data.status]), [[5, "completed"]]);
});

test("any other entry is drawn as itself", () => {
  const event = { id: 2, v: 1, type: "note", data: {} };
  assert.deepEqual(expandEntry(event), [event]);
});

test("the snapshot is asked compacted unless the page says compact=0", () => {
  assert.equal(snapshotQuery(), "?compact=1");
  assert.equal(snapshotQuery("before=8"), "?before=8&compact=1");
  globalThis.location = { search: "?compact=0" };
  try {
    assert.equal(snapshotQuery("before=8"), "?before=8");
    assert.equal(snapshotQuery(), "");
  } finally {
    delete globalThis.location;
  }
});
