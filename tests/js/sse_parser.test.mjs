// Tests of createParser (static/qwenweb/sse_parser.js): the parser vectors, then own cases per rule
// SC-1..SC-8 of docs/protocol.md (WHATWG HTML §9.2.6).
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";

import { createParser } from "../../static/qwenweb/sse_parser.js";

const T = { timeout: 5000 };
// The project's copy of the shared parser vectors (tests/vectors/README.md).
const VECTORS_URL = new URL("../vectors/sse/parser-cases.json", import.meta.url);
const vectors = JSON.parse(readFileSync(VECTORS_URL, "utf8"));

/** Run chunks through a fresh parser; record everything it reports. */
function run(chunks, { bytes = false, lastEventId } = {}) {
  const events = [];
  const retries = [];
  const comments = [];
  let ended = false;
  const parser = createParser({
    onEvent: (event) => events.push({ ...event, beforeEnd: !ended }),
    onRetry: (ms) => retries.push(ms),
    onComment: (text) => comments.push(text),
    ...(lastEventId === undefined ? {} : { lastEventId }),
  });
  for (const chunk of chunks) (bytes ? parser.feedBytes(chunk) : parser.feed(chunk));
  ended = true;
  parser.end();
  return { events, retries, comments, parser };
}

const shape = (events) => events.map(({ type, data, lastEventId }) => ({ type, data, id: lastEventId }));
const utf8 = (text) => new TextEncoder().encode(text);
const bytesOf = (...values) => Uint8Array.from(values);

function assertMatchesVector(vector, result) {
  assert.deepEqual(shape(result.events), vector.events);
  assert.ok(result.events.every((event) => event.beforeEnd), "every event dispatched before end() (SC-8)");
  assert.equal(result.parser.lastEventId, vector.final_last_event_id);
  assert.equal(result.parser.retry, vector.final_retry);
  assert.deepEqual(result.retries, vector.retries);
}

describe("parser vectors: cases (decoded text chunks)", () => {
  assert.ok(vectors.cases.length > 0, `no cases in ${VECTORS_URL}`);
  for (const vector of vectors.cases) {
    test(vector.name, T, () => assertMatchesVector(vector, run(vector.chunks)));
  }
});

describe("parser vectors: byte_cases (feedBytes)", () => {
  assert.ok(vectors.byte_cases.length > 0, `no byte_cases in ${VECTORS_URL}`);
  for (const vector of vectors.byte_cases) {
    const chunks = vector.chunks_b64.map((b64) => new Uint8Array(Buffer.from(b64, "base64")));
    test(vector.name, T, () => assertMatchesVector(vector, run(chunks, { bytes: true })));
  }
});

describe("SC-1 UTF-8 decoding with one streaming decoder", () => {
  test("a 3-byte character split over 3 feedBytes calls comes out whole", T, () => {
    const { events } = run([utf8("data: "), bytesOf(0xe6), bytesOf(0x97), bytesOf(0xa5), utf8("\n\n")], { bytes: true });
    assert.deepEqual(shape(events), [{ type: "message", data: "日", id: "" }]);
  });

  test("a 4-byte character split 1+3 inside an id survives as the cursor", T, () => {
    const { parser } = run([utf8("id: k"), bytesOf(0xf0), bytesOf(0x9f, 0x94, 0x91), utf8("\ndata: x\n\n")], { bytes: true });
    assert.equal(parser.lastEventId, "k🔑");
  });

  test("a truncated sequence followed by a line end decodes as U+FFFD, not a lost line", T, () => {
    const { events } = run([utf8("data: a"), bytesOf(0xe6, 0x97), utf8("\n\n")], { bytes: true });
    assert.deepEqual(shape(events), [{ type: "message", data: "a\ufffd", id: "" }]);
  });

  test("a character split at the end of the stream is flushed by end() and discarded with its line", T, () => {
    const { events, parser } = run([utf8("id: 1\ndata: a\n\ndata: b"), bytesOf(0xe6)], { bytes: true });
    assert.deepEqual(shape(events), [{ type: "message", data: "a", id: "1" }]);
    assert.equal(parser.lastEventId, "1");
  });

  test("two parsers have independent decoders", T, () => {
    const seen = [];
    const a = createParser({ onEvent: (e) => seen.push(`a:${e.data}`) });
    const b = createParser({ onEvent: (e) => seen.push(`b:${e.data}`) });
    a.feedBytes(utf8("data: "));
    a.feedBytes(bytesOf(0xc3));
    b.feedBytes(utf8("data: z\n\n"));
    a.feedBytes(bytesOf(0xa9, 0x0a, 0x0a));
    assert.deepEqual(seen, ["b:z", "a:é"]);
  });
});

describe("SC-2 exactly one leading BOM is dropped", () => {
  test("a BOM inside a value is data", T, () => {
    assert.deepEqual(shape(run(["data: \ufeffx\n\n"]).events), [{ type: "message", data: "\ufeffx", id: "" }]);
  });

  test("a BOM starting the second line is part of its field name", T, () => {
    const { events } = run(["\ufeffdata: a\n\ufeffdata: b\n\n"]);
    assert.deepEqual(shape(events), [{ type: "message", data: "a", id: "" }]);
  });

  test("several empty chunks before the BOM do not close the BOM window", T, () => {
    assert.deepEqual(shape(run(["", "", "", "\ufeffdata: a\n\n"]).events), [{ type: "message", data: "a", id: "" }]);
  });

  test("the BOM window closes with the first non-empty chunk even if it is a line end", T, () => {
    assert.deepEqual(run(["\n", "\ufeffdata: a\n\n"]).events, []);
  });

  test("feedBytes: the decoder keeps both BOMs and the parser strips only the first", T, () => {
    const { events } = run([bytesOf(0xef, 0xbb, 0xbf, 0xef, 0xbb, 0xbf), utf8("data: a\n\ndata: b\n\n")], { bytes: true });
    assert.deepEqual(shape(events), [{ type: "message", data: "b", id: "" }]);
  });

  test("feedBytes: a BOM split 2+1 after an empty byte chunk is still the stream's first code point", T, () => {
    const { events } = run([new Uint8Array(0), bytesOf(0xef, 0xbb), bytesOf(0xbf), utf8("data: a\n\n")], { bytes: true });
    assert.deepEqual(shape(events), [{ type: "message", data: "a", id: "" }]);
  });
});

describe("SC-3 line endings: CRLF, LF, CR and nothing else", () => {
  test("U+2028 is not a line end", T, () => {
    assert.deepEqual(shape(run(["data: a\u2028data: b\n\n"]).events), [{ type: "message", data: "a\u2028data: b", id: "" }]);
  });

  test("U+0085 from the bytes C2 85 is not a line end", T, () => {
    const { events } = run([utf8("data: a"), bytesOf(0xc2, 0x85), utf8("b\n\n")], { bytes: true });
    assert.deepEqual(shape(events), [{ type: "message", data: "a\u0085b", id: "" }]);
  });

  test("form feed and vertical tab in a field name do not split it", T, () => {
    assert.deepEqual(run(["data\f: a\ndata\v: b\n\n"]).events, []);
  });

  test("a CR ending a chunk and an LF after several empty chunks are one line end", T, () => {
    const { events } = run(["data: a\r", "", "", "\ndata: b\n\n"]);
    assert.deepEqual(shape(events), [{ type: "message", data: "a\nb", id: "" }]);
  });

  test("a blank line ended by CR at a chunk end swallows only one following LF", T, () => {
    const { events } = run(["data: a\n\r", "\ndata: b\n\n"]);
    assert.deepEqual(shape(events), [
      { type: "message", data: "a", id: "" },
      { type: "message", data: "b", id: "" },
    ]);
  });

  test("LF at a chunk end then CR starting the next are two line ends", T, () => {
    const { events } = run(["data: a\n", "\rdata: b\n\n"]);
    assert.deepEqual(shape(events).map((e) => e.data), ["a", "b"]);
  });

  test("CR CR LF is a CR line end then a CRLF line end", T, () => {
    assert.deepEqual(shape(run(["data: a\r\r\ndata: b\r\n\r\n"]).events).map((e) => e.data), ["a", "b"]);
  });
});

describe("SC-4 line kinds: blank, comment, field", () => {
  test("comments reach onComment with one leading space removed and never dispatch", T, () => {
    const { events, comments } = run([": heartbeat\n:\n:  two\n\n"]);
    assert.deepEqual(events, []);
    assert.deepEqual(comments, ["heartbeat", "", " two"]);
  });

  test("only one leading space is removed from a value", T, () => {
    assert.equal(run(["data:   three\n\n"]).events[0].data, "  three");
  });

  test("a colon inside a value is kept", T, () => {
    assert.equal(run(['data: {"a":"b:c"}\n\n']).events[0].data, '{"a":"b:c"}');
  });

  test("a line with no colon is a field with an empty value", T, () => {
    assert.deepEqual(shape(run(["data\n\n"]).events), [{ type: "message", data: "", id: "" }]);
  });

  test("event without colon resets the type to message", T, () => {
    assert.equal(run(["event: x\nevent\ndata: 1\n\n"]).events[0].type, "message");
  });
});

describe("SC-5 fields", () => {
  test("a string id like b7-1042 survives untouched", T, () => {
    const { events, parser } = run(["id: b7-1042\ndata: x\n\n"]);
    assert.equal(events[0].lastEventId, "b7-1042");
    assert.equal(parser.lastEventId, "b7-1042");
  });

  test("an id with U+0000 in the middle is ignored, not truncated", T, () => {
    assert.equal(run(["id: 3\n\nid: 4\u00005\ndata: x\n\n"]).parser.lastEventId, "3");
  });

  test("field names are case-sensitive: ID and Retry are ignored", T, () => {
    const { parser, retries } = run(["ID: 9\nRetry: 10\ndata: x\n\n"]);
    assert.equal(parser.lastEventId, "");
    assert.deepEqual(retries, []);
  });

  for (const value of ["1.5", " 100", "100 ", "1e3", "0x10", "\u0663\u0660", "", "12 34", "\t5"]) {
    test(`retry ${JSON.stringify(value)} is ignored (not all ASCII digits)`, T, () => {
      const { parser, retries } = run([`retry: 7\nretry:${value === "" ? "" : " " + value}\n`]);
      assert.deepEqual(retries, [7]);
      assert.equal(parser.retry, 7);
    });
  }

  test("retry without a space and with many digits is valid, in base ten", T, () => {
    assert.deepEqual(run(["retry:0010\nretry: 12345678901\n"]).retries, [10, 12345678901]);
  });

  test("retry is null before any valid retry field", T, () => {
    assert.equal(run(["data: x\n\n"]).parser.retry, null);
  });

  test("a unicode event type is kept as is", T, () => {
    assert.equal(run(["event: état\ndata: x\n\n"]).events[0].type, "état");
  });
});

describe("SC-6 dispatch", () => {
  test("the id buffer is not reset at dispatch: later events keep the id", T, () => {
    const { events } = run(["id: 5\ndata: a\n\ndata: b\n\nevent: t\ndata: c\n\n"]);
    assert.deepEqual(events.map((e) => e.lastEventId), ["5", "5", "5"]);
  });

  test("an event-only block dispatches nothing and clears the type", T, () => {
    const { events } = run(["event: lonely\n\ndata: x\n\n"]);
    assert.deepEqual(shape(events), [{ type: "message", data: "x", id: "" }]);
  });

  test("only one trailing LF is removed from the data", T, () => {
    assert.equal(run(["data: a\ndata\ndata:\n\n"]).events[0].data, "a\n\n");
  });

  test("idField is the block's own id field, null when the block had none", T, () => {
    const { events } = run(["id: 1\ndata: a\n\ndata: b\n\nid:\ndata: c\n\n"]);
    assert.deepEqual(events.map((e) => e.idField), ["1", null, ""]);
  });

  test("an initial lastEventId survives a block without id (the server's leading retry block)", T, () => {
    const { events, parser } = run(["retry: 3000\n\nevent: replay_complete\ndata: {}\n\n"], { lastEventId: "41" });
    assert.equal(parser.lastEventId, "41");
    assert.equal(events[0].lastEventId, "41");
  });
});

describe("SC-7 end of stream", () => {
  test("end() discards the unfinished block and does not commit its id", T, () => {
    const { events, parser } = run(["id: 1\ndata: a\n\nid: 2\ndata: half"]);
    assert.equal(events.length, 1);
    assert.equal(parser.lastEventId, "1");
  });

  test("end() does not dispatch a block whose lines all ended but no blank line came", T, () => {
    const { events } = run(["data: a\r\ndata: b\r\n"]);
    assert.deepEqual(events, []);
  });

  test("feed() after end() throws; end() twice is harmless", T, () => {
    const parser = createParser({ onEvent() {} });
    parser.end();
    parser.end();
    assert.throws(() => parser.feed("data: x\n\n"), /after end/);
    assert.throws(() => parser.feedBytes(utf8("x")), /after end/);
  });

  test("createParser without onEvent throws a TypeError", T, () => {
    assert.throws(() => createParser({}), TypeError);
  });
});

describe("SC-8 events are dispatched as soon as their blank line arrives", () => {
  test("each event is visible right after the feed that completed it", T, () => {
    const seen = [];
    const parser = createParser({ onEvent: (e) => seen.push(e.data) });
    parser.feed("data: a\n");
    assert.deepEqual(seen, []);
    parser.feed("\ndata: b\r");
    assert.deepEqual(seen, ["a"]);
    parser.feed("\r");
    assert.deepEqual(seen, ["a", "b"]);
  });

  test("a blank line that is a lone CR at a chunk end dispatches without waiting for the next chunk", T, () => {
    const seen = [];
    const parser = createParser({ onEvent: (e) => seen.push(e.data) });
    parser.feed("data: a\r\r");
    assert.deepEqual(seen, ["a"]);
  });
});

describe("efficiency: a long line in many chunks is O(n)", () => {
  // Linear: ~0.2 s. Rescanning the pending line per chunk: ~30 s. The feeding yields every
  // 1000 chunks so that the test timeout can interrupt a quadratic parser.
  test("300 000 one-character chunks of one data line parse well within the timeout", T, async () => {
    let data = null;
    const parser = createParser({ onEvent: (e) => (data = e.data) });
    parser.feed("data: ");
    for (let i = 0; i < 300_000; i += 1) {
      parser.feed(i % 2 ? "b" : "a");
      if (i % 1000 === 999) await new Promise((resolve) => setImmediate(resolve));
    }
    parser.feed("\n\n");
    assert.equal(data.length, 300_000);
    assert.equal(data.slice(0, 4), "abab");
  });

  test("a 1 MB line fed as 64 KiB byte chunks with many short lines after it", T, () => {
    const seen = [];
    const parser = createParser({ onEvent: (e) => seen.push(e.data.length) });
    const stream = utf8(`data: ${"é".repeat(500_000)}\n\n${"data: x\n\n".repeat(10_000)}`);
    for (let at = 0; at < stream.length; at += 65_536) parser.feedBytes(stream.subarray(at, at + 65_536));
    assert.equal(seen.length, 10_001);
    assert.equal(seen[0], 500_000);
  });
});
