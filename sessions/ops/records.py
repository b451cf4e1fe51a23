"""Operator records: one row per subscriber connection, one per warning and eviction.

What is recorded (``sessions.models``)
    :class:`~sessions.models.SubscriberConnection` — who (login user or token subject),
    from where (client address, ``User-Agent``, ``X-Client-Id``), when (opened, closed),
    how much (frames and bytes written) and how it ended (``client_disconnect``,
    ``client_evicted``, ``stream_error``, ``session_closed``, ``server_disconnect``,
    ``operator_disconnect`` (one subscriber ended by an operator; detail ``by <name>``),
    ``server_shutdown``), with the exact JSON of a terminal ``client_evicted`` /
    ``stream_error`` frame. :class:`~sessions.models.SubscriberIncident` — one row per
    ``slow_client_warning`` and ``client_evicted`` frame written to a client, with the
    exact JSON envelope it received (the ``data:`` line, cut from the bytes written).

How it learns what happens
    :class:`Recorder` is a :class:`~sessions.hooks.Listener`, connected in
    ``AppConfig.ready``: each connection the stream route announces gets a
    :class:`ConnectionRecord` as its observer, told the frames of each ``send`` once it
    accepted them (with the exact JSON of their ``data:`` lines), the bytes that are not
    frames (``retry:``, heartbeats), and once how the stream ended (later calls are
    ignored).

Concurrency model and cost
    Everything here runs on the server's event loop (EB-11) and only touches memory:
    no method awaits, touches the database or raises, so the stream may call them in its
    frame loop and nothing here is on the publish path at all. A background task on the
    loop (:meth:`Recorder.run`, started by :mod:`sessions.ops.lifecycle` when the server's
    loop is attached) writes the pending batch through ``database_sync_to_async``:
    every ``RECORDS_FLUSH_INTERVAL_S`` seconds when something is pending, at once when
    ``RECORDS_BATCH_SIZE`` rows to upsert or insert are pending, and at shutdown.
    A connection whose row is already written and whose counters alone moved is not a
    row to upsert: its ``frames_sent`` and ``bytes_sent`` go out with the next timed
    write as one ``UPDATE`` (``executemany``), at most one per open connection, and they
    never trigger a write early. One write is one transaction: the upserts of whole
    rows, the inserts of incidents, the counter updates. An upsert through the ORM costs
    about 100–150 µs per row, a counter update about 6–8 µs
    (docs/benchmarks.md, "The operator records at 4,000 open streams"). Writes are
    idempotent (upserts keyed by ids made in memory, UUIDs; updates of absolute
    values), so a batch whose outcome is unknown (a failed or cancelled write) is
    simply put back and written again.

Losing nothing on a clean shutdown
    See :mod:`sessions.ops.lifecycle`: the server's shutdown path waits (bounded) for the
    streams it cancels to record their end, closes the rest as ``server_shutdown`` and
    writes everything (:meth:`Recorder.drain`); an ``atexit`` hook writes whatever is
    still pending synchronously (:meth:`Recorder.flush_sync`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any, Final

from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.utils import timezone

from sessions.bus import Frame
from sessions.conf import get_config
from sessions.hooks import ConnectionInfo, ConnectionObserver, Listener
from sessions.models import AgentSession, SubscriberConnection, SubscriberIncident

__all__ = [
    "INCIDENT_TYPES",
    "Batch",
    "ConnectionRecord",
    "Recorder",
    "recorder",
    "write_batch",
]

logger = logging.getLogger("qwenweb.records")
stream_logger = logging.getLogger("qwenweb.stream")  # the one line per closed stream

INCIDENT_TYPES: Final = frozenset({"slow_client_warning", "client_evicted"})
"""Synthetic frame types that get one :class:`~sessions.models.SubscriberIncident` row."""

_TERMINAL_TYPES: Final = frozenset({"client_evicted", "stream_error"})
_SPECIAL_TYPES: Final = INCIDENT_TYPES | _TERMINAL_TYPES
MAX_PENDING_INCIDENTS: Final = 100_000
"""Incidents kept in memory while the database refuses writes; the oldest go beyond."""

_INFO_FIELDS: Final = tuple(f.name for f in fields(ConnectionInfo))
"""The row's fields a :class:`ConnectionInfo` gives (its own, by name)."""

_UPSERT_FIELDS: Final = (
    "frames_sent",
    "bytes_sent",
    "closed_at",
    "end_reason",
    "end_detail",
    "end_payload",
)


@dataclass(eq=False)
class ConnectionRecord(ConnectionObserver):
    """The in-memory record of one subscriber connection (one future database row).

    ``info`` (clipped to the columns' widths) gives the row's first fields, the rest mirror
    :class:`~sessions.models.SubscriberConnection`. Made by
    :meth:`Recorder.connection_opened`; updated by the stream through the three observer
    methods below.
    """

    info: ConnectionInfo
    opened_at: datetime
    recorder: Recorder = field(repr=False)
    closed_at: datetime | None = None
    frames_sent: int = 0
    bytes_sent: int = 0
    end_reason: str = ""
    end_detail: str = ""
    end_payload: str = ""
    evictions_written: int = 0
    row_written: bool = field(default=False, repr=False)
    """The database holds this record's row as it is, but for the counters: set once a
    write of the whole row committed, cleared when anything but the counters changes."""

    @property
    def id(self) -> uuid.UUID:
        """The connection's id (the row's primary key)."""
        return self.info.id

    @property
    def session_id(self) -> str:
        """The session the connection streams."""
        return self.info.session_id

    def frames_written(
        self,
        frames: Sequence[Frame],
        wires: Sequence[bytes],
        payloads: Sequence[bytes],
        nbytes: int,
    ) -> None:
        """Count the frames one ``send`` accepted; record warnings and evictions.

        Only ``slow_client_warning``, ``client_evicted`` and ``stream_error`` frames are
        looked into: their payload (the JSON of the ``data:``
        line, as written) is kept. Never raises, never awaits.
        """
        self.frames_sent += len(frames)
        self.bytes_sent += nbytes
        for index, frame in enumerate(frames):
            if frame.type in _SPECIAL_TYPES:
                data = frame.get("data")
                self._special_frame(
                    frame.type,
                    payloads[index].decode("utf-8", "replace"),
                    data if isinstance(data, dict) else {},
                )
        self.recorder.mark(self)

    def bytes_written(self, nbytes: int) -> None:
        """Count body bytes that are not frames (``retry:``, heartbeats). Never raises."""
        self.bytes_sent += nbytes
        self.recorder.mark(self)

    def closed(self, reason: str, detail: str = "") -> None:
        """Record how the connection ended; the first call wins, later ones are ignored.

        ``reason`` is one of ``SubscriberConnection.EndReason``; ``detail`` (clipped to
        200 characters) replaces the one taken from a terminal frame, if given. Never
        raises.
        """
        if self.closed_at is not None:
            return
        self.closed_at = timezone.now()
        self.row_written = False
        self.end_reason = reason
        if detail:
            self.end_detail = detail[:200]
        elif reason == SubscriberConnection.EndReason.CLIENT_EVICTED and not self.evictions_written:
            self.end_detail = "client_evicted frame never written"
        stream_logger.info(
            "stream_closed session=%s subscriber=%s reason=%s detail=%s duration_s=%.3f "
            "frames=%d bytes=%d auth=%s client=%s transport=%s",
            self.session_id,
            self.info.label,
            reason,
            self.end_detail,
            (self.closed_at - self.opened_at).total_seconds(),
            self.frames_sent,
            self.bytes_sent,
            self.info.auth,
            self.info.client_addr or "-",
            self.info.transport,
        )
        self.recorder.connection_closed(self)

    def _special_frame(self, frame_type: str, payload: str, data: dict[str, Any]) -> None:
        if frame_type in _TERMINAL_TYPES:
            self.row_written = False
            self.end_payload = payload
            detail = data.get("reason") or data.get("code") or data.get("error") or ""
            self.end_detail = str(detail)[:200]
        if frame_type in INCIDENT_TYPES:
            evicted = frame_type == "client_evicted"
            self.evictions_written += evicted
            event_id = data.get("droppedAfter" if evicted else "lastEventId")
            self.recorder.incident(
                self,
                {
                    "id": uuid.uuid4(),
                    "session_id": self.session_id,
                    "connection_id": self.id,
                    "kind": frame_type,
                    "reason": str(data.get("reason" if evicted else "threshold", ""))[:40],
                    "event_id": event_id if isinstance(event_id, int) else None,
                    "at": timezone.now(),
                    "payload": payload,
                },
            )

    def row(self) -> dict[str, Any]:
        """Return the fields of the database row as they are now (a snapshot)."""
        return {
            **{name: getattr(self.info, name) for name in _INFO_FIELDS},
            "opened_at": self.opened_at,
            "closed_at": self.closed_at,
            "frames_sent": self.frames_sent,
            "bytes_sent": self.bytes_sent,
            "end_reason": self.end_reason,
            "end_detail": self.end_detail,
            "end_payload": self.end_payload,
        }


@dataclass(frozen=True, slots=True)
class Batch:
    """What one flush writes: connection rows (upserted whole), new incident rows, and
    ``(id, frames_sent, bytes_sent)`` of connections whose rows are written already."""

    connections: list[dict[str, Any]]
    incidents: list[dict[str, Any]]
    counters: list[tuple[uuid.UUID, int, int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.connections) + len(self.incidents) + len(self.counters)


_NO_USER: Final = {"user_id": None}


def write_batch(batch: Batch) -> None:
    """Write ``batch`` in one transaction (sync; a worker thread or the exiting main thread).

    Connections are upserted by id (insert, or update the counters and the end of an
    existing row); incidents are inserted, ignoring ids already present; counters are
    set on the rows that exist (one ``UPDATE`` per row, sent as one ``executemany``). So
    writing the same batch twice changes nothing. Rows of sessions deleted meanwhile are
    dropped (a counter update then matches no row); a connection of a user deleted before
    its row was first written is written without its user. Raises whatever the database
    raises (nothing is then committed).
    """
    session_ids = {row["session_id"] for row in batch.connections} | {
        row["session_id"] for row in batch.incidents
    }
    user_ids = {row["user_id"] for row in batch.connections if row["user_id"] is not None}
    with transaction.atomic():
        existing = set(AgentSession.objects.filter(pk__in=session_ids).values_list("pk", flat=True))
        # A user deleted before the row's first write: no user, as the foreign key's
        # SET_NULL leaves the rows written before (an insert naming it would fail the
        # whole batch, and every retry of it).
        users = set(get_user_model().objects.filter(pk__in=user_ids).values_list("pk", flat=True))
        connections = [
            SubscriberConnection(
                **(row if row["user_id"] is None or row["user_id"] in users else row | _NO_USER)
            )
            for row in batch.connections
            if row["session_id"] in existing
        ]
        SubscriberConnection.objects.bulk_create(
            connections,
            batch_size=500,
            update_conflicts=True,
            unique_fields=["id"],
            update_fields=list(_UPSERT_FIELDS),
        )
        incidents = [
            SubscriberIncident(**row) for row in batch.incidents if row["session_id"] in existing
        ]
        SubscriberIncident.objects.bulk_create(incidents, batch_size=500, ignore_conflicts=True)
        if batch.counters:
            _update_counters(batch.counters)
    dropped = len(batch.connections) + len(batch.incidents) - len(connections) - len(incidents)
    if dropped:
        logger.info("records_dropped rows=%d reason=session_deleted", dropped)


def _update_counters(counters: Sequence[tuple[uuid.UUID, int, int]]) -> None:
    """Set ``frames_sent`` and ``bytes_sent`` of existing connection rows, in the caller's
    transaction. The ORM's ``bulk_update`` (a ``CASE`` per column) took about 600 µs per
    row at 4,000 rows, a ``filter().update()`` per row about 200 µs; one ``executemany``
    of a plain ``UPDATE`` takes 6–8 µs."""
    pk = SubscriberConnection._meta.pk
    assert pk is not None
    with connection.cursor() as cursor:
        cursor.executemany(
            _counters_sql(),
            [(f, b, pk.get_db_prep_value(i, connection)) for i, f, b in counters],
        )


@functools.cache
def _counters_sql() -> str:
    """The ``UPDATE`` of :func:`_update_counters`, names from the model's metadata."""
    meta = SubscriberConnection._meta
    quote = connection.ops.quote_name
    columns = {f.name: quote(f.column) for f in meta.concrete_fields if f.column}
    return (  # names quoted; values are parameters
        f"UPDATE {quote(meta.db_table)} SET {columns['frames_sent']} = %s, "  # noqa: S608
        f"{columns['bytes_sent']} = %s WHERE {columns['id']} = %s"
    )


Writer = Callable[[Batch], Awaitable[None]]


async def _write_in_thread(batch: Batch) -> None:
    await database_sync_to_async(write_batch)(batch)


class Recorder(Listener):
    """Queue record changes in memory and write them in batches (see the module docstring).

    Args:
        writer: ``async writer(batch)``; default :func:`write_batch` in a worker thread.
        flush_interval_s: seconds between timed flushes; default the
            ``RECORDS_FLUSH_INTERVAL_S`` setting (read when :meth:`run` starts).
        batch_size: rows to insert or upsert (connections, incidents) that trigger a
            flush at once; default the ``RECORDS_BATCH_SIZE`` setting. Counter updates
            never do.
    """

    def __init__(
        self,
        *,
        writer: Writer | None = None,
        flush_interval_s: float | None = None,
        batch_size: int | None = None,
    ) -> None:
        self._writer = writer or _write_in_thread
        self._flush_interval_s = flush_interval_s
        self._batch_size = batch_size
        self._open: dict[uuid.UUID, ConnectionRecord] = {}
        self._dirty: dict[uuid.UUID, ConnectionRecord | _Snapshot] = {}
        # Connections whose rows are written, with counters moved since (no early write).
        self._counters: dict[uuid.UUID, ConnectionRecord] = {}
        self._incidents: list[dict[str, Any]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._all_closed: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._task: asyncio.Task[None] | None = None
        self.flushes = 0
        """Successful writes so far (for tests and the operator's curiosity)."""

    # -- the hot side: memory only ----------------------------------------------------

    @property
    def batch_size(self) -> int:
        return self._batch_size or get_config().records_batch_size

    @property
    def flush_interval_s(self) -> float:
        return self._flush_interval_s or get_config().records_flush_interval_s

    @property
    def pending(self) -> int:
        """Changes waiting for the next write (connections to upsert, connections whose
        counters moved, new incidents)."""
        return len(self._dirty) + len(self._counters) + len(self._incidents)

    @property
    def open_connections(self) -> int:
        """Connections opened and not yet closed in this process."""
        return len(self._open)

    def opened(self, record: ConnectionRecord) -> None:
        """Register a new connection (it is written with the next batch)."""
        self._open[record.id] = record
        if self._all_closed is not None:
            self._all_closed.clear()
        self.mark(record)

    def mark(self, record: ConnectionRecord) -> None:
        """Note that ``record`` changed; wake the writer when the batch is full.

        A record whose row is written and whose counters alone moved waits for the next
        timed write: it never fills the batch (at most one entry per open connection).
        """
        key = record.info.id
        if key in self._dirty:
            if isinstance(self._dirty[key], _Snapshot):  # put back after a failed write
                self._dirty[key] = record  # the record's newer state, not the snapshot
            return
        if record.row_written:
            self._counters[key] = record
            return
        self._counters.pop(key, None)
        self._dirty[key] = record
        self._wake_writer_if_full()

    def incident(self, record: ConnectionRecord, row: dict[str, Any]) -> None:
        """Queue one incident row."""
        self._incidents.append(row)
        if len(self._incidents) > MAX_PENDING_INCIDENTS:
            del self._incidents[0]
            logger.error("records_overflow dropped=1 kind=%s", row["kind"])
        self._wake_writer_if_full()

    def connection_closed(self, record: ConnectionRecord) -> None:
        """Take ``record`` off the open list (it is written with the next batch)."""
        self._open.pop(record.id, None)
        self.mark(record)
        if not self._open and self._all_closed is not None:
            self._all_closed.set()
        logger.debug(
            "subscriber_closed session=%s subscriber=%s reason=%s frames=%d bytes=%d",
            record.session_id,
            record.info.label,
            record.end_reason,
            record.frames_sent,
            record.bytes_sent,
        )

    def close_all(self, reason: str, detail: str = "") -> int:
        """Close every open connection with ``reason``; return how many. Never raises."""
        records = list(self._open.values())
        for record in records:
            record.closed(reason, detail)
        return len(records)

    def _wake_writer_if_full(self) -> None:
        """Wake the writer once ``batch_size`` rows wait to be inserted or upserted
        (counter updates do not count)."""
        if len(self._dirty) + len(self._incidents) >= self.batch_size:
            self._wake_writer()

    def _wake_writer(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # -- the listener: one record per connection ---------------------------------------

    def connection_opened(self, info: ConnectionInfo) -> ConnectionRecord:
        """Start recording a subscriber connection; return its record (the observer).

        Called on the loop once the subscriber is attached (so refused requests leave no
        row). Never awaits, never raises.
        """
        clipped = replace(  # the columns' widths
            info,
            subject=info.subject[:150],
            client_addr=info.client_addr[:64],
            user_agent=info.user_agent[:300],
            client_id=info.client_id[:200],
        )
        record = ConnectionRecord(clipped, opened_at=timezone.now(), recorder=self)
        self.opened(record)
        logger.debug(
            "subscriber_opened session=%s subscriber=%s auth=%s subject=%s client=%s max_queued=%d",
            info.session_id,
            clipped.label,
            info.auth,
            clipped.subject or "-",
            clipped.client_addr or "-",
            info.max_queued,
        )
        return record

    # -- the writer: a task on the server's loop -----------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start :meth:`run` on ``loop`` (the server's) unless it runs there already."""
        if self._loop is loop and self._task is not None and not self._task.done():
            return
        self._loop = loop
        self._wake = asyncio.Event()
        self._all_closed = asyncio.Event()
        if not self._open:
            self._all_closed.set()
        self._lock = asyncio.Lock()
        self._task = loop.create_task(self.run(), name="qwenweb-records")

    async def run(self) -> None:
        """Flush every interval while something is pending, or at once on a full batch.

        Runs until cancelled. A failed write is logged and its batch put back.
        """
        assert self._wake is not None
        while True:
            try:
                async with asyncio.timeout(self.flush_interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            if self.pending:
                await self.flush()

    async def flush(self) -> int:
        """Write everything pending now; return the rows written (0 on failure).

        One write at a time. On failure or cancellation the batch is put back (writes
        are idempotent) and the failure logged once per attempt. Never raises except
        ``CancelledError``.
        """
        lock = self._lock or asyncio.Lock()
        async with lock:
            batch, whole = self._take()
            if not batch:
                return 0
            try:
                await self._writer(batch)
            except asyncio.CancelledError:
                self._put_back(batch)
                raise
            except Exception as exc:
                self._put_back(batch)
                logger.error(
                    "records_write_failed rows=%d pending=%d error=%s: %s",
                    len(batch),
                    self.pending,
                    type(exc).__name__,
                    exc,
                )
                return 0
            self._written(whole)
            self.flushes += 1
            return len(batch)

    async def drain(self, timeout_s: float) -> int:
        """The shutdown sequence on the loop: wait for ends, close the rest, write all.

        Waits until every open connection recorded its end (the server is cancelling
        the streams; each records ``server_shutdown`` in its ``finally``), at most
        ``timeout_s`` seconds; closes those still open as ``server_shutdown``; flushes.
        Returns the rows written.
        """
        if self._open and self._all_closed is not None:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._all_closed.wait()
            except TimeoutError:
                pass
        self.close_all(SubscriberConnection.EndReason.SERVER_SHUTDOWN.value, "open at shutdown")
        return await self.flush()

    def flush_sync(self) -> int:
        """Close what is open as ``server_shutdown`` and write everything, in this thread.

        For ``atexit``: the loop is gone. Must not run while a loop runs in this thread
        (Django refuses synchronous queries there). Returns the rows written; logs and
        returns 0 on a database error.
        """
        self.close_all(SubscriberConnection.EndReason.SERVER_SHUTDOWN.value, "open at exit")
        batch, whole = self._take()
        if not batch:
            return 0
        try:
            write_batch(batch)
        except Exception as exc:
            logger.error(
                "records_write_failed rows=%d at_exit=1 error=%s: %s",
                len(batch),
                type(exc).__name__,
                exc,
            )
            return 0
        self._written(whole)
        self.flushes += 1
        return len(batch)

    def discard(self) -> None:
        """Forget everything pending and stop the writer (tests). Never raises."""
        if self._task is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._task = self._loop = self._wake = self._all_closed = self._lock = None
        self._open.clear()
        self._dirty.clear()
        self._counters.clear()
        self._incidents.clear()

    def _take(self) -> tuple[Batch, list[ConnectionRecord]]:
        """The batch to write now, and the records whose whole rows it holds."""
        whole = [r for r in self._dirty.values() if isinstance(r, ConnectionRecord)]
        batch = Batch(
            [r.row() for r in self._dirty.values()],
            self._incidents,
            [(r.info.id, r.frames_sent, r.bytes_sent) for r in self._counters.values()],
        )
        self._dirty, self._counters, self._incidents = {}, {}, []
        return batch, whole

    def _written(self, whole: list[ConnectionRecord]) -> None:
        """The rows of ``whole`` committed: the counters alone of those still open go out
        from now on, unless a newer whole row is pending already (it changed during the
        write)."""
        for record in whole:
            key = record.info.id
            # A closed record stays on the whole-row path (a put-back of it is a snapshot).
            if key in self._open and key not in self._dirty:
                record.row_written = True

    def _put_back(self, batch: Batch) -> None:
        for row in batch.connections:
            if row["id"] in self._dirty:
                continue  # changed again since the snapshot: the newer state will be written
            record = self._open.get(row["id"])
            # A record closed before the snapshot is no longer in memory: keep the snapshot.
            self._dirty[row["id"]] = record if record is not None else _Snapshot(row)
            self._counters.pop(row["id"], None)
        for key, _, _ in batch.counters:
            record = self._open.get(key)
            # Closed since: its whole row (final counters included) is pending already.
            if record is not None and key not in self._dirty:
                self._counters.setdefault(key, record)
        self._incidents[:0] = batch.incidents
        del self._incidents[: max(0, len(self._incidents) - MAX_PENDING_INCIDENTS)]


class _Snapshot:
    """A connection row put back after a failed write, for a record no longer in memory."""

    def __init__(self, row: dict[str, Any]) -> None:
        self._row = row

    def row(self) -> dict[str, Any]:
        return self._row


recorder = Recorder()
"""The process's recorder (connected to :data:`sessions.hooks.hooks` by ``sessions.apps``)."""
