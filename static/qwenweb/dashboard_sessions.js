// qwenweb — the order, filter and search of the dashboard's sessions (./dashboard.js).
//
// A session here is `{id, title, owner, status ("open" | "closed"), live (loaded in a
// server process now), active (subscribers or events in the newest sample), createdAt (ms)}`.
// Live sessions come first (the active ones before those merely loaded), then open ones
// that are not loaded (idle, unloaded), then closed ones; newest first within each, so a
// row moves only when its state changes. Tested under Node (tests/js/dashboard_sessions.test.mjs).

/** 0: live (loaded and open), 1: open but not loaded, 2: closed. */
export function sessionRank(session) {
  if (session.status === "closed") return 2;
  return session.live ? 0 : 1;
}

/** Sort comparator: rank, then active before merely loaded, then newest first, then id (a total order). */
export function compareSessions(a, b) {
  return (
    sessionRank(a) - sessionRank(b) ||
    Number(Boolean(b.active)) - Number(Boolean(a.active)) ||
    (b.createdAt || 0) - (a.createdAt || 0) ||
    String(a.id).localeCompare(String(b.id))
  );
}

/** Whether `session` is shown under the filter `which` ("live", "closed" or "all"). */
export function matchesFilter(session, which) {
  if (which === "live") return sessionRank(session) === 0;
  if (which === "closed") return session.status === "closed";
  return true;
}

/** Whether `session` matches the search `query`: every word of it (case-insensitive) is
 * in its title, id or owner. An empty query matches everything. */
export function matchesSearch(session, query) {
  const words = String(query || "").toLowerCase().split(/\s+/).filter(Boolean);
  if (words.length === 0) return true;
  const haystack = `${session.title || ""} ${session.id || ""} ${session.owner || ""}`.toLowerCase();
  return words.every((word) => haystack.includes(word));
}

/** How many of `sessions` each filter shows: `{live, closed, all}`. */
export function filterCounts(sessions) {
  const counts = { live: 0, closed: 0, all: 0 };
  for (const session of sessions) {
    counts.all += 1;
    if (matchesFilter(session, "live")) counts.live += 1;
    if (matchesFilter(session, "closed")) counts.closed += 1;
  }
  return counts;
}
