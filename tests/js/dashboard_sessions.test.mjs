// The dashboard's sessions (static/qwenweb/dashboard_sessions.js): live first, filter, search.
import assert from "node:assert/strict";
import { test } from "node:test";

import { compareSessions, filterCounts, matchesFilter, matchesSearch } from "../../static/qwenweb/dashboard_sessions.js";

const session = (id, status, live, createdAt, extra = {}) => ({ id, title: id, owner: "", status, live, createdAt, ...extra });

test("live sessions come first, then open ones not loaded, then closed ones", () => {
  const sessions = [
    session("closed-new", "closed", false, 9),
    session("unloaded", "open", false, 8),
    session("closed-loaded", "closed", true, 7),
    session("live-old", "open", true, 1),
    session("live-new", "open", true, 5),
  ];
  assert.deepEqual(sessions.sort(compareSessions).map((s) => s.id), ["live-new", "live-old", "unloaded", "closed-new", "closed-loaded"]);
});

test("among live sessions the active ones come first: many loaded, idle sessions do not bury the busy one", () => {
  const idle = Array.from({ length: 5 }, (_, n) => session(`idle-${n}`, "open", true, 10 + n, { active: false }));
  const sessions = [...idle, session("busy", "open", true, 1, { active: true }), session("unloaded", "open", false, 20)];
  const order = sessions.sort(compareSessions).map((s) => s.id);
  assert.equal(order[0], "busy");
  assert.deepEqual(order.slice(1, 6), ["idle-4", "idle-3", "idle-2", "idle-1", "idle-0"]);
  assert.equal(order[6], "unloaded");
});

test("the filter keeps live, closed or all sessions", () => {
  const sessions = [session("a", "open", true, 1), session("b", "open", false, 2), session("c", "closed", false, 3)];
  assert.deepEqual(sessions.filter((s) => matchesFilter(s, "live")).map((s) => s.id), ["a"]);
  assert.deepEqual(sessions.filter((s) => matchesFilter(s, "closed")).map((s) => s.id), ["c"]);
  assert.equal(sessions.filter((s) => matchesFilter(s, "all")).length, 3);
  assert.deepEqual(filterCounts(sessions), { live: 1, closed: 1, all: 3 });
});

test("the search finds every word in the title, id or owner, case-insensitively", () => {
  const s = session("3f2a1b2c-0000-4000-8000-000000000000", "open", true, 1, { title: "Demo Agent", owner: "alice" });
  for (const query of ["", "demo", "AGENT demo", "3f2a1b", "alice", "  alice   demo "]) assert.ok(matchesSearch(s, query), query);
  for (const query of ["bob", "demo bob"]) assert.ok(!matchesSearch(s, query), query);
});
