/**
 * transcript_model.js — what the session page's transcript knows about its events, without
 * a DOM: turns, tool calls with their duration and outcome, the empty state's words, and
 * the matches of a search. Pure and synchronous; drawn by ./transcript.js, searched by
 * ./transcript_search.js, tested by tests/js/transcript_model.test.mjs.
 *
 * Shapes: envelopes `{id?, type, data, _meta?: {serverTimestamp}}` (docs/protocol.md,
 * "Frames"); `session_update` data are ACP session updates (`agent_message_chunk`,
 * `tool_call`, `tool_call_update`, …; sessions/scripted_agent.py).
 */
import { isObject, serverTime } from "./envelopes.js";

/** The statuses that end an ACP tool call, and the outcome each means. */
const FINAL_STATUSES = { completed: "completed", failed: "failed" };

/**
 * A duration in words: "350 ms", "1.2 s", "42 s", "3 min 05 s"; "—" for a value that is
 * not a finite number of milliseconds at or above 0.
 */
export function formatDuration(ms) {
  if (typeof ms !== "number" || !Number.isFinite(ms) || ms < 0) return "—";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 10_000) return `${(ms / 1000).toFixed(1)} s`;
  if (ms < 60_000) return `${Math.round(ms / 1000)} s`;
  const seconds = Math.round(ms / 1000);
  return `${Math.floor(seconds / 60)} min ${String(seconds % 60).padStart(2, "0")} s`;
}

/**
 * The next state of one tool call after `update` (a `tool_call` or `tool_call_update`
 * session update) at server time `timeMs` (epoch ms, or undefined when the event has none).
 *
 * State: `{status, startMs, endMs, durationMs, outcome}`; `previous` is null for a call not
 * seen yet. `startMs` is the time of the call's first event; `endMs` that of the event that
 * made it `completed` or `failed` (the first such one: a later update does not move it);
 * `durationMs` is `endMs − startMs` once both are known, else null; `outcome` is
 * "completed", "failed" or null while the call runs. Never throws.
 */
export function nextToolState(previous, update, timeMs) {
  const time = typeof timeMs === "number" && Number.isFinite(timeMs) ? timeMs : null;
  const state = previous ?? { status: "pending", startMs: time, endMs: null, durationMs: null, outcome: null };
  const status = typeof update.status === "string" && update.status ? update.status : state.status;
  const outcome = Object.hasOwn(FINAL_STATUSES, status) ? FINAL_STATUSES[status] : null;
  let endMs = state.endMs;
  if (outcome !== null && state.outcome === null) endMs = time;
  else if (outcome === null) endMs = null; // back to running: not ended
  const durationMs = state.startMs !== null && endMs !== null ? Math.max(0, endMs - state.startMs) : null;
  return { status, startMs: state.startMs, endMs, durationMs, outcome };
}

/** Whether an envelope has a place in a turn (agent/user text, thoughts, tool calls, its end). */
export function inTurn(envelope) {
  return envelope.type === "session_update" || envelope.type === "turn_complete";
}

/**
 * Groups events into turns, one at a time: a turn opens with the first event that has a
 * place in one (`inTurn`) while none is open, and `turn_complete` ends it. `add` returns
 * `{turn, opened, closed}`: the turn the event belongs to (null for an event outside
 * turns), whether it opened that turn, whether it ended it. `interrupt()` leaves the open
 * turn unfinished (a marker such as `session_closed` or a lost span comes between).
 *
 * A turn: `{number, firstId, lastId, startMs, endMs, complete, stopReason}`. `number` is
 * `turn_complete`'s `data.turn` when it says one, else one more than the last known
 * number (null while none is known: a page loaded mid-history does not guess).
 */
export class TurnTracker {
  constructor() {
    this.open = null;
    this.lastNumber = null;
  }

  add(envelope) {
    if (!inTurn(envelope)) return { turn: null, opened: false, closed: false };
    const id = Number.isSafeInteger(envelope.id) ? envelope.id : null;
    const time = serverTime(envelope);
    let opened = false;
    if (this.open === null) {
      this.open = {
        number: this.lastNumber === null ? null : this.lastNumber + 1,
        firstId: id,
        lastId: id,
        startMs: typeof time === "number" ? time : null,
        endMs: null,
        complete: false,
        stopReason: null,
      };
      opened = true;
    }
    const turn = this.open;
    if (id !== null) {
      if (turn.firstId === null) turn.firstId = id;
      turn.lastId = id;
    }
    if (typeof time === "number") turn.endMs = time;
    if (envelope.type !== "turn_complete") return { turn, opened, closed: false };
    const data = isObject(envelope.data) ? envelope.data : {};
    if (Number.isSafeInteger(data.turn)) turn.number = data.turn;
    if (typeof data.stopReason === "string") turn.stopReason = data.stopReason;
    turn.complete = true;
    if (turn.number !== null) this.lastNumber = turn.number;
    this.open = null;
    return { turn, opened, closed: true };
  }

  interrupt() {
    this.open = null;
  }
}

/** The turns of a list of envelopes, in order (see `TurnTracker`), each with its event `ids`. */
export function groupTurns(envelopes) {
  const tracker = new TurnTracker();
  const turns = [];
  for (const envelope of envelopes) {
    const { turn, opened } = tracker.add(envelope);
    if (turn === null) continue;
    if (opened) turns.push({ turn, ids: [] });
    if (Number.isSafeInteger(envelope.id)) turns.at(-1).ids.push(envelope.id);
  }
  return turns.map(({ turn, ids }) => ({ ...turn, ids }));
}

/**
 * The words of an empty transcript, true to what the view holds. `events`: the events
 * applied so far; `otherTypes`: a Map type → count of those without a transcript form;
 * `closed`: the session is closed; `loaded`: the snapshot was drawn.
 */
export function emptyText({ events, otherTypes, closed, loaded }) {
  if (!loaded) return "Loading the session…";
  if (events === 0) {
    return closed ? "No events: the session was closed without any." : "No events yet. Start the demo agent, or publish to this session.";
  }
  const kinds = [...otherTypes.entries()]
    .sort((a, b) => b[1] - a[1])
    .slice(0, 3)
    .map(([type, count]) => `${type} ×${count.toLocaleString("en-US")}`);
  const more = otherTypes.size > 3 ? `, and ${otherTypes.size - 3} more types` : "";
  const noun = events === 1 ? "event" : "events";
  return `No agent messages or tool calls yet: ${events.toLocaleString("en-US")} ${noun} of other types (${kinds.join(
    ", ",
  )}${more}); see Frames.`;
}

/**
 * Where `query` occurs in `text`, case-insensitive: `[[start, end], …]` (character offsets,
 * end exclusive), not overlapping, at most `limit`. An empty or blank query matches nothing.
 */
export function findMatches(text, query, limit = 10_000) {
  const needle = query.trim();
  if (needle === "") return [];
  // A regular expression on the text itself: offsets stay those of `text` (lower-casing
  // may change a string's length, e.g. "İ").
  const pattern = new RegExp(needle.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"), "giu");
  const matches = [];
  for (const match of text.matchAll(pattern)) {
    if (matches.length >= limit) break;
    matches.push([match.index, match.index + match[0].length]);
  }
  return matches;
}
