// static/qwenweb/transcript_model.js: turns, tool-call durations and outcomes, the empty
// state's words and the transcript search's matches (issue 30).
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  emptyText,
  findMatches,
  formatDuration,
  groupTurns,
  nextToolState,
} from "../../static/qwenweb/transcript_model.js";

const at = (ms) => ({ _meta: { serverTimestamp: ms } });
const update = (id, sessionUpdate, extra = {}, ms = 0) => ({
  id, type: "session_update", data: { sessionUpdate, ...extra }, ...at(ms),
});
const done = (id, turn, ms = 0) => ({ id, type: "turn_complete", data: { turn, stopReason: "end_turn" }, ...at(ms) });

describe("turns", () => {
  test("turn_complete ends a turn and the next update opens another", () => {
    const turns = groupTurns([update(1, "user_message_chunk"), update(2, "agent_message_chunk"), done(3, 1), update(4, "agent_message_chunk")]);
    assert.deepEqual(turns.map((t) => [t.number, t.ids, t.complete]), [[1, [1, 2, 3], true], [2, [4], false]]);
  });

  test("events of other types are outside turns and do not open one", () => {
    const turns = groupTurns([{ id: 1, type: "note", data: {} }, update(2, "agent_message_chunk"), { id: 3, type: "note" }, done(4, 7)]);
    assert.deepEqual(turns.map((t) => [t.number, t.ids]), [[7, [2, 4]]]);
  });

  test("a history starting mid-turn does not guess the turn's number", () => {
    const [turn] = groupTurns([update(40, "agent_message_chunk")]);
    assert.equal(turn.number, null);
  });

  test("a turn's time runs from its first event to its last", () => {
    const [turn] = groupTurns([update(1, "user_message_chunk", {}, 1000), update(2, "agent_message_chunk", {}, 1500), done(3, 1, 4200)]);
    assert.deepEqual([turn.startMs, turn.endMs, turn.stopReason], [1000, 4200, "end_turn"]);
  });
});

describe("tool calls", () => {
  test("the duration runs from the call's first event to its final status", () => {
    let state = nextToolState(null, { status: "in_progress" }, 10_000);
    assert.deepEqual([state.outcome, state.durationMs], [null, null]);
    state = nextToolState(state, { status: "completed" }, 12_345);
    assert.deepEqual([state.outcome, state.durationMs], ["completed", 2345]);
  });

  test("a failed call is marked failed, and a later update does not move its end", () => {
    let state = nextToolState(null, { status: "pending" }, 0);
    state = nextToolState(state, { status: "failed" }, 800);
    state = nextToolState(state, { content: [] }, 5000);
    assert.deepEqual([state.status, state.outcome, state.durationMs], ["failed", "failed", 800]);
  });

  test("without server timestamps there is no duration, never NaN", () => {
    const state = nextToolState(nextToolState(null, { status: "in_progress" }, undefined), { status: "completed" }, 5);
    assert.equal(state.durationMs, null);
  });

  test("durations in words", () => {
    assert.deepEqual(
      [0, 349.6, 1234, 42_400, 185_000, -1, Number.NaN].map(formatDuration),
      ["0 ms", "350 ms", "1.2 s", "42 s", "3 min 05 s", "—", "—"],
    );
  });
});

describe("the empty transcript", () => {
  test("after events of other types it says what there is, not 'nothing yet'", () => {
    const text = emptyText({ events: 1206, otherTypes: new Map([["note", 1206]]), closed: false, loaded: true });
    assert.equal(text, "No agent messages or tool calls yet: 1,206 events of other types (note ×1,206); see Frames.");
  });

  test("no event at all, open or closed, and before the snapshot", () => {
    const none = { events: 0, otherTypes: new Map(), loaded: true };
    assert.match(emptyText({ ...none, closed: false }), /^No events yet\. Start the demo agent/);
    assert.equal(emptyText({ ...none, closed: true }), "No events: the session was closed without any.");
    assert.equal(emptyText({ ...none, closed: false, loaded: false }), "Loading the session…");
  });

  test("many types: the three most frequent, and how many more", () => {
    const types = new Map([["a", 1], ["b", 5], ["c", 3], ["d", 2]]);
    assert.match(emptyText({ events: 11, otherTypes: types, closed: false, loaded: true }), /\(b ×5, c ×3, d ×2, and 1 more types\)/);
  });
});

describe("search", () => {
  test("finds every occurrence of a word, case-insensitive, with its offsets", () => {
    assert.deepEqual(findMatches("Needle in a needle stack", "needle"), [[0, 6], [12, 18]]);
  });

  test("characters of regular expressions are only text", () => {
    assert.deepEqual(findMatches("a.b axb (c)", "a.b"), [[0, 3]]);
    assert.deepEqual(findMatches("f(x) [y]", "(x)"), [[1, 4]]);
  });

  test("a blank query finds nothing; matches are bounded", () => {
    assert.deepEqual(findMatches("text", "  "), []);
    assert.equal(findMatches("aaaa", "a", 3).length, 3);
  });

  test("offsets are those of the text even where lower-casing changes lengths", () => {
    assert.deepEqual(findMatches("İstanbul needle", "needle"), [[9, 15]]);
  });
});
