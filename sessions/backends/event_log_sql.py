"""The event log's tables and the SQL on them, and the file checks before it opens (no
thread, no connection of its own: :mod:`sessions.backends.event_log` has those).

Called on the log's writer thread, inside its transaction, with its one connection.
Tables: ``meta`` (schema, deployment, boot id, clean stop, generation, rows), ``heads``
(per session: epoch, the epoch's first id, the next id, the generation it belongs to,
when it closed, and for a forked epoch its gap and lineage), ``events`` (per session and
id: type, envelope JSON without ``id``, when committed; the trigger
``events_advance_head`` moves the head's next id past every inserted event, in the same
statement), ``keys`` (idempotency keys with their first answer).
"""

from __future__ import annotations

import functools
import os
import secrets
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = [
    "MAX_LINEAGE",
    "SCHEMA",
    "SCHEMA_VERSION",
    "TRIM_STEP_ROWS",
    "UPGRADABLE_VERSIONS",
    "Append",
    "CloseSession",
    "OpenSession",
    "Opened",
    "Rows",
    "migrate",
    "read_boot_id",
    "read_history",
    "read_session",
    "trim_step",
    "wal_torn",
]

SCHEMA_VERSION: Final = "3"
"""Version 3 adds a forked epoch's ``fork_id``, ``fork_next`` and ``lineage`` to ``heads``
(:func:`migrate` upgrades a version 2 log in place)."""
UPGRADABLE_VERSIONS: Final = ("2",)
MAX_LINEAGE: Final = 8
"""Ancestor epochs a forked epoch remembers at most (the nearest)."""

SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS heads (
    session_id TEXT PRIMARY KEY,
    epoch TEXT NOT NULL,
    epoch_start INTEGER NOT NULL,
    next_id INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    closed_at REAL,
    fork_id INTEGER,
    fork_next INTEGER,
    lineage TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS events (
    session_id TEXT NOT NULL,
    id INTEGER NOT NULL,
    type TEXT NOT NULL,
    body BLOB NOT NULL,
    at REAL NOT NULL,
    UNIQUE (session_id, id)
);
CREATE TRIGGER IF NOT EXISTS events_advance_head AFTER INSERT ON events BEGIN
    UPDATE heads SET next_id = max(next_id, NEW.id + 1) WHERE session_id = NEW.session_id;
END;
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


def migrate(conn: sqlite3.Connection, version: str) -> None:
    """Upgrade a log of schema ``version`` to :data:`SCHEMA_VERSION` (in the caller's
    transaction). Raises ``sqlite3.Error``."""
    if version == "2":
        for column in ("fork_id INTEGER", "fork_next INTEGER", "lineage TEXT NOT NULL DEFAULT ''"):
            conn.execute(f"ALTER TABLE heads ADD COLUMN {column}")


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
    oldest first), and whether the epoch is ``new``. A forked epoch (EB-23)
    also has its ``gap`` (``(fork id, first own id)``) and ``lineage``
    (``{ancestor epoch: last id shared}``)."""

    epoch: str
    next_id: int
    events: list[tuple[int, str, bytes]]
    keys: list[tuple[str, str, int, str]]
    new: bool
    closed: bool = False
    gap: tuple[int, int] | None = None
    lineage: dict[str, int] = field(default_factory=dict)


ROWS_PER_INSERT: Final = 500
"""Event rows one INSERT statement writes at most (5 parameters each)."""


@functools.cache
def _insert_events_sql(rows: int) -> str:
    return "INSERT INTO events VALUES " + ", ".join(["(?, ?, ?, ?, ?)"] * rows)  # noqa: S608 - placeholders only


class Rows:
    """The appends of one commit, written with one INSERT per :data:`ROWS_PER_INSERT`
    events (the trigger advances each head) and one ``executemany`` for their keys."""

    __slots__ = ("closes", "events", "keys")

    def __init__(self) -> None:
        self.events: list[tuple[str, int, str, bytes, float]] = []
        self.keys: list[tuple[str, str, str, int, str, float]] = []
        self.closes: dict[str, float] = {}

    def clear(self) -> None:
        self.events, self.keys, self.closes = [], [], {}

    @property
    def one_statement(self) -> bool:
        """Whether :meth:`flush` runs at most one statement (atomic without a transaction)."""
        return not self.keys and not self.closes and len(self.events) <= ROWS_PER_INSERT

    def add(self, op: Append) -> float:
        now = time.time()
        self.events.append((op.session_id, op.event_id, op.type, op.body, now))
        if op.key is not None:
            key, digest, epoch = op.key
            self.keys.append((op.session_id, key, digest, op.event_id, epoch, now))
        if op.closes:
            self.closes[op.session_id] = now
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
        for session_id, closed_at in self.closes.items():
            conn.execute(
                "UPDATE heads SET closed_at = ? WHERE session_id = ?",
                (closed_at, session_id),
            )
        self.clear()


def read_session(conn: sqlite3.Connection, op: OpenSession, generation: int) -> Opened:
    """Read a session's head, newest events and live keys (:class:`OpenSession`); start a
    new epoch for a session without a head, and fork one whose head is of another
    ``generation`` (:func:`fork_head`)."""
    head = conn.execute(
        "SELECT epoch, epoch_start, next_id, generation, closed_at, fork_id, fork_next, lineage "
        "FROM heads WHERE session_id = ?",
        (op.session_id,),
    ).fetchone()
    new = False
    if head is None:
        start = max(op.fresh_start, 1)
        epoch = secrets.token_urlsafe(12)
        conn.execute(
            "INSERT INTO heads (session_id, epoch, epoch_start, next_id, generation) "
            "VALUES (?, ?, ?, ?, ?)",
            (op.session_id, epoch, start, start, generation),
        )
        return Opened(epoch, start, [], [], True)
    if head[3] != generation:
        head = fork_head(conn, op, head, generation)
        new = True
    epoch, epoch_start, next_id, _, closed_at, fork_id, fork_next, lineage = head
    events = _newest_events(conn, op.session_id, epoch_start, op.ring_size, op.ring_max_bytes)
    keys = conn.execute(
        "SELECT key, digest, id, epoch FROM keys WHERE session_id = ? AND at >= ? "
        "ORDER BY at DESC LIMIT ?",
        (op.session_id, time.time() - op.key_ttl_s, op.max_keys),
    ).fetchall()
    keys.reverse()
    gap = (fork_id, fork_next) if fork_id is not None else None
    return Opened(epoch, next_id, events, keys, new, closed_at is not None, gap, _lineage(lineage))


def read_history(
    conn: sqlite3.Connection, session_id: str, ring_size: int, ring_max_bytes: int
) -> Opened | None:
    """Read a session's epoch and newest events as they are, without starting or forking
    an epoch (a closed session's history; nothing is written). None: no head."""
    head = conn.execute(
        "SELECT epoch, epoch_start, next_id, closed_at, fork_id, fork_next, lineage "
        "FROM heads WHERE session_id = ?",
        (session_id,),
    ).fetchone()
    if head is None:
        return None
    epoch, epoch_start, next_id, closed_at, fork_id, fork_next, lineage = head
    events = _newest_events(conn, session_id, epoch_start, ring_size, ring_max_bytes)
    gap = (fork_id, fork_next) if fork_id is not None else None
    return Opened(epoch, next_id, events, [], False, closed_at is not None, gap, _lineage(lineage))


def _newest_events(
    conn: sqlite3.Connection, session_id: str, first_id: int, count: int, max_bytes: int
) -> list[tuple[int, str, bytes]]:
    """The newest ``count`` events from ``first_id`` on within ``max_bytes`` (the newest
    always), oldest first."""
    rows = conn.execute(
        "SELECT id, type, body FROM events WHERE session_id = ? AND id >= ? "
        "ORDER BY id DESC LIMIT ?",
        (session_id, first_id, count),
    ).fetchall()
    events: list[tuple[int, str, bytes]] = []
    held = 0
    for event_id, event_type, body in rows:
        held += len(body)
        if events and held > max_bytes:
            break
        events.append((event_id, event_type, bytes(body)))
    events.reverse()
    return events


def fork_head(
    conn: sqlite3.Connection, op: OpenSession, head: tuple[Any, ...], generation: int
) -> tuple[Any, ...]:
    """Start a forked epoch for a head the log can no longer vouch for (a torn WAL, an
    unclean machine stop: its last commits may be lost; EB-23).

    The new epoch carries the old one's committed events (ids up to its last one, P, the
    fork id), and issues its own from above every id ever issued (``op.fresh_start``, the
    database's reservation); the old epoch and its ancestors become its lineage, each
    with the last id it shares. Returns the new head's row (as :func:`read_session` reads
    it); writes it in the caller's transaction.
    """
    epoch, epoch_start, next_id, _, closed_at, fork_id, fork_next, lineage = head
    own = fork_id is None or next_id != fork_next  # issued ids of its own since its fork
    last = next_id - 1 if own else fork_id
    # Its committed events from the start of their contiguous run (after its own gap).
    first = fork_next if fork_id is not None and last >= fork_next else epoch_start
    start = max(op.fresh_start, next_id + 1)
    ancestors = {epoch: last}
    for ancestor, shared in _lineage(lineage).items():
        if len(ancestors) < MAX_LINEAGE:
            ancestors.setdefault(ancestor, min(shared, last))
    forked = (
        secrets.token_urlsafe(12),
        first,
        start,
        generation,
        closed_at,
        last,
        start,
        " ".join(f"{name}:{shared}" for name, shared in ancestors.items()),
    )
    conn.execute(
        "INSERT OR REPLACE INTO heads (epoch, epoch_start, next_id, generation, closed_at, "
        "fork_id, fork_next, lineage, session_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (*forked, op.session_id),
    )
    return forked


def _lineage(text: str | None) -> dict[str, int]:
    """``"epoch:id epoch:id"`` as ``{epoch: id}`` (nearest ancestor first)."""
    pairs = (item.rpartition(":") for item in (text or "").split())
    return {name: int(shared) for name, _, shared in pairs if name}


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
