// static/qwenweb/session_status.js: what the session page says when a control (Drop, Pause
// reading, a maxQueued of its own) takes the tab off the shared stream.
import assert from "node:assert/strict";
import { test } from "node:test";

import { othersAfterDetach } from "../../static/qwenweb/session_status.js";

const KEEP_SHARING = "; the other tabs of this session keep sharing theirs";

test("other tabs keep sharing only when some shared this tab's stream", () => {
  assert.equal(othersAfterDetach("follower", 2), KEEP_SHARING); // at least the leader
  assert.equal(othersAfterDetach("leader", 3), KEEP_SHARING);
  assert.equal(othersAfterDetach("leader", 1), " (no other tab of this session shared it)");
});

test("nothing is claimed about tabs not known yet, or for a stream that was never shared", () => {
  for (const role of ["electing", "idle", "own"]) assert.equal(othersAfterDetach(role, 1), "", role);
});
