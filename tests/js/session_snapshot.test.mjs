// The compacted snapshot on the page (docs/protocol.md, "Compacted history").
import assert from "node:assert/strict";
import { test } from "node:test";

import { expandEntry, isCompacted, SnapshotSync, snapshotFrame, snapshotQuery } from "../../static/qwenweb/session_snapshot.js";

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

const entry = (firstId, lastId, text) => ({
  v: 1, type: "compacted", firstId, lastId, count: lastId - firstId + 1, event: "session_update", data: chunk(text),
});
const event = (id, text) => ({ id, v: 1, type: "session_update", data: chunk(text) });

test("a compacted entry is one frame from its first to its last id", () => {
  const frame = snapshotFrame(entry(4, 9, "abc"));
  assert.deepEqual([frame.id, frame.firstId, frame.type, frame.source], ["9", 4, "compacted", "snapshot"]);
  assert.deepEqual(snapshotFrame(event(3, "x")).firstId, undefined);
  assert.equal(isCompacted(entry(4, 9, "")), true);
  assert.equal(isCompacted({ ...entry(4, 9, ""), lastId: 3 }), false);
  assert.equal(isCompacted(event(3, "x")), false);
});

/** A page for `SnapshotSync` that records what it is handed (no DOM: nothing is retired). */
function fakePage(cursor, snapshot) {
  const page = {
    applied: [],
    queries: [],
    adopted: null,
    load: async (query) => {
      page.queries.push(query);
      return snapshot;
    },
    cursor: () => cursor,
    setCursor: (id) => {
      cursor = id;
    },
    apply: (frame) => {
      page.applied.push([frame.firstId ?? Number(frame.id), Number(frame.id)]);
      cursor = Number(frame.id);
    },
    adoptCursor: (s) => {
      page.adopted = s.lastEventId;
    },
    notify: () => {},
    render: () => {},
    log: { add: () => {} },
    transcript: {},
  };
  return page;
}

test("a resync loads the compacted snapshot and hands on the entries that end above the cursor", async () => {
  const snapshot = {
    epoch: "e1", lastEventId: 30, earliestAvailableId: 1, firstEventId: 1, hasOlder: false,
    events: [entry(1, 10, "old"), entry(11, 20, "straddles"), event(21, "x"), entry(22, 30, "new")],
  };
  const page = fakePage(15, snapshot);
  const sync = new SnapshotSync(page);
  sync.epoch = "e1";
  sync.startHolding();
  await sync.resync();
  assert.deepEqual(page.queries, ["?compact=1"]);
  // 1–10 is shown; 11–20 is handed whole (the page fetches 16–20 raw), then 21 and 22–30.
  assert.deepEqual(page.applied, [[11, 20], [21, 21], [22, 30]]);
  assert.deepEqual(sync.lastRebuild, { lastEventId: 30, count: 20 });
  assert.equal(page.adopted, 30);
});
