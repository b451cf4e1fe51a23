// SC-12 "unknown types are shown raw, never fatal", also for the names every plain object
// inherits: an event type, a code or a reason from the wire such as `toString`,
// `constructor`, `__proto__`, `hasOwnProperty` or `valueOf` is only a name. Looked up in one
// of the page's tables of words or classes (`SIGNAL_CLASSES[type]`, `REASONS[reason]`, …)
// it must find nothing, not Object.prototype's member: a publisher could otherwise break
// the session page of every viewer (a class name with spaces throws in
// `classList.add`, and the snapshot's rebuild stops there).
//
// The views run on the small DOM of ./fake_dom.mjs, whose classList rejects bad tokens as
// Chromium does.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { element, installFakeDom } from "./fake_dom.mjs";
import { streamErrorText } from "../../static/qwenweb/envelopes.js";
import { FrameLog } from "../../static/qwenweb/frame_log.js";
import { SnapshotSync } from "../../static/qwenweb/session_snapshot.js";
import { StatusPanel } from "../../static/qwenweb/session_status.js";
import { describeApiError } from "../../static/qwenweb/subscribers.js";
import { Transcript } from "../../static/qwenweb/transcript.js";

installFakeDom();

const NAMES = ["toString", "constructor", "__proto__", "hasOwnProperty", "valueOf", "isPrototypeOf"];

function frameLog() {
  const tools = { follow: null, type: element("select"), incidents: null, search: null, exportButton: null, jump: null };
  return new FrameLog(element("tbody"), element("span"), element("div"), tools);
}

function classesBelow(node) {
  return [node, ...node.descendants()].flatMap((each) => each.className.split(" ").filter(Boolean));
}

describe("the frame log", () => {
  test("a row per such type, shown raw, with no signal class", () => {
    const log = frameLog();
    let id = 0;
    for (const type of NAMES) {
      id += 1;
      log.add({ id, type, timeMs: 0, source: "live", note: "{}" });
      log.add({ kind: "synthetic", type, note: "raw" });
    }
    const rows = log.body.rows;
    assert.equal(rows.length, NAMES.length * 2);
    for (const [index, row] of rows.entries()) {
      const type = NAMES[Math.floor(index / 2)];
      assert.equal(row.dataset.type, type);
      assert.equal(row.className, index % 2 === 0 ? "row-event" : "row-synthetic");
      const name = row.descendants().find((node) => node.classList.contains("type-name"));
      assert.equal(name.className, "type-name", type);
      assert.equal(name.textContent, type);
      for (const cls of classesBelow(row)) assert.doesNotMatch(cls, /function|object|native/i, type);
    }
    assert.deepEqual(
      log.toNdjson().trim().split("\n").map((line) => JSON.parse(line).type),
      NAMES.flatMap((type) => [type, type]),
    );
    assert.deepEqual(log.tools.type.children.map((option) => option.value), NAMES);
  });

  test("the types it knows still get their class", () => {
    const log = frameLog();
    log.add({ kind: "synthetic", type: "toString" });
    log.add({ kind: "synthetic", type: "slow_client_warning" });
    assert.equal(log.body.rows[1].className, "row-synthetic row-warning");
  });
});

test("a snapshot holding such types is drawn whole: transcript, log and cursor", () => {
  const root = element("section");
  const transcript = new Transcript(root, element("span"));
  const log = frameLog();
  let cursor = null;
  const sync = new SnapshotSync({
    load: async () => assert.fail("no load"),
    transcript,
    log,
    cursor: () => cursor,
    setCursor: (id) => {
      cursor = id;
    },
    apply: () => {},
    notify: () => {},
    render: () => {},
  });
  const events = NAMES.map((type, index) => ({ id: index + 1, type, data: { [type]: type } }));
  const chunk = (id, sessionUpdate, text) => ({
    id,
    type: "session_update",
    data: { sessionUpdate, content: { type: "text", text } },
  });
  let id = NAMES.length;
  for (const name of NAMES) events.push(chunk(++id, name, `not shown ${name}`));
  events.push({ id: ++id, type: "session_update", data: { sessionUpdate: "tool_call", toolCallId: "__proto__", title: "t" } });
  events.push(chunk(++id, "agent_message_chunk", "after them"));
  sync.rebuild({ events, lastEventId: id, firstEventId: 1, hasOlder: false, status: "open" });
  assert.equal(cursor, id);
  assert.deepEqual(
    log.body.rows.map((row) => row.dataset.type),
    events.map((event) => event.type),
  );
  const agent = root.descendants().filter((node) => node.classList.contains("msg-agent"));
  assert.equal(agent.length, 1);
  assert.match(agent[0].textContent, /after them$/);
  assert.doesNotMatch(root.textContent, /not shown/);
  const tool = root.descendants().find((node) => node.classList.contains("tool"));
  assert.equal(tool.dataset.toolCallId, "__proto__");
});

describe("the status panel", () => {
  function panel() {
    const dom = {};
    for (const name of ["badge", "stateReason", "banner", "notice", "nextAttempt"]) dom[name] = element("span");
    return new StatusPanel(dom);
  }

  test("a state reason it has no words for is shown as it is", () => {
    const status = panel();
    for (const reason of NAMES) {
      status.showState("reconnecting", { reason });
      assert.equal(status.dom.stateReason.textContent, reason);
    }
  });

  test("a notice of a kind it has no delay for fades after the default delay", () => {
    const status = panel();
    const delays = [];
    const realSetTimeout = globalThis.setTimeout;
    globalThis.setTimeout = (fn, ms) => {
      delays.push(ms);
      return 0;
    };
    try {
      for (const kind of NAMES) status.notify("text", kind);
    } finally {
      globalThis.setTimeout = realSetTimeout;
    }
    assert.deepEqual(delays, NAMES.map(() => 6000));
  });
});

test("an API error code it has no sentence for falls back to the message or the status", () => {
  for (const code of NAMES) {
    assert.equal(describeApiError(400, { code }), "The server answered HTTP 400.", code);
    assert.equal(describeApiError(400, { code, error: "no" }), "The server refused: no.", code);
  }
});

test("a stream_error reason it has no words for is said as it is", () => {
  for (const reason of NAMES) {
    assert.equal(
      streamErrorText({ error: "ended", code: "c", reason }),
      `ended: ${reason.replace(/_/g, " ")} (c: ${reason}); reconnecting`,
    );
  }
});
