"""The durable event log: one SQLite file, one writer thread, group commit.

No Django here: :class:`EventLog` takes a path and its settings, the durable backend
(:mod:`sessions.backends.durable`) builds it and feeds it.

Concurrency model
    One writer thread owns the one connection; the event loop never calls SQLite. The loop
    hands operations over a thread-safe queue (:meth:`EventLog.submit`) and gets each one's
    outcome back through ``loop.call_soon_threadsafe``, in submission order: an operation's
    ``on_done`` callback runs on the loop before its future is resolved, so the caller can
    deliver committed events to the bus in id order even when the awaiting task was
    cancelled meanwhile.

Release in slices
    A commit's outcomes are handed back at most :data:`RELEASE_SLICE` operations (or
    :data:`RELEASE_SLICE_BYTES` of event bodies, at least one operation) per loop turn,
    the rest in the next turns, still in submission order behind those of earlier
    commits. A commit of 10,000 events thus never holds the loop for one long callback,
    and the tasks its first slice woke (the streams' pumps) run before the next slice: a
    subscriber that keeps up takes a commit a slice at a time, not all at once (EB-3,
    issue 23).

Group commit
    The writer takes the first waiting operation, then everything else that is already
    waiting (up to :data:`MAX_BATCH`), and runs them in one ``BEGIN IMMEDIATE`` ...
    ``COMMIT``: operations arriving while a commit runs go into the next one, so a burst
    shares the cost of one commit. A batch of appends that fits one INSERT (no key, no
    close) is that one statement, atomic on its own: each statement lets go of the GIL,
    and under a busy loop waits for it again, so the common commit waits once instead of
    four times. The row count in ``meta`` (a figure for ``/metrics``, nothing decides by
    it) is written by the other commits (the trim step, once a second) and at a clean
    stop, not with every append: after a crash it may lag by a second of appends. A batch
    that fails (disk full, I/O error) is rolled back
    and every operation in it fails with :class:`StorageFullError` or
    :class:`EventLogError`; nothing of it was acknowledged.

Ids
    The caller assigns ids (contiguous per session). After a failed batch, the writer fails
    every later event of the same session until the caller submits again from the first
    failed id (it rewinds to the bus's next id): a committed log never has a hole, and no
    (epoch, id) ever names two events.

Files
    The log file is created 0600; ``<path>.lock`` is held with ``fcntl.flock`` for the
    writer's lifetime (:class:`LogLockedError` when another process holds it). WAL mode,
    ``synchronous`` NORMAL (survives a process crash) or FULL (survives a power loss);
    the WAL is checkpointed (``PASSIVE``) by a thread of its own with its own connection,
    every :data:`CHECKPOINT_INTERVAL_S` or sooner once the WAL is past
    :data:`CHECKPOINT_WAL_BYTES` (a checkpoint syncs the files: in the writer's thread it
    would stall commits for the length of an fsync), and ``journal_size_limit`` truncates
    it, so it stays bounded. ``auto_vacuum=INCREMENTAL``: freed pages go back to the file
    system a few at a time (:meth:`EventLog.trim`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = [
    "RELEASE_SLICE",
    "RELEASE_SLICE_BYTES",
    "Append",
    "CloseSession",
    "EventLog",
    "EventLogError",
    "ForeignLogError",
    "LogLockedError",
    "OpenSession",
    "Opened",
    "StorageFullError",
    "read_boot_id",
    "read_history",
]

from sessions.backends.event_log_sql import (
    SCHEMA,
    SCHEMA_VERSION,
    UPGRADABLE_VERSIONS,
    Append,
    CloseSession,
    Opened,
    OpenSession,
    Rows,
    migrate,
    read_boot_id,
    read_history,
    read_session,
    trim_step,
    wal_torn,
)

logger = logging.getLogger("qwenweb.event_log")

MAX_BATCH: Final = 10_000
"""The most operations one commit takes (a burst beyond it goes into the next one)."""
RELEASE_SLICE: Final = 256
"""Outcomes handed back to the loop per loop turn at most (module docstring)."""
RELEASE_SLICE_BYTES: Final = 64 * 1024
"""Bytes of appended event bodies handed back per loop turn, at most this plus one event:
a subscriber's queue grows by no more than that per turn while its pump waits on one
``send`` (a 32nd of the default byte cap, a quarter of what the pump writes at once)."""
CHECKPOINT_INTERVAL_S: Final = 1.0
"""A passive WAL checkpoint at least this often (s)."""
CHECKPOINT_WAL_BYTES: Final = 16 * 1024 * 1024
"""A passive WAL checkpoint as soon as the WAL file is found larger than this (looked at
every 20 commits). Checkpoints cost the commits beside them (they sync both files): at a
few per second they set the tail of publish-to-receive latency (issue 24)."""
JOURNAL_SIZE_LIMIT: Final = 64 * 1024 * 1024
"""Bytes the WAL file is truncated to after a checkpoint."""


class EventLogError(Exception):
    """Raised when the log cannot be written or read (the message names the file)."""


class StorageFullError(EventLogError):
    """Raised for an operation whose commit failed because the disk (or budget) is full."""

    code = "storage_full"
    public_message = "the event log's disk is full; nothing was stored, try again later"


class LogLockedError(EventLogError):
    """Raised at open when another process holds the log's lock file."""


class ForeignLogError(EventLogError):
    """Raised at open when the file is not an event log of this deployment (or unreadable)."""


@dataclass(slots=True)
class _Item:
    op: Any
    future: asyncio.Future[Any] | None
    on_done: Callable[[Any, BaseException | None], None] | None
    result: Any = None
    error: BaseException | None = None


@dataclass(slots=True)
class LogStats:
    """What ``/metrics`` shows: commits, the last batch size, bytes, rows."""

    commits: int = 0
    rows: int = 0
    file_bytes: int = 0
    wal_bytes: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    failing: str = ""


class EventLog:
    """A durable append-only event log in its own SQLite file (module docstring).

    Args:
        path: the log file (created 0600 with its directory).
        loop: the event loop that submits and gets outcomes.
        synchronous: ``"NORMAL"`` or ``"FULL"``.
        deployment: what identifies the deployment (a fingerprint of its database); a
            log written by another is refused (:class:`ForeignLogError`), or, with
            ``on_mismatch="new_epoch"``, renamed aside and started afresh.
        max_bytes: the disk budget: past it, appends fail with :class:`StorageFullError`
            until trimming frees room.
    """

    def __init__(
        self,
        path: Path,
        loop: asyncio.AbstractEventLoop,
        *,
        synchronous: str = "NORMAL",
        deployment: str = "",
        on_mismatch: str = "refuse",
        max_bytes: int = 0,
        boot_id: str | None = None,
    ) -> None:
        self.path = path
        self.loop = loop
        self.synchronous = synchronous
        self.deployment = deployment
        self.on_mismatch = on_mismatch
        self.max_bytes = max_bytes
        self.boot_id = read_boot_id() if boot_id is None else boot_id
        self.stats = LogStats()
        self.generation = 0
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        # Outcomes committed (or failed) but not yet handed back, oldest first (on the loop).
        self._outcomes: deque[tuple[_Item, BaseException | None]] = deque()
        self._releasing = False
        self._thread: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None
        self._failed_from: dict[str, int] = {}
        self._commits = 0
        self._persisted_rows = 0
        self._closed = False
        self._torn = False
        self._rows = Rows()
        self._checkpointer: threading.Thread | None = None
        self._checkpoint_due = threading.Event()
        self._running = threading.Event()
        self._running.set()

    # -- lifecycle (any thread) ------------------------------------------------------------

    def open(self, timeout_s: float = 30.0) -> None:
        """Start the writer thread and open the file there; return once it is open.

        Raises :class:`LogLockedError`, :class:`ForeignLogError` or :class:`EventLogError`
        (each names the file). Blocks up to ``timeout_s``.
        """
        ready: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="qwenweb-event-log", daemon=True
        )
        self._thread.start()
        try:
            error = ready.get(timeout=timeout_s)
        except queue.Empty:
            raise EventLogError(f"event log {self.path}: not open after {timeout_s:g} s") from None
        if error is not None:
            self._thread.join(timeout_s)
            raise error

    def close(self, timeout_s: float = 10.0) -> None:
        """Commit what is waiting, mark a clean stop, close the file. Idempotent."""
        if self._closed or self._thread is None:
            return
        self._closed = True
        self._running.set()
        self._queue.put(None)
        self._thread.join(timeout_s)

    def pause(self) -> None:
        """Make the writer wait before its next commit (a stalled disk, for tests): what
        is submitted meanwhile goes into one commit after :meth:`resume`."""
        self._running.clear()

    def resume(self) -> None:
        """Let the writer commit again (:meth:`pause`). Idempotent."""
        self._running.set()

    @property
    def over_budget(self) -> bool:
        """Whether the files are past ``max_bytes`` (appends are refused until trimmed)."""
        return bool(self.max_bytes) and self.stats.file_bytes > self.max_bytes

    @property
    def writable(self) -> bool:
        """Whether the last commit succeeded (``/readyz``)."""
        return not self.stats.failing

    # -- submitting (on the loop) ------------------------------------------------------

    def submit_nowait(self, op: Any, on_done: Callable[[Any, BaseException | None], None]) -> None:
        """:meth:`submit` without a future (in-process publishers): only ``on_done``."""
        item = _Item(op, None, on_done)
        if self._closed:
            self._release([item], EventLogError(f"event log {self.path} is closed"))
        else:
            self._queue.put(item)

    def submit(
        self, op: Any, on_done: Callable[[Any, BaseException | None], None] | None = None
    ) -> asyncio.Future[Any]:
        """Queue ``op`` for the next commit; its future resolves after the commit.

        ``on_done(result, error)`` runs on the loop first, in submission order. Never
        blocks, never raises (a closed log fails the future with :class:`EventLogError`).
        """
        future: asyncio.Future[Any] = self.loop.create_future()
        item = _Item(op, future, on_done)
        if self._closed:
            self._release([item], EventLogError(f"event log {self.path} is closed"))
        else:
            self._queue.put(item)
        return future

    @staticmethod
    def _finish(item: _Item, error: BaseException | None) -> None:
        """Hand back one outcome: ``on_done``, then the future (``error`` if it has none)."""
        if error is not None and item.error is None:
            item.error = error
        if item.on_done is not None:
            try:
                item.on_done(item.result, item.error)
            except Exception:
                logger.exception("event_log_callback_failed")
        future = item.future
        if future is not None and not future.done():
            if item.error is not None:
                future.set_exception(item.error)
                future.exception()  # (retrieved: a cancelled waiter must not warn)
            else:
                future.set_result(item.result)

    def _release(self, items: list[_Item], error: BaseException | None) -> None:
        """On the loop: queue outcomes (a commit's) behind the earlier ones not yet handed
        back, and hand back the first slice now unless a release is under way. ``error``
        is the outcome of those without one of their own."""
        self._outcomes.extend((item, error) for item in items)
        if not self._releasing:
            self._release_slice()

    def _release_slice(self) -> None:
        """Hand back one slice of outcomes (module docstring); the rest in a later turn."""
        outcomes = self._outcomes
        self._releasing = True  # (an on_done that submits to a closed log only queues)
        count = nbytes = 0
        while outcomes and count < RELEASE_SLICE and nbytes < RELEASE_SLICE_BYTES:
            item, error = outcomes.popleft()
            self._finish(item, error)
            count += 1
            if isinstance(item.op, Append):
                nbytes += len(item.op.body)
        if outcomes:  # (call_soon: the tasks this slice woke run before the next one)
            self.loop.call_soon(self._release_slice)
        else:
            self._releasing = False

    # -- the writer thread ---------------------------------------------------------------

    def _run(self, ready: queue.SimpleQueue[BaseException | None]) -> None:
        try:
            self._open_file()
        except BaseException as exc:
            self._release_lock()
            ready.put(exc)
            return
        self._checkpointer = threading.Thread(
            target=self._checkpoint_forever, name="qwenweb-event-log-checkpoint", daemon=True
        )
        self._checkpointer.start()
        ready.put(None)
        stop = False
        while not stop:
            first = self._queue.get()
            self._running.wait()
            batch: list[_Item] = []
            if first is None:
                stop = True
            else:
                batch.append(first)
                while len(batch) < MAX_BATCH:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        stop = True
                        break
                    batch.append(more)
            if batch:
                self._commit(batch)
        self._shut()

    def _open_file(self) -> None:
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = Path(f"{path}.lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise LogLockedError(
                f"event log {path} is in use by another process (lock {lock_path}); one "
                "process per log: stop it, or use the Redis backend for several"
            ) from None
        self._lock_fd = fd
        if not path.exists():
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        self._torn = wal_torn(path)
        try:
            self._connect_and_check(path)
        except ForeignLogError:
            if self.on_mismatch != "new_epoch":
                raise
            aside = path.with_name(f"{path.name}.foreign-{int(time.time())}")
            self._drop_connection()
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    Path(f"{path}{suffix}").rename(f"{aside}{suffix}")
            logger.error("event_log_set_aside path=%s moved_to=%s", path, aside)
            os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
            self._connect_and_check(path)

    def _drop_connection(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None

    def _connect_and_check(self, path: Path) -> None:
        try:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._conn = conn
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")  # before the first table only
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise ForeignLogError(f"event log {path}: WAL mode refused ({mode})")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}")
            conn.execute("PRAGMA wal_autocheckpoint=0")  # the checkpointer thread's work
            conn.executescript(SCHEMA)
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.DatabaseError as exc:
            raise ForeignLogError(
                f"event log {path} is unreadable ({exc}); move it aside or set "
                "EVENT_LOG_ON_MISMATCH=new_epoch"
            ) from None
        version = meta.get("schema", SCHEMA_VERSION)
        if meta and (
            version not in (SCHEMA_VERSION, *UPGRADABLE_VERSIONS)
            or (self.deployment and meta.get("deployment", self.deployment) != self.deployment)
        ):
            raise ForeignLogError(
                f"event log {path} belongs to another deployment or version; move it aside "
                "or set EVENT_LOG_ON_MISMATCH=new_epoch"
            )
        generation = int(meta.get("generation", "0"))
        unclean = meta.get("clean") != "1"
        # NORMAL keeps what a process crash leaves, not what a power loss does: after a
        # machine stop that was not clean, every session continues in a new epoch.
        rebooted = meta.get("boot_id", "") != self.boot_id
        if meta and unclean and rebooted and self.synchronous != "FULL":
            generation += 1
            logger.warning("event_log_new_generation path=%s reason=unclean_machine_stop", path)
        elif meta and self._torn:
            # SQLite recovers the WAL up to its last whole transaction; the ids of the torn
            # one may have been acknowledged and seen: never issue them again (each session
            # forks: its committed events go on in a new epoch, docs/protocol.md).
            generation += 1
            logger.warning("event_log_new_generation path=%s reason=torn_wal", path)
        self.generation = generation
        self.stats.rows = self._persisted_rows = int(meta.get("rows", "0"))
        conn.execute("BEGIN IMMEDIATE")
        if version != SCHEMA_VERSION:
            migrate(conn, version)
            logger.info("event_log_upgraded path=%s from=%s to=%s", path, version, SCHEMA_VERSION)
        for key, value in (
            ("schema", SCHEMA_VERSION),
            ("deployment", meta.get("deployment", self.deployment)),
            ("boot_id", self.boot_id),
            ("clean", "0"),
            ("generation", str(generation)),
        ):
            conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
        conn.execute("COMMIT")
        self._measure()

    def _checkpoint_forever(self) -> None:
        """The checkpointer thread: a PASSIVE checkpoint per interval or when due."""
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error:
            logger.exception("event_log_checkpointer_failed path=%s", self.path)
            return
        try:
            conn.execute("PRAGMA busy_timeout=1000")
            while not self._closed:
                self._checkpoint_due.wait(CHECKPOINT_INTERVAL_S)
                self._checkpoint_due.clear()
                if self._closed:
                    break
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:
                    logger.debug("event_log_checkpoint_failed error=%s", exc)
        finally:
            conn.close()

    def _shut(self) -> None:
        checkpointer = self._checkpointer
        if checkpointer is not None:
            self._checkpoint_due.set()
            checkpointer.join(10)
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._persist_rows(conn)
                conn.execute("INSERT OR REPLACE INTO meta VALUES ('clean', '1')")
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._drop_connection()
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _commit(self, batch: list[_Item]) -> None:
        conn = self._conn
        assert conn is not None
        started = time.monotonic()
        failed_before = dict(self._failed_from)
        rows_at_start = self.stats.rows
        error: BaseException | None = None
        try:
            if self.over_budget and any(isinstance(item.op, Append) for item in batch):
                raise StorageFullError(
                    f"event log {self.path} is past EVENT_LOG_MAX_BYTES ({self.max_bytes} bytes)"
                )
            self._rows.clear()
            if all(type(item.op) is Append for item in batch):
                for item in batch:
                    item.result = self._apply(conn, item)
                if self._rows.one_statement:  # (atomic on its own: one GIL wait, not four)
                    self._rows.flush(conn)
                else:
                    conn.execute("BEGIN IMMEDIATE")
                    self._rows.flush(conn)
                    conn.execute("COMMIT")
            else:
                conn.execute("BEGIN IMMEDIATE")
                for item in batch:
                    item.result = self._apply(conn, item)
                self._rows.flush(conn)
                self._persist_rows(conn)
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            full = getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or (
                "full" in str(exc)
            )
            kind = StorageFullError if full else EventLogError
            error = kind(f"event log {self.path}: {exc}")
        except StorageFullError as exc:
            error = exc
        if error is not None:
            self.stats.rows = rows_at_start
            self._persisted_rows = -1  # (a count written in the rolled-back batch is not)
            self._failed_from = failed_before
            for item in batch:
                item.result = None
                op = item.op
                if isinstance(op, Append):
                    first = self._failed_from.get(op.session_id)
                    if first is None or op.event_id < first:
                        self._failed_from[op.session_id] = op.event_id
            if not self.stats.failing:
                logger.error("event_log_write_failed path=%s error=%s", self.path, error)
            self.stats.failing = str(error)
        else:
            if self.stats.failing:
                logger.info("event_log_write_recovered path=%s", self.path)
            self.stats.failing = ""
            self.stats.commits += 1
            self.stats.batch_sizes.append(len(batch))
            self.stats.latencies_s.append(time.monotonic() - started)
            del self.stats.batch_sizes[:-1000], self.stats.latencies_s[:-1000]
            self._commits += 1
            if self._commits % 20 == 0:
                self._measure()
                if self.stats.wal_bytes > CHECKPOINT_WAL_BYTES:
                    self._checkpoint_due.set()
        try:
            self.loop.call_soon_threadsafe(self._release, batch, error)
        except RuntimeError:  # the loop is closed (a test's, or shutdown): nobody waits
            logger.debug("event_log_outcome_dropped reason=loop_closed count=%d", len(batch))

    def _apply(self, conn: sqlite3.Connection, item: _Item) -> Any:
        op = item.op
        if isinstance(op, Append):
            first_failed = self._failed_from.get(op.session_id)
            if first_failed is not None:
                if op.event_id != first_failed:
                    # A later id of a session whose earlier event failed: refused, or the
                    # log would have a hole (the caller rewinds to the first failed id).
                    item.error = EventLogError("an earlier event of the session failed")
                    return None
                del self._failed_from[op.session_id]
            now = self._rows.add(op)
            self.stats.rows += 1
            return now
        self._rows.flush(conn)  # (what comes next may read what the appends wrote)
        if isinstance(op, OpenSession):
            return self._open_session(conn, op)
        if isinstance(op, CloseSession):
            conn.execute(
                "UPDATE heads SET closed_at = ? WHERE session_id = ?", (time.time(), op.session_id)
            )
            return None
        if callable(op):
            return op(conn)
        raise TypeError(f"unknown event log operation {op!r}")

    def _open_session(self, conn: sqlite3.Connection, op: OpenSession) -> Opened:
        self._failed_from.pop(op.session_id, None)
        return read_session(conn, op, self.generation)

    def _persist_rows(self, conn: sqlite3.Connection) -> None:
        """Write the row count to ``meta`` if it changed since it was last written (in the
        caller's transaction: the trim step's commits and a clean stop, not every append)."""
        if self.stats.rows != self._persisted_rows:
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('rows', ?)", (str(self.stats.rows),))
            self._persisted_rows = self.stats.rows

    def _measure(self) -> None:
        sizes = [0, 0]
        for index, suffix in enumerate(("", "-wal")):
            with contextlib.suppress(OSError):
                sizes[index] = os.stat(f"{self.path}{suffix}").st_size
        self.stats.file_bytes = sizes[0] + sizes[1]
        self.stats.wal_bytes = sizes[1]

    def trim_step(
        self,
        conn: sqlite3.Connection,
        keep_from: dict[str, int],
        closed_before: float,
        key_ttl_s: float,
    ) -> int:
        """:func:`~sessions.backends.event_log_sql.trim_step` in a commit (writer thread),
        then the figures; returns the rows deleted."""
        deleted = trim_step(conn, keep_from, closed_before, key_ttl_s)
        self.stats.rows = max(0, self.stats.rows - deleted)
        self._measure()
        return deleted
