"""The event log's tables and the SQL on them, and the file checks before it opens (no
thread, no connection of its own: :mod:`sessions.backends.event_log` has those).

Called on the log's writer thread, inside its transaction, with its one connection.
Tables: ``meta`` (schema, deployment, boot id, clean stop, generation, rows), ``heads``
(per session: epoch, the epoch's first id, the next id, the generation it belongs to,
when it closed), ``events`` (per session and id: type, envelope JSON without ``id``,
when committed), ``keys`` (idempotency keys with their first answer).
"""

from __future__ import annotations

import functools
import os
import secrets
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "SCHEMA",
    "SCHEMA_VERSION",
    "TRIM_STEP_ROWS",
    "Append",
    "CloseSession",
    "OpenSession",
    "Opened",
    "Rows",
    "read_boot_id",
    "read_session",
    "trim_step",
    "wal_torn",
]

SCHEMA_VERSION: Final = "2"

SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS heads (
    session_id TEXT PRIMARY KEY,
    epoch TEXT NOT NULL,
    epoch_start INTEGER NOT NULL,
    next_id INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    closed_at REAL
);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    id INTEGER NOT NULL,
    type TEXT NOT NULL,
    body BLOB NOT NULL,
    at REAL NOT NULL,
    UNIQUE (session_id, id)
);
CREATE TABLE IF NOT EXISTS keys (
    session_id TEXT NOT NULL,
    key TEXT NOT NULL,
    digest TEXT NOT NULL,
    id INTEGER NOT NULL,
    epoch TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (session_id, key)
) WITHOUT ROWID;
"""


TRIM_STEP_ROWS: Final = 500
"""Rows one background deletion step removes at most (a short write lock)."""


def wal_torn(path: Path) -> bool:
    """Whether ``path``'s WAL file ends inside a frame (a write cut short). Never raises.

    A WAL is a 32-byte header and frames of 24 bytes + one page; its header names the
    page size (bytes 8-11, big-endian)."""
    try:
        with open(f"{path}-wal", "rb") as wal:
            header = wal.read(32)
            size = os.fstat(wal.fileno()).st_size
    except OSError:
        return False
    if size == 0:
        return False
    if len(header) < 32:
        return True
    page_size = int.from_bytes(header[8:12], "big")
    return page_size < 512 or (size - 32) % (24 + page_size) != 0


def read_boot_id() -> str:
    """Return this machine's boot id (``/proc/sys/kernel/random/boot_id``), ``""`` if none."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@dataclass(slots=True)
class Append:
    """Append one event (``body``: the envelope's JSON without ``id``) with its key."""

    session_id: str
    event_id: int
    type: str
    body: bytes
    key: tuple[str, str, str] | None = None  # (key, digest, epoch)
    closes: bool = False


@dataclass(slots=True)
class CloseSession:
    """Mark a session closed (its history stays until the retention deletes it)."""

    session_id: str


@dataclass(slots=True)
class OpenSession:
    """Read a session's head, its newest events and keys; start an epoch if it needs one.

    ``fresh_start``: the first id of a new epoch (above every id ever issued, from the
    database's reservation). ``ring_size``, ``ring_max_bytes``: what the ring keeps.
    """

    session_id: str
    fresh_start: int
    ring_size: int
    ring_max_bytes: int
    max_keys: int
    key_ttl_s: float


@dataclass(frozen=True, slots=True)
class Opened:
    """A session as the log has it: ``epoch``, ``next_id``, its newest ``events``
    (``(id, type, body)``, oldest first), its live ``keys`` (``(key, digest, id, epoch)``,
    oldest first), and whether the epoch is ``new``."""

    epoch: str
    next_id: int
    events: list[tuple[int, str, bytes]]
    keys: list[tuple[str, str, int, str]]
    new: bool
    closed: bool = False


ROWS_PER_INSERT: Final = 500
"""Event rows one INSERT statement writes at most (5 parameters each)."""


@functools.cache
def _insert_events_sql(rows: int) -> str:
    return "INSERT INTO events VALUES " + ", ".join(["(?, ?, ?, ?, ?)"] * rows)  # noqa: S608 - placeholders only


class Rows:
    """The appends of one commit, written with one ``executemany`` per table."""

    __slots__ = ("events", "heads", "keys")

    def __init__(self) -> None:
        self.events: list[tuple[str, int, str, bytes, float]] = []
        self.keys: list[tuple[str, str, str, int, str, float]] = []
        self.heads: dict[str, tuple[int, float | None]] = {}

    def clear(self) -> None:
        self.events, self.keys, self.heads = [], [], {}

    def add(self, op: Append) -> float:
        now = time.time()
        self.events.append((op.session_id, op.event_id, op.type, op.body, now))
        if op.key is not None:
            key, digest, epoch = op.key
            self.keys.append((op.session_id, key, digest, op.event_id, epoch, now))
        closed = self.heads.get(op.session_id, (0, None))[1]
        self.heads[op.session_id] = (op.event_id + 1, now if op.closes else closed)
        return now

    def flush(self, conn: sqlite3.Connection) -> None:
        # Many rows per statement: sqlite3 lets go of the GIL around each step, and under a
        # busy event loop each step then waits for the GIL again (a convoy): one statement
        # of ROWS_PER_INSERT rows costs one wait instead of hundreds.
        events = self.events
        for start in range(0, len(events), ROWS_PER_INSERT):
            chunk = events[start : start + ROWS_PER_INSERT]
            conn.execute(_insert_events_sql(len(chunk)), [v for row in chunk for v in row])
        if self.keys:
            conn.executemany("INSERT OR REPLACE INTO keys VALUES (?, ?, ?, ?, ?, ?)", self.keys)
        for session_id, (next_id, closed_at) in self.heads.items():
            conn.execute(
                "UPDATE heads SET next_id = max(next_id, ?), closed_at = coalesce(?, closed_at) "
                "WHERE session_id = ?",
                (next_id, closed_at, session_id),
            )
        self.clear()


def read_session(conn: sqlite3.Connection, op: OpenSession, generation: int) -> Opened:
    """Read a session's head, newest events and live keys (:class:`OpenSession`); start a
    new epoch for a session without a head or with one of another ``generation``."""
    head = conn.execute(
        "SELECT epoch, epoch_start, next_id, generation, closed_at FROM heads WHERE session_id = ?",
        (op.session_id,),
    ).fetchone()
    if head is not None and head[3] == generation:
        epoch, epoch_start, next_id = head[0], head[1], head[2]
        rows = conn.execute(
            "SELECT id, type, body FROM events WHERE session_id = ? AND id >= ? "
            "ORDER BY id DESC LIMIT ?",
            (op.session_id, epoch_start, op.ring_size),
        ).fetchall()
        events: list[tuple[int, str, bytes]] = []
        held = 0
        for event_id, event_type, body in rows:
            held += len(body)
            if events and held > op.ring_max_bytes:
                break
            events.append((event_id, event_type, bytes(body)))
        events.reverse()
        keys = conn.execute(
            "SELECT key, digest, id, epoch FROM keys WHERE session_id = ? AND at >= ? "
            "ORDER BY at DESC LIMIT ?",
            (op.session_id, time.time() - op.key_ttl_s, op.max_keys),
        ).fetchall()
        keys.reverse()
        return Opened(epoch, next_id, events, keys, False, head[4] is not None)
    # A new epoch: no head, or one from before an unclean machine stop (its last
    # commits may be lost): above every id the old epoch could have issued.
    start = max(op.fresh_start, head[2] + 1 if head is not None else 1)
    epoch = secrets.token_urlsafe(12)
    conn.execute(
        "INSERT OR REPLACE INTO heads VALUES (?, ?, ?, ?, ?, NULL)",
        (op.session_id, epoch, start, start, generation),
    )
    return Opened(epoch, start, [], [], True)


def trim_step(
    conn: sqlite3.Connection,
    keep_from: dict[str, int],
    closed_before: float,
    key_ttl_s: float,
) -> int:
    """Delete up to :data:`TRIM_STEP_ROWS` rows no ring can replay any more (writer
    thread, inside a commit): events of ``keep_from``'s sessions below their id,
    sessions closed before ``closed_before`` (epoch s) with their events and keys, keys
    older than ``key_ttl_s``; then give a few free pages back. Returns rows deleted."""
    budget = TRIM_STEP_ROWS
    for session_id, first_kept in keep_from.items():
        if budget <= 0:
            break
        budget -= conn.execute(
            "DELETE FROM events WHERE rowid IN (SELECT rowid FROM events "
            "WHERE session_id = ? AND id < ? ORDER BY id LIMIT ?)",
            (session_id, first_kept, budget),
        ).rowcount
    for (session_id,) in conn.execute(
        "SELECT session_id FROM heads WHERE closed_at IS NOT NULL AND closed_at < ? LIMIT 20",
        (closed_before,),
    ).fetchall():
        if budget <= 0:
            break
        asked = budget
        gone = conn.execute(
            "DELETE FROM events WHERE rowid IN (SELECT rowid FROM events "
            "WHERE session_id = ? ORDER BY id LIMIT ?)",
            (session_id, asked),
        ).rowcount
        budget -= gone
        if gone < asked:  # its last events went: the session goes
            conn.execute("DELETE FROM keys WHERE session_id = ?", (session_id,))
            conn.execute("DELETE FROM heads WHERE session_id = ?", (session_id,))
    conn.execute(
        "DELETE FROM keys WHERE (session_id, key) IN "
        "(SELECT session_id, key FROM keys WHERE at < ? LIMIT ?)",
        (time.time() - key_ttl_s, max(1, budget)),
    )
    conn.execute("PRAGMA incremental_vacuum(64)")
    return TRIM_STEP_ROWS - budget
