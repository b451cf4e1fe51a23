"""The durable backend: the memory backend's sessions, with history in a local event log.

Setting ``BACKEND = "durable"``. One process, as the memory backend (its holds and idle
unload included), but every event is committed to an SQLite log of its own
(:mod:`sessions.backends.event_log`) before anyone sees it, so a restart or a crash of the
process is just another disconnect: the epoch and the next id of each session are in the
log, and a restarted process serves a session's ring from the log on first use (lazily).

Publishing (docs/protocol.md, "Durable history")
    The id is assigned on the loop, the event goes to the log's writer thread, and the
    bus gets it only after its commit (:meth:`EventBus.ingest`, in id order, from the
    commit's callbacks, a slice per loop turn: :mod:`~sessions.backends.event_log`): a
    subscriber never receives an event a crash could take back, and a committed batch
    reaches the bus through the same entry point as the Redis mirror's catch-up.
    :meth:`publish` answers after the commit; an ``Idempotency-Key`` is
    committed in the same transaction as its event. :meth:`publish_nowait` (in-process
    publishers) never raises nor blocks: the event waits in a pending buffer bounded in
    bytes (:data:`MAX_PENDING_BYTES`); past it the event is dropped, counted and logged.

Closed sessions
    A closed session's history stays readable ``CLOSED_HISTORY_S`` after its close: the
    closed bus kept since the close, or, after a restart, its newest events read from the
    log on the first snapshot (lazily, as open sessions are) and kept from then on.

Faults
    A commit that fails (disk full, the budget ``EVENT_LOG_MAX_BYTES`` reached) fails its
    publishes with :class:`StorageFullError` (503 ``storage_full``) and the session's next
    id goes back to the first one not committed; streams keep serving what is committed;
    the next commit that succeeds resumes publishing. ``health()`` fails meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Final

from channels.db import database_sync_to_async
from django.conf import settings
from django.utils import timezone

from sessions.backends import rows
from sessions.backends.base import (
    Health,
    LiveSession,
    Published,
    StoreFigures,
    session_closed_event,
)
from sessions.backends.closed_history import history_kept
from sessions.backends.errors import (
    BackendStartError,
    BackendUnavailableError,
    SessionClosedError,
)
from sessions.backends.event_log import (
    Append,
    EventLog,
    EventLogError,
    Opened,
    OpenSession,
    read_history,
)
from sessions.backends.event_log import StorageFullError as _LogFull
from sessions.backends.idempotency import (
    IdempotencyKey,
    IdempotencyKeyReusedError,
    IdempotencyStore,
)
from sessions.backends.memory import MemoryBackend
from sessions.backends.redis_store import entry_json
from sessions.backends.snapshot import SnapshotPage
from sessions.bus import EventBus, Frame, encode_envelope, envelope_fields
from sessions.conf import QwenwebConfig
from sessions.hooks import Hooks
from sessions.models import AgentSession
from sessions.runtime import ServerLoop

__all__ = [
    "MAX_PENDING_BYTES",
    "PENDING_EVENT_OVERHEAD",
    "DurableBackend",
    "StorageFullError",
    "log_path",
]

logger = logging.getLogger("qwenweb.backend")

MAX_PENDING_BYTES: Final = 64 * 1024 * 1024
"""Bytes of events waiting for a commit past which :meth:`DurableBackend.publish_nowait`
drops (each event counts its frame's bytes plus :data:`PENDING_EVENT_OVERHEAD`): about
43,000 events of 266 bytes on the wire, so a burst of 20,000 from a publisher that yields
once per event fits whatever share of the interpreter lock the writer thread gets."""
PENDING_EVENT_OVERHEAD: Final = 1280
"""Bytes an event waiting for its commit holds besides its frame (its body, the operation,
the commit's callback): 1,238 traced by ``tracemalloc`` per event of 10,000 pending."""
TRIM_INTERVAL_S: Final = 1.0
"""How often the background deletion takes one bounded step."""


class StorageFullError(BackendUnavailableError):
    """Raised by a publish whose commit failed for lack of disk (a 503 ``storage_full``)."""

    code = "storage_full"
    public_message = "the event log's disk is full: nothing was stored; try again later"


def database_fingerprint() -> str:
    """A short hash naming Django's default database (engine, name, host, port)."""
    db = settings.DATABASES["default"]
    ident = "|".join(str(db.get(k, "")) for k in ("ENGINE", "NAME", "HOST", "PORT"))
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def log_path(config: QwenwebConfig) -> Path:
    """The event log's file: ``EVENT_LOG_PATH``, else ``<sqlite db>.events.sqlite3``, else
    ``var/events-<database fingerprint>.sqlite3`` beside the project (another database
    gets its own log)."""
    if config.event_log_path:
        return Path(config.event_log_path)
    db = settings.DATABASES["default"]
    name = str(db.get("NAME", ""))
    if db.get("ENGINE") == "django.db.backends.sqlite3" and name and "memory" not in name:
        return Path(f"{name}.events.sqlite3")
    return Path(settings.BASE_DIR) / "var" / f"events-{database_fingerprint()}.sqlite3"


@dataclass(eq=False)
class DurableLiveSession(LiveSession):
    """A live session whose events are committed to the log before the bus gets them."""

    # The id the next publish takes (the bus's next_id plus the events being committed).
    _next_id: int = 0
    # Bumped each time a failed commit rewinds _next_id (a stale failure rewinds nothing).
    _rewinds: int = 0
    _closing: bool = False
    # Keys of publishes being committed: a retry waits for the first one's answer.
    _pending_keys: dict[str, tuple[str, asyncio.Future[Published]]] = field(
        default_factory=dict, repr=False
    )


def _probe_write(conn: Any) -> None:
    conn.execute("INSERT OR REPLACE INTO meta VALUES ('probed_at', ?)", (str(time.time()),))


class _OpeningLoop(ServerLoop):
    """The server loop that opens the log when it is captured (start-up: a log that
    cannot be opened stops the server with one line)."""

    def __init__(self, hooks: Hooks, backend: DurableBackend) -> None:
        super().__init__(hooks)
        self._backend = backend

    def attach(self) -> asyncio.AbstractEventLoop:
        loop = super().attach()
        self._backend.open_log(loop)
        return loop


class DurableBackend(MemoryBackend):
    """Sessions of this process with durable history (setting ``BACKEND = "durable"``)."""

    events_outlive_process: ClassVar[bool] = True
    name: ClassVar[str] = "durable"
    store_label: ClassVar[str] = "The event log"

    @classmethod
    def deploy_problems(cls, config: QwenwebConfig) -> list[tuple[str, str]]:
        """Say which durability level runs (``EVENT_LOG_SYNCHRONOUS``)."""
        if config.event_log_synchronous == "FULL":
            return []
        return [
            (
                "BACKEND is 'durable' with EVENT_LOG_SYNCHRONOUS=NORMAL: acknowledged events "
                "survive a crash of the process, not a power loss (sessions then continue "
                "in a new epoch).",
                "Set QWENWEB['EVENT_LOG_SYNCHRONOUS'] = 'FULL' to survive a power loss, at "
                "the cost measured in docs/benchmarks.md.",
            )
        ]

    @classmethod
    def check_can_start(cls, config: QwenwebConfig) -> None:
        """Open the log and close it again: a log that is locked, unreadable or another
        deployment's raises :class:`BackendStartError` naming the file. What opening
        finds (a torn WAL, an unclean stop: a new generation) is kept in the log."""
        loop = asyncio.new_event_loop()
        try:
            cls._new_log(config, loop).close()
        except EventLogError as exc:
            raise BackendStartError(str(exc)) from None
        finally:
            loop.close()

    @staticmethod
    def _new_log(config: QwenwebConfig, loop: asyncio.AbstractEventLoop) -> EventLog:
        """The log of ``config`` for ``loop``, open. Raises :class:`EventLogError`."""
        log = EventLog(
            log_path(config),
            loop,
            synchronous=config.event_log_synchronous,
            deployment=database_fingerprint(),
            on_mismatch=config.event_log_on_mismatch,
            max_bytes=config.event_log_max_bytes,
        )
        log.open()
        return log

    def __init__(self, config: QwenwebConfig, hooks: Hooks) -> None:
        super().__init__(config, hooks)
        self.loop = _OpeningLoop(hooks, self)
        self.log: EventLog | None = None
        self.dropped = 0
        self._pending_bytes = 0  # of the events waiting for a commit: MAX_PENDING_BYTES
        self._trimmer: asyncio.Task[None] | None = None

    # -- the log -----------------------------------------------------------------------

    def open_log(self, loop: asyncio.AbstractEventLoop) -> EventLog:
        """Open the log for ``loop`` (once per loop; blocks while the file opens).

        Raises :class:`~sessions.backends.event_log.EventLogError` naming the file
        (locked by another process, unreadable, another deployment's).
        """
        log = self.log
        if log is not None and log.loop is loop:
            return log
        if log is not None:
            log.close()
        log = self._new_log(self.config, loop)
        self.log = log
        logger.info(
            "event_log_opened path=%s synchronous=%s generation=%d",
            log.path,
            log.synchronous,
            log.generation,
        )
        return log

    async def _log(self) -> EventLog:
        log = self.log
        loop = asyncio.get_running_loop()
        if log is None or log.loop is not loop:
            try:
                log = await asyncio.to_thread(self.open_log, loop)
            except EventLogError as exc:
                raise BackendUnavailableError(str(exc)) from None
        return log

    def close_log(self) -> None:
        """Commit what waits and close the log (any thread; tests, shutdown). Idempotent."""
        log, self.log = self.log, None
        if log is not None:
            log.close()

    # -- loading -----------------------------------------------------------------------

    async def _load(self, session_id: str) -> LiveSession:
        config = self.config
        log = await self._log()
        row, start_id, reserved_until = await database_sync_to_async(rows.load_and_reserve)(
            session_id,
            config.id_reservation_block,
            holder=rows.process_holder(),
            hold_ttl_s=config.session_hold_ttl_s,
        )
        self._start_tasks()
        ring_size = row.ring_size or config.ring_size
        opened: Opened = await self._wait(
            log.submit(
                OpenSession(
                    session_id,
                    start_id,
                    ring_size,
                    config.ring_max_bytes,
                    config.idempotency_max_keys,
                    config.idempotency_ttl_s,
                )
            )
        )
        bus = self._bus_from_log(session_id, ring_size, opened)
        first_id = bus.start_id
        store = IdempotencyStore(config.idempotency_max_keys, config.idempotency_ttl_s)
        for key, digest, event_id, epoch in opened.keys:
            store.remember(IdempotencyKey(key, digest), event_id, epoch)
        live = DurableLiveSession(
            session_id=session_id,
            title=row.title,
            owner_id=row.owner_id,
            bus=bus,
            reserved_until=reserved_until,
            created_at=row.created_at.isoformat(),
            ring_size=bus.ring_size,
            stream_compression=row.stream_compression,
            idempotency=store,
            _next_id=opened.next_id,
        )
        if opened.closed:  # the close committed, the row not yet marked: finish it
            bus.close()
            await self.save_progress(
                live, status=AgentSession.Status.CLOSED, closed_at=timezone.now(), held_by=""
            )
            raise SessionClosedError(session_id, row.owner_id)
        logger.info(
            "bus_started session=%s first_id=%d next_id=%d epoch=%s new_epoch=%s replayable=%d"
            " forked_from=%s",
            session_id,
            first_id,
            opened.next_id,
            opened.epoch,
            opened.new,
            len(opened.events),
            ",".join(f"{name}:{last}" for name, last in opened.lineage.items()) or "-",
        )
        return live

    def _bus_from_log(self, session_id: str, ring_size: int, opened: Opened) -> EventBus:
        """A bus of ``opened``'s epoch holding its events (a forked epoch's gap and lineage
        included, EB-23)."""
        first_id = opened.events[0][0] if opened.events else opened.next_id
        gap = opened.gap
        if gap is not None and first_id == gap[1]:
            first_id = gap[0] + 1  # (the ring starts at the gap: the bus starts before it)
        bus = self.new_bus(
            session_id,
            ring_size,
            start_id=first_id,
            epoch=opened.epoch,
            gap=gap,
            lineage=opened.lineage,
        )
        for event_id, event_type, body in opened.events:
            bus.ingest(Frame.from_json(event_id, event_type, entry_json(event_id, body)))
        return bus

    async def closed_snapshot(
        self, row: AgentSession, *, limit: int | None = None, before: int | None = None
    ) -> SnapshotPage | None:
        """The closed session's history within ``CLOSED_HISTORY_S`` of its close: kept in
        this process since the close, or read from the log once (after a restart) and kept
        from then on. None past the retention or when the log holds none of its events.
        Raises :class:`BackendUnavailableError` (the log cannot be read)."""
        if not history_kept(row.closed_at, self.config.closed_history_s):
            return None
        kept = self.closed_histories.get(row.id)
        if kept is None:
            ring_size = row.ring_size or self.config.ring_size
            log = await self._log()
            read = functools.partial(
                read_history,
                session_id=row.id,
                ring_size=ring_size,
                ring_max_bytes=self.config.ring_max_bytes,
            )
            opened: Opened | None = await self._wait(log.submit(read))
            if opened is None or not opened.events:
                return None
            bus = self._bus_from_log(row.id, ring_size, opened)
            bus.close()
            created_at = row.created_at.isoformat()
            kept = LiveSession(row.id, row.title, row.owner_id, bus, 0, created_at, ring_size)
            self.closed_histories.keep(row.id, kept)
        return self._snapshot_page(kept, limit, before, 0)

    @staticmethod
    async def _wait(future: asyncio.Future[Any]) -> Any:
        try:
            return await asyncio.shield(future)
        except _LogFull as exc:
            raise StorageFullError(str(exc)) from None
        except EventLogError as exc:
            raise BackendUnavailableError(str(exc)) from None

    # -- publishing --------------------------------------------------------------------

    def _append(
        self,
        live: LiveSession,
        event: Mapping[str, Any],
        key: IdempotencyKey | None = None,
        *,
        closes: bool = False,
        wait: bool = True,
    ) -> tuple[Frame, asyncio.Future[Any] | None] | None:
        """Give the event the next id and submit it; the frame (delivered after the
        commit) and the commit's future (None without ``wait``), or None (closed, or not
        an event). Never awaits."""
        assert isinstance(live, DurableLiveSession)
        log = self.log
        if live.bus.closed or live._closing or log is None:
            return None
        fields = envelope_fields(event, None)
        if fields is None:
            return None
        body = encode_envelope(fields)
        if body is None:
            logger.warning("event (%s) data is not JSON-serializable; dropped", fields["type"])
            return None
        event_id, rewinds = live._next_id, live._rewinds
        live._next_id += 1
        frame = Frame.from_json(event_id, fields["type"], entry_json(event_id, body))
        epoch = live.bus.epoch
        cost = frame.nbytes + PENDING_EVENT_OVERHEAD
        self._pending_bytes += cost

        def committed(_: Any, error: BaseException | None) -> None:
            self._pending_bytes -= cost
            if error is not None:
                if rewinds == live._rewinds:  # the first failure of this run: rewind once
                    live._rewinds += 1
                    live._next_id = event_id
                return
            if live.bus.ingest(frame):
                if key is not None and live.idempotency is not None:
                    live.idempotency.remember(key, event_id, epoch)
                self.keep_reservation_ahead(live, event_id)
                self.hooks.event_published(live.session_id)
            else:  # (cannot happen: ids are contiguous and delivered in commit order)
                logger.error("ingest_refused session=%s id=%d", live.session_id, event_id)

        op = Append(
            live.session_id,
            event_id,
            fields["type"],
            body,
            (key.key, key.digest, epoch) if key is not None else None,
            closes,
        )
        if not wait:
            log.submit_nowait(op, committed)
            return frame, None
        return frame, log.submit(op, committed)

    async def publish(
        self,
        live: LiveSession,
        event: Mapping[str, Any],
        *,
        idempotency: IdempotencyKey | None = None,
    ) -> Published | None:
        """Publish ``event`` and answer once it is committed (base: :meth:`Backend.publish`).

        Raises also :class:`StorageFullError` (the commit failed for lack of disk) and
        :class:`BackendUnavailableError` (the log cannot be written).
        """
        live = await self._current(live)
        assert isinstance(live, DurableLiveSession)
        if idempotency is not None:
            first = self._first_answer(live, idempotency)
            if first is not None:
                answer: Published = await self._wait(first)
                return replace(answer, replayed=True)
        appended = self._append(live, event, idempotency)
        if appended is None:
            return None
        frame, future = appended
        assert future is not None
        published: asyncio.Future[Published] = asyncio.get_running_loop().create_future()
        if idempotency is not None:
            live._pending_keys[idempotency.key] = (idempotency.digest, published)
        try:
            await self._wait(future)
            assert frame.id is not None
            result = Published(frame.id, live.bus.epoch)
            published.set_result(result)
            return result
        except BaseException as exc:
            published.set_exception(exc)
            published.exception()
            raise
        finally:
            if idempotency is not None:
                live._pending_keys.pop(idempotency.key, None)

    def _first_answer(
        self, live: DurableLiveSession, idempotency: IdempotencyKey
    ) -> asyncio.Future[Published] | None:
        """The first answer of a key already used (committed or being committed), or None.

        Raises :class:`IdempotencyKeyReusedError` (the key with another digest)."""
        store = live.idempotency
        remembered = store.recall(idempotency) if store is not None else None
        if remembered is not None:
            done: asyncio.Future[Published] = asyncio.get_running_loop().create_future()
            done.set_result(Published(remembered.id, remembered.epoch))
            return done
        pending = live._pending_keys.get(idempotency.key)
        if pending is None:
            return None
        digest, future = pending
        if digest != idempotency.digest:
            raise IdempotencyKeyReusedError(idempotency.key)
        return future

    def publish_nowait(self, live: LiveSession, event: Mapping[str, Any]) -> Frame | None:
        """Submit ``event`` for the next commit; the frame it will be delivered as, or None.

        None when the session is closed, the event cannot be framed, or
        :data:`MAX_PENDING_BYTES` of events already wait for a commit (the drop is counted
        in :attr:`dropped` and logged). Never raises, never awaits; a commit that fails
        drops the event (logged by the log).
        """
        if self._pending_bytes >= MAX_PENDING_BYTES:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                logger.warning(
                    "publish_dropped session=%s reason=pending_full pending_bytes=%d dropped=%d",
                    live.session_id,
                    self._pending_bytes,
                    self.dropped,
                )
            return None
        try:
            appended = self._append(live, event, wait=False)
        except Exception:  # never raises (EB-2)
            logger.exception("publish failed unexpectedly; event dropped")
            return None
        return appended[0] if appended is not None else None

    async def recall(self, session_id: str, idempotency: IdempotencyKey) -> Published | None:
        """The first answer of ``idempotency`` in the session, from this process or, after
        a restart, from the log (a close retried after a crash answers its first result).

        Raises :class:`IdempotencyKeyReusedError` (another digest)."""
        found = await super().recall(session_id, idempotency)
        log = self.log
        if found is not None or log is None:
            return found
        key = idempotency.key

        def read(conn: Any) -> Any:
            return conn.execute(
                "SELECT id, epoch, digest FROM keys WHERE session_id = ? AND key = ? AND at >= ?",
                (session_id, key, time.time() - self.config.idempotency_ttl_s),
            ).fetchone()

        try:
            row = await asyncio.shield(log.submit(read))
        except EventLogError:
            return None
        if row is None:
            return None
        if row[2] != idempotency.digest:
            raise IdempotencyKeyReusedError(key)
        return Published(int(row[0]), str(row[1]), replayed=True)

    async def close_session(
        self,
        session_id: str,
        *,
        reason: str,
        closed_by: str = "",
        idempotency: IdempotencyKey | None = None,
    ) -> Published:
        live = await self.get_live_session(session_id)
        assert isinstance(live, DurableLiveSession)
        if idempotency is not None:
            first = self._first_answer(live, idempotency)
            if first is not None:
                answer: Published = await self._wait(first)
                return replace(answer, replayed=True)
        event = session_closed_event(reason, closed_by)
        appended = self._append(live, event, idempotency, closes=True)
        if appended is None:
            raise SessionClosedError(session_id, live.owner_id)
        frame, future = appended
        assert future is not None
        live._closing = True
        try:
            await self._wait(future)
        except BaseException:
            live._closing = False
            raise
        assert frame.id is not None
        await self._after_close(live)
        return Published(frame.id, live.bus.epoch)

    # -- background --------------------------------------------------------------------

    def _start_tasks(self) -> None:
        if self._trimmer is None or self._trimmer.done():
            self._trimmer = asyncio.get_running_loop().create_task(self._trim_forever())
        super()._start_tasks()

    async def _trim_forever(self) -> None:
        """One bounded deletion step per :data:`TRIM_INTERVAL_S` (events no ring replays any
        more, closed sessions past ``CLOSED_HISTORY_S``, expired keys)."""
        marks: dict[str, int] = {}
        while True:
            await asyncio.sleep(TRIM_INTERVAL_S)
            log = self.log
            if log is None:
                continue
            keep_from = {}
            for live in self.registry.values():
                earliest = live.bus.ring.earliest_id or live.bus.next_id
                if marks.get(live.session_id) != earliest:
                    keep_from[live.session_id] = earliest
            closed_before = time.time() - self.config.closed_history_s
            ttl = float(self.config.idempotency_ttl_s)

            step = functools.partial(
                log.trim_step, keep_from=keep_from, closed_before=closed_before, key_ttl_s=ttl
            )
            try:
                deleted = await asyncio.shield(log.submit(step))
            except Exception as exc:
                logger.debug("event_log_trim_failed error=%s", exc)
                continue
            if deleted < 500:  # (a full step leaves more: keep those marks open)
                marks.update(keep_from)

    async def health(self) -> Health:
        """Whether the log takes writes: after a failed commit, one small write tries again
        (space may have returned without a publish since)."""
        log = self.log
        if log is not None and not log.writable:
            with contextlib.suppress(EventLogError):
                await asyncio.shield(log.submit(_probe_write))
            if not log.writable:
                return Health(False, (f"event log: {log.stats.failing}"[:300],))
        if log is not None and log.over_budget:
            return Health(False, (f"event log: past EVENT_LOG_MAX_BYTES ({log.max_bytes})",))
        return Health(True)

    def store_figures(self) -> StoreFigures | None:
        """The log's commits since the last call, its files' bytes and its event rows."""
        log = self.log
        if log is None:
            return None
        stats = log.stats
        sizes, stats.batch_sizes = stats.batch_sizes, []
        latencies, stats.latencies_s = stats.latencies_s, []
        return StoreFigures(sizes, latencies, stats.file_bytes, stats.rows)

    async def aclose(self) -> None:
        """Stop the background tasks, commit what waits, close the log (shutdown, tests)."""
        task, self._trimmer = self._trimmer, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        await super().aclose()
        log, self.log = self.log, None
        if log is not None:
            await asyncio.to_thread(log.close)
