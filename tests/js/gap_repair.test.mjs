// static/qwenweb/gap_repair.js (SC-14): the pages asked for a missing range, how a page is
// read, and GapRepair's order, bound and give-up, with a fake snapshot loader (no network,
// no timers: `sleep` is injected).
import assert from "node:assert/strict";
import { test } from "node:test";

import { GapRepair, pagePlan, readPage } from "../../static/qwenweb/gap_repair.js";

const ev = (id) => ({ id, v: 1, type: "note", data: id });
const frame = (id) => ({ id: String(id), type: "note", data: String(id), json: ev(id) });

/** A ring holding ids `first … last`, answering `?before=&limit=` as the server does. */
function ringLoader(first, last, { maxPerPage = Infinity, epoch = "e1" } = {}) {
  const queries = [];
  const load = async (query) => {
    queries.push(query);
    const params = new URLSearchParams(query.slice(1));
    const before = Number(params.get("before"));
    const limit = Math.min(Number(params.get("limit")), maxPerPage);
    const ids = [];
    for (let id = Math.min(before - 1, last); id >= first && ids.length < limit; id -= 1) ids.unshift(id);
    return { epoch, events: ids.map(ev), firstEventId: ids[0] ?? null, hasOlder: ids.length > 0 && ids[0] > first };
  };
  return { load, queries };
}

function recorder(load, extra = {}) {
  const applied = [];
  const repair = new GapRepair({
    load,
    applyEvent: (e) => applied.push(e.id),
    applyLost: ({ from, to }) => applied.push(`lost ${from}-${to}`),
    applyFrame: (f) => applied.push(Number(f.id)),
    resync: (held, why) => applied.push({ resync: why, held: held.map((f) => Number(f.id)) }),
    epoch: () => "e1",
    sleep: async () => {},
    ...extra,
  });
  return { repair, applied };
}

test("the first request asks for exactly the missing ids, raw, below the first id after the gap", () => {
  assert.equal(pagePlan(10, 21), "?before=21&limit=10");
  assert.equal(pagePlan(10, 5000, 500), "?before=5000&limit=500");
});

test("a page reaching the cursor ends the repair; one stopping short continues below it", () => {
  assert.deepEqual(readPage({ events: [ev(11), ev(12)], hasOlder: true }, 10, 13), { events: [ev(11), ev(12)], next: null, lost: null });
  assert.deepEqual(readPage({ events: [ev(15), ev(16)], hasOlder: true }, 10, 17).next, 15);
});

test("a range older than the ring is lost from the cursor up to the ring's first event", () => {
  const page = { events: [{ v: 1, type: "history_truncated", data: {} }, ev(15), ev(16)], hasOlder: false };
  assert.deepEqual(readPage(page, 10, 17), { events: [ev(15), ev(16)], next: null, lost: { from: 11, to: 14 } });
  assert.deepEqual(readPage({ events: [], hasOlder: false }, 10, 17).lost, { from: 11, to: 16 });
});

test("a page that still holds the cursor's event marks the ids between as never issued", () => {
  const page = { events: [ev(8), ev(9)], hasOlder: true }; // a forked epoch: 9, then 100001
  assert.deepEqual(readPage(page, 9, 100001), { events: [], next: null, lost: { from: 10, to: 100000, unissued: true } });
});

test("a forked epoch's jump is passed without a lost span or a second request", async () => {
  const load = async () => ({ events: [ev(8), ev(9)], hasOlder: true, epoch: null });
  const { repair, applied } = recorder(load);
  await repair.start(9, frame(100001));
  assert.deepEqual(applied, ["lost 10-100000", 100001]);
  assert.equal(repair.stats.lost, 0);
});

test("fetched events, then held frames, are applied in id order", async () => {
  const { load, queries } = ringLoader(1, 100);
  const { repair, applied } = recorder(load);
  const done = repair.start(10, frame(15));
  repair.hold(frame(16));
  await done;
  assert.deepEqual(applied, [11, 12, 13, 14, 15, 16]);
  assert.deepEqual(queries, ["?before=15&limit=4"]);
  assert.equal(repair.active, false);
});

test("pages back while the server answers less than asked", async () => {
  const { load, queries } = ringLoader(1, 100, { maxPerPage: 2 });
  const { repair, applied } = recorder(load);
  await repair.start(10, frame(16));
  assert.deepEqual(applied, [11, 12, 13, 14, 15, 16]);
  assert.deepEqual(queries, ["?before=16&limit=5", "?before=14&limit=3", "?before=12&limit=1"]);
});

test("a range the ring evicted is shown as lost at its place", async () => {
  const { load } = ringLoader(13, 100);
  const { repair, applied } = recorder(load);
  await repair.start(10, frame(15));
  assert.deepEqual(applied, ["lost 11-12", 13, 14, 15]);
});

test("more held frames than the bound: resync with every frame held, nothing applied", async () => {
  let release;
  const gate = new Promise((resolve) => (release = resolve));
  const { load } = ringLoader(1, 100);
  const { repair, applied } = recorder(async (q) => (await gate, load(q)), { holdLimit: 2 });
  const done = repair.start(10, frame(15));
  repair.hold(frame(16));
  repair.hold(frame(17));
  release();
  await done;
  assert.deepEqual(applied, [{ resync: "more than 2 frames arrived meanwhile", held: [15, 16, 17] }]);
});

test("a range that cannot be read, or of another epoch, ends in a resync", async () => {
  const failing = recorder(async () => {
    throw Object.assign(new Error("HTTP 503"), { status: 503 });
  });
  await failing.repair.start(10, frame(12));
  assert.deepEqual(failing.applied, [{ resync: "HTTP 503", held: [12] }]);
  const other = recorder(ringLoader(1, 100, { epoch: "e2" }).load);
  await other.repair.start(10, frame(12));
  assert.equal(other.applied[0].resync, "the server's history has another epoch");
});

test("a held frame that opens another gap starts the next repair, the rest wait for it", async () => {
  const { load } = ringLoader(1, 100);
  const applied = [];
  let cursor = 10;
  const repair = new GapRepair({
    load,
    applyEvent: (e) => applied.push((cursor = e.id)),
    applyLost: () => {},
    applyFrame: (f) => {
      const id = Number(f.id);
      if (id > cursor + 1) repair.start(cursor, f);
      else applied.push((cursor = id));
    },
    resync: () => assert.fail("no resync"),
    sleep: async () => {},
  });
  const first = repair.start(10, frame(12));
  repair.hold(frame(14));
  repair.hold(frame(15));
  await first;
  for (let turn = 0; turn < 50 && repair.active; turn += 1) await new Promise((r) => setImmediate(r));
  assert.deepEqual(applied, [11, 12, 13, 14, 15]);
});

test("an aborted repair applies nothing and hands back what it held", async () => {
  const { load } = ringLoader(1, 100);
  const { repair, applied } = recorder(load);
  const done = repair.start(10, frame(15));
  repair.hold(frame(16));
  assert.deepEqual(repair.abort().map((f) => Number(f.id)), [15, 16]);
  await done;
  assert.deepEqual(applied, []);
});

test("a compacted entry's frame opens the gap at its first id and is applied after the range", async () => {
  const { load, queries } = ringLoader(1, 100);
  const { repair, applied } = recorder(load);
  const compacted = { id: "30", firstId: 25, type: "compacted", data: "{}", json: {} };
  await repair.start(20, compacted);
  assert.deepEqual(queries, ["?before=25&limit=4"]);
  assert.deepEqual(applied, [21, 22, 23, 24, 30]);
});

test("without a frame, the range up to `before` is fetched raw and nothing else applied", async () => {
  const { load, queries } = ringLoader(1, 100);
  const { repair, applied } = recorder(load);
  const done = repair.start(20, null, 26);
  repair.hold(frame(26)); // arrives while the range is fetched
  await done;
  assert.deepEqual(queries, ["?before=26&limit=5"]);
  assert.deepEqual(applied, [21, 22, 23, 24, 25, 26]);
});
