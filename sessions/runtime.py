"""The live side of sessions: one :class:`~sessions.bus.EventBus` per open session.

This is the only module that builds buses. It loads a session's row on first use, starts
its bus above every id an earlier process could have issued (ids are reserved in blocks of
``ID_RESERVATION_BLOCK`` and the reservation is renewed at half of a block, off the hot
path), and keeps the buses in a process-wide :class:`~sessions.bus.Registry`.

Backends (setting ``BACKEND``)
    ``memory`` (default): the bus assigns ids and holds the ring; one process.
    ``redis`` (issue 6): ids, epoch and the ring live in Redis (:mod:`sessions.redis_store`),
    shared by every process. Here the bus is a *mirror*: it takes the events in id order
    from this process's one reader task (:meth:`EventBus.ingest`) and keeps the local
    subscriber queues, so backpressure, warnings and evictions stay local and exact. A
    publish goes to Redis and reaches every process's mirror through its reader, this one
    included. A cursor ahead of the mirror but issued in Redis is waited for before the
    subscriber attaches, so a client resuming on another process misses nothing. When
    Redis has lost a session's data the next load starts a new epoch whose ids continue
    above the database's reserved high-water mark. When Redis is unreachable, publish and
    new streams raise :class:`BackendUnavailableError` (503) and open streams get a
    ``stream_error`` (code ``backend_unavailable``); everything resumes when it returns.

Concurrency model: everything here runs on the server's event loop (EB-11); database work
goes through ``channels.db.database_sync_to_async`` (a worker thread for the duration of
one query, never one per stream). The first bus built (or the first operator feed opened)
captures that loop (:func:`attach_server_loop`); code on other threads — the admin's sync
views — hands work to it with :func:`run_on_server_loop` / :func:`call_on_server_loop`
and never touches a bus directly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import os
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

import orjson
from channels.db import database_sync_to_async
from django.db import models, transaction
from django.db.models.functions import Greatest
from django.utils import timezone

from sessions.bus import (
    BusStats,
    EventBus,
    Frame,
    Registry,
    Subscription,
    encode_envelope,
    envelope_fields,
    synthetic_frame,
)
from sessions.conf import get_config
from sessions.models import AgentSession
from sessions.redis_store import (
    BackendUnavailableError,
    RedisStore,
    entry_json,
    read_reports_blocking,
)

__all__ = [
    "BackendUnavailableError",
    "Disconnected",
    "LiveSession",
    "Published",
    "ServerLoopUnavailableError",
    "SessionClosedError",
    "SessionNotFoundError",
    "adopt_request_loop",
    "attach_server_loop",
    "call_on_server_loop",
    "call_soon_on_server_loop",
    "caught_up",
    "close_backend",
    "close_session",
    "cluster_stats",
    "disconnect_everywhere",
    "disconnect_subscribers",
    "flush_all",
    "get_live_session",
    "live_stats",
    "merge_reports",
    "operator_stats",
    "operator_stats_blocking",
    "other_reports",
    "publish",
    "publish_nowait",
    "redis_store",
    "registry",
    "relay_activity",
    "run_on_server_loop",
    "server_loop",
    "snapshot_json",
    "subscribe",
    "using_redis",
]

logger = logging.getLogger("qwenweb.runtime")


class SessionNotFoundError(LookupError):
    """Raised when no session has the given id (a 404, EB-15)."""


class SessionClosedError(Exception):
    """Raised when the session is closed (a 204 for streams, EB-15; a 409 for publish).

    ``owner_id`` lets a caller finish its access check (EB-12 comes before EB-15).
    """

    def __init__(self, session_id: str, owner_id: int | None) -> None:
        super().__init__(session_id)
        self.owner_id = owner_id


@dataclass(eq=False)
class LiveSession:
    """An open session loaded in this process: its bus and what checks need without a query."""

    session_id: str
    title: str
    owner_id: int | None
    bus: EventBus
    reserved_until: int
    created_at: str
    ring_size: int = 0
    _renewal: asyncio.Task[None] | None = field(default=None, repr=False)
    # Redis backend: set (and replaced) each time the mirror takes new events.
    _advanced: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    # No new reservation attempt before this time (monotonic s) after a failed one.
    _renew_not_before: float = field(default=0.0, repr=False)
    # Redis backend: since when the mirror has had no subscriber (monotonic s), or None.
    _idle_since: float | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class Published:
    """What a publish returns: the event's ``id`` and the ``epoch`` of its sequence."""

    id: int
    epoch: str


registry: Registry[LiveSession] = Registry()
#: How long a new stream waits for this process's reader to reconnect after an outage.
READER_RECOVERY_WAIT_S = 2.0
#: After a failed reservation renewal, the next attempt waits this long (seconds).
RENEWAL_RETRY_S = 5.0
#: The Redis stream keeps at least this many entries whatever the ring size: it is also
#: the transport between processes, and a reader a little behind a tiny ring must not see
#: a gap (the local ring still keeps ``ring_size``).
STREAM_MIN_ENTRIES = 1000
_background: set[asyncio.Task[Any]] = set()
_T = TypeVar("_T")


def _load_and_reserve(session_id: str) -> LiveSession:
    """Build the bus of ``session_id`` and reserve its first block of ids (sync, DB)."""
    config = get_config()
    with transaction.atomic():
        row = AgentSession.objects.select_for_update().filter(pk=session_id).first()
        if row is None:
            raise SessionNotFoundError(session_id)
        if row.is_closed:
            raise SessionClosedError(session_id, row.owner_id)
        start_id = row.event_id_reserved + 1
        reserved_until = row.event_id_reserved + config.id_reservation_block
        row.event_id_reserved = reserved_until
        row.bus_starts += 1
        row.save(update_fields=["event_id_reserved", "bus_starts"])
    bus = EventBus(
        ring_size=row.ring_size or config.ring_size,
        max_subscribers=config.max_subscribers,
        max_queued_bytes=config.max_queued_bytes,
        start_id=start_id,
        name=session_id,
    )
    logger.info(
        "bus_started session=%s start_id=%d reserved_until=%d epoch=%s ring_size=%d",
        session_id,
        start_id,
        reserved_until,
        bus.epoch,
        bus.ring_size,
    )
    return LiveSession(
        session_id=session_id,
        title=row.title,
        owner_id=row.owner_id,
        bus=bus,
        reserved_until=reserved_until,
        created_at=row.created_at.isoformat(),
        ring_size=bus.ring_size,
    )


async def get_live_session(session_id: str) -> LiveSession:
    """Return the loaded session ``session_id``, loading it from the database if needed.

    Raises:
        SessionNotFoundError: no such session.
        SessionClosedError: the session is closed.
    """
    live = registry.get(session_id)
    if live is not None:
        if live.bus.closed:
            raise SessionClosedError(session_id, live.owner_id)
        return live
    attach_server_loop()
    if using_redis():
        loaded = await registry.get_or_create(session_id, lambda: _load_redis(session_id))
    else:
        loaded = await registry.get_or_create(
            session_id, lambda: database_sync_to_async(_load_and_reserve)(session_id)
        )
    assert loaded is not None  # the factory raises instead of returning None
    return loaded


def using_redis() -> bool:
    """Whether the Redis backend is selected (setting ``BACKEND``)."""
    return get_config().backend == "redis"


async def publish(live: LiveSession, event: Mapping[str, Any]) -> Published | None:
    """Publish ``event`` in the session (EB-2): its id and epoch, or None when closed.

    With the memory backend this is :func:`publish_nowait`. With the Redis backend the
    id is assigned in Redis and the event reaches every process's subscribers through
    their readers. Returns None too (one log line) for an event that cannot be framed
    or serialized: with Redis it must cross processes as JSON.

    Raises:
        BackendUnavailableError: Redis cannot be reached (the caller answers 503).
    """
    if not using_redis():
        frame = publish_nowait(live, event)
        return None if frame is None or frame.id is None else Published(frame.id, live.bus.epoch)
    fields = envelope_fields(event, None)
    body = encode_envelope(fields) if fields is not None else None
    if body is None:
        if fields is not None:
            logger.warning("publish_refused session=%s reason=not_serializable", live.session_id)
        return None
    event_id, epoch = await _publish_redis(live, body, close=False)
    if event_id is None:
        return None
    _keep_reservation_ahead(live, event_id)
    return Published(event_id, epoch)


async def _publish_redis(live: LiveSession, body: bytes, *, close: bool) -> tuple[int | None, str]:
    """Append ``body`` to the session's stream; ``(None, epoch)`` if the session is closed."""
    store = redis_store()
    for _ in range(3):
        known_last_id = _known_last_id(live)
        outcome = await store.publish(
            live.session_id,
            body,
            max(live.ring_size, STREAM_MIN_ENTRIES),
            close=close,
            known_last_id=known_last_id,
        )
        if outcome.status == "ok":
            assert outcome.event_id is not None
            assert outcome.epoch is not None
            _note_issued(live.session_id, outcome.event_id)
            return outcome.event_id, outcome.epoch
        if outcome.status == "closed":
            return None, outcome.epoch or ""
        if outcome.status == "stale":  # Redis went back in time: never reissue an id
            await _restart_epoch(live, outcome.epoch, "stale_data", known_last_id)
        # Redis lost (or we replaced) the session's data. Reload: a new epoch above the mark.
        _drop_mirror(live, "epoch_reset")
        live = await get_live_session(live.session_id)
    raise BackendUnavailableError("Redis keeps losing the session's data")


def publish_nowait(live: LiveSession, event: Mapping[str, Any]) -> Frame | None:
    """Publish ``event`` on the session's in-memory bus (EB-2); memory backend only.

    Never raises and never awaits: the reservation is renewed by a background task once
    half of the current block is used. (With the Redis backend use :func:`publish`.)
    """
    frame = live.bus.publish(event)
    if frame is not None and frame.id is not None:
        _keep_reservation_ahead(live, frame.id)
    return frame


def _keep_reservation_ahead(live: LiveSession, event_id: int) -> None:
    block = get_config().id_reservation_block
    if (
        event_id > live.reserved_until - block // 2
        and live._renewal is None
        and time.monotonic() >= live._renew_not_before
    ):
        live._renewal = _spawn(_renew_reservation(live, event_id, block))
    if event_id > live.reserved_until and not using_redis():
        # (Under Redis another process may have renewed the row's reservation already;
        # this process's figure is only a lower bound, so an "overrun" here means nothing.)
        logger.error(
            "id_reservation_overrun session=%s id=%d reserved_until=%d",
            live.session_id,
            event_id,
            live.reserved_until,
        )


async def _renew_reservation(live: LiveSession, event_id: int, block: int) -> None:
    try:
        target = max(event_id, live.bus.last_event_id) + block
        await database_sync_to_async(_save_progress)(live, target)
        live.reserved_until = max(live.reserved_until, target)
    except Exception as exc:
        # One line per failed attempt, at most one attempt per RENEWAL_RETRY_S: a database
        # that is down must not turn every publish into a traceback.
        live._renew_not_before = time.monotonic() + RENEWAL_RETRY_S
        logger.error(
            "id_reservation_failed session=%s error=%s retry_in_s=%g",
            live.session_id,
            f"{type(exc).__name__}: {exc}",
            RENEWAL_RETRY_S,
        )
    finally:
        live._renewal = None


def _save_progress(
    live: LiveSession, reserved_until: int | None = None, last_id: int = 0, **extra: Any
) -> None:
    """Persist the bus's counters (and a new reservation) on the session's row (sync, DB)."""
    stats = live.bus.stats()
    updates: dict[str, Any] = {
        "last_event_id": Greatest("last_event_id", max(stats.last_event_id, last_id)),
        "events_published": stats.published,
        "slow_client_warnings": stats.slow_client_warnings,
        "evictions": sum(stats.evictions.values()),
        "peak_subscribers": stats.peak_subscribers,
        **extra,
    }
    if using_redis():
        # Several processes save the same row: each one's counters are a lower bound of
        # the session's, so keep the largest (the live figures are summed, operator_stats).
        for name in ("events_published", "slow_client_warnings", "evictions", "peak_subscribers"):
            updates[name] = Greatest(name, updates[name])
    if reserved_until is not None:
        updates["event_id_reserved"] = Greatest("event_id_reserved", reserved_until)
    AgentSession.objects.filter(pk=live.session_id).update(**updates)


async def close_session(session_id: str, *, reason: str, closed_by: str = "") -> int:
    """Close a session: publish ``session_closed``, close its bus (EB-9), mark the row.

    Returns the last event id. Raises :class:`SessionNotFoundError` or
    :class:`SessionClosedError` (already closed).
    """
    live = await get_live_session(session_id)
    event = {"type": "session_closed", "data": {"reason": reason, "closedBy": closed_by}}
    if using_redis():
        # One script publishes session_closed and marks the session closed in Redis; every
        # process's reader closes its mirror after delivering it.
        body = encode_envelope(envelope_fields(event, None) or {})
        assert body is not None
        last_id, _ = await _publish_redis(live, body, close=True)
        if last_id is None:
            raise SessionClosedError(session_id, live.owner_id)
        await database_sync_to_async(_save_progress)(
            live, status=AgentSession.Status.CLOSED, closed_at=timezone.now(), last_id=last_id
        )
        logger.info("session_closed session=%s last_event_id=%d", session_id, last_id)
        from sessions.dashboard import feed

        feed.note("session_closed", session_id, lastEventId=last_id)
        return last_id
    publish_nowait(live, event)
    live.bus.close()
    # The closed bus stays registered until the row says closed: a request arriving in
    # between must see "closed", not reload the still-open row and build a new bus.
    await database_sync_to_async(_save_progress)(
        live, status=AgentSession.Status.CLOSED, closed_at=timezone.now()
    )
    registry.pop(session_id)
    logger.info("session_closed session=%s last_event_id=%d", session_id, live.bus.last_event_id)
    from sessions.dashboard import feed  # the operator feed (issue 4); imports this module

    feed.note("session_closed", session_id, lastEventId=live.bus.last_event_id)
    return live.bus.last_event_id


def snapshot_json(live: LiveSession, subscriber_count: int | None = None) -> bytes:
    """Return the load-session body (section 5): metadata, cursor, epoch and the ring.

    Shape: ``{"id", "title", "status", "createdAt", "lastEventId", "epoch",
    "subscriberCount", "ringSize", "earliestAvailableId", "events": [...]}``; ``events``
    starts with a synthetic ``{"v":1,"type":"history_truncated","data":
    {"earliestAvailableId": N}}`` when events before the ring's first were dropped. Event
    bytes are the ones serialized at publish time (``orjson.Fragment``), not re-encoded.
    ``subscriber_count`` overrides this process's count (the Redis backend's sum over
    processes, :func:`operator_stats`).
    """
    bus = live.bus
    ring = bus.ring_snapshot()
    earliest = ring[0].id if ring else bus.next_id
    assert earliest is not None
    events: list[Any] = []
    if earliest > 1:
        events.append(
            {"v": 1, "type": "history_truncated", "data": {"earliestAvailableId": earliest}}
        )
    events.extend(orjson.Fragment(f.json) if f.json is not None else dict(f) for f in ring)
    return orjson.dumps(
        {
            "id": live.session_id,
            "title": live.title,
            "status": "closed" if bus.closed else "open",
            "createdAt": live.created_at,
            "lastEventId": bus.last_event_id,
            "epoch": bus.epoch,
            "subscriberCount": (
                bus.subscriber_count if subscriber_count is None else subscriber_count
            ),
            "ringSize": bus.ring_size,
            "earliestAvailableId": earliest,
            "events": events,
        },
        default=str,
    )


def _spawn(coro: Any) -> asyncio.Task[Any]:
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


async def flush_all() -> None:
    """Persist every loaded session's counters and wait for pending renewals (shutdown)."""
    for live in registry.values():
        await database_sync_to_async(_save_progress)(live)
    if _background:
        await asyncio.gather(*list(_background), return_exceptions=True)


# -- the server's event loop, seen from other threads (issue 4: admin, dashboard) ---------


class ServerLoopUnavailableError(RuntimeError):
    """Raised when work must run on the server's loop and there is none (or it is closed)."""


_server_loop: asyncio.AbstractEventLoop | None = None


def attach_server_loop() -> asyncio.AbstractEventLoop:
    """Capture the running loop as the server's loop; start the operator machinery once.

    Called on the loop by :func:`get_live_session` before the first bus is built and by
    the operator feed's view. The first call per loop starts the records flusher
    (:mod:`sessions.records`), the dashboard ticker (:mod:`sessions.dashboard`) and
    installs the shutdown hooks (:mod:`sessions.lifecycle`). Idempotent; never awaits.

    Raises:
        RuntimeError: no loop is running in this thread.
    """
    global _server_loop
    loop = asyncio.get_running_loop()
    if _server_loop is not loop:
        _server_loop = loop
        from sessions.lifecycle import loop_attached  # imports records and dashboard

        loop_attached(loop)
    return loop


def server_loop() -> asyncio.AbstractEventLoop | None:
    """Return the captured server loop, or None if none was captured or it is closed."""
    loop = _server_loop
    return loop if loop is not None and not loop.is_closed() else None


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def run_on_server_loop(
    coroutine: Callable[[], Coroutine[Any, Any, _T]], *, timeout_s: float = 10.0
) -> _T:
    """Run ``coroutine()`` on the server's loop from another thread and return its result.

    For sync code (the admin's views) that must act on a bus (EB-11). Blocks the calling
    thread for at most ``timeout_s`` seconds.

    Raises:
        ServerLoopUnavailableError: no server loop (no bus was ever built in this process).
        RuntimeError: called on the loop's own thread (it would wait for itself).
        TimeoutError: the coroutine did not finish in time (it is cancelled).
        Exception: whatever the coroutine raised.
    """
    loop = server_loop()
    if loop is None:
        raise ServerLoopUnavailableError("no server event loop in this process")
    if _on_loop_thread(loop):
        raise RuntimeError("run_on_server_loop() called on the server loop; await instead")
    future = _submit(coroutine(), loop)
    try:
        return future.result(timeout_s)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"the server loop did not answer within {timeout_s} s") from None


def _submit(
    coroutine: Coroutine[Any, Any, _T], loop: asyncio.AbstractEventLoop
) -> concurrent.futures.Future[_T]:
    """``run_coroutine_threadsafe`` in a fresh context: the caller's context variables must
    not follow the coroutine (nor the tasks it starts) onto the loop. A Django request's
    thread carries asgiref's ``ThreadSensitiveContext``, which would send the coroutine's
    ``database_sync_to_async`` calls to that very thread, blocked waiting for it."""
    return contextvars.Context().run(asyncio.run_coroutine_threadsafe, coroutine, loop)


def call_on_server_loop(function: Callable[[], _T], *, default: _T, timeout_s: float = 5.0) -> _T:
    """Return ``function()`` computed on the server's loop (directly if this is it).

    ``function`` must not await (it reads buses: ``stats()``, the registry). Returns
    ``default`` when there is no server loop in this process (nothing is loaded, so
    there is nothing live to read). Raises ``TimeoutError`` after ``timeout_s`` seconds
    and whatever ``function`` raises.
    """
    loop = server_loop()
    if loop is None:
        return default
    if _on_loop_thread(loop):
        return function()

    async def call() -> _T:
        return function()

    return run_on_server_loop(call, timeout_s=timeout_s)


def call_soon_on_server_loop(function: Callable[..., object], *args: Any) -> bool:
    """Schedule ``function(*args)`` on the server's loop from any thread; never waits.

    Returns False (and does nothing) when there is no server loop. Never raises.
    """
    loop = server_loop()
    if loop is None:
        return False
    try:
        loop.call_soon_threadsafe(function, *args)
    except RuntimeError:  # closed between the check and the call
        return False
    return True


def adopt_request_loop(*, timeout_s: float = 5.0) -> asyncio.AbstractEventLoop | None:
    """From a sync view's worker thread: return the server loop, adopting the request's.

    When this process has no server loop yet (it never built a bus), the loop serving
    this thread's request becomes it (:func:`attach_server_loop` runs there, so the
    operator machinery starts as with a first bus): the loop asgiref's ``SyncToAsync``
    recorded for this thread, which is the one Django's ``ASGIHandler`` runs on. For
    operator actions that must reach other processes (Redis backend) from a process that
    has loaded nothing. Returns None outside a request served over ASGI (Django's test
    client, WSGI).

    Raises:
        TimeoutError: the request's loop did not answer within ``timeout_s``.
    """
    loop = server_loop()
    if loop is not None:
        return loop
    from asgiref.sync import SyncToAsync

    local = SyncToAsync.threadlocal
    request_loop: asyncio.AbstractEventLoop | None = getattr(local, "main_event_loop", None)
    if (
        request_loop is None
        or getattr(local, "main_event_loop_pid", None) != os.getpid()
        or request_loop.is_closed()
        or not request_loop.is_running()
        or _on_loop_thread(request_loop)
    ):
        return None

    async def attach() -> asyncio.AbstractEventLoop:
        return attach_server_loop()

    future = _submit(attach(), request_loop)
    try:
        return future.result(timeout_s)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"the request's loop did not answer within {timeout_s} s") from None


def live_stats(session_ids: Any = None) -> dict[str, BusStats]:
    """Return ``{session id: bus.stats()}`` for the loaded sessions (EB-10). On the loop only.

    ``session_ids`` (an iterable) limits the answer to those ids; None means every
    loaded session. Never raises, never awaits, never touches a subscriber queue.
    """
    wanted = None if session_ids is None else set(session_ids)
    return {
        live.session_id: live.bus.stats()
        for live in registry.values()
        if wanted is None or live.session_id in wanted
    }


async def disconnect_subscribers(session_id: str, *, reason: str) -> int:
    """End every subscriber of a session with a terminal frame (``disconnect_all``).

    Returns how many were disconnected in this process (0 when the session is not loaded
    here). With the Redis backend every other process is told too (a control message on
    pub/sub) and does the same with its own subscribers. The session stays open; clients
    may reconnect.

    Raises:
        BackendUnavailableError: Redis backend, Redis unreachable (local ones are ended).
    """
    done = await disconnect_everywhere(session_id, reason=reason)
    if done.told is None:
        raise BackendUnavailableError("Redis is unavailable: no other process was told")
    return done.here


@dataclass(frozen=True, slots=True)
class Disconnected:
    """What :func:`disconnect_everywhere` did.

    ``here``: subscribers ended in this process. ``told``: how many other processes
    received the request (Redis backend; each ends its own subscribers and sends no count
    back): 0 with the memory backend, None when Redis could not be reached.
    """

    here: int
    told: int | None


async def disconnect_everywhere(session_id: str, *, reason: str) -> Disconnected:
    """:func:`disconnect_subscribers`, saying how many other processes were told.

    Never raises: Redis unreachable gives ``told=None`` (local subscribers are ended).
    """
    live = registry.get(session_id)
    here = live.bus.disconnect_all(reason) if live is not None else 0
    if not using_redis():
        return Disconnected(here, 0)
    store = redis_store()
    message = {"op": "disconnect", "session": session_id, "reason": reason}
    try:
        told = await store.send_control(message)
    except BackendUnavailableError as exc:
        logger.error("disconnect_not_relayed session=%s error=%s", session_id, exc)
        return Disconnected(here, None)
    return Disconnected(here, told)


# -- the Redis backend (issue 6) -----------------------------------------------------------

_store: RedisStore | None = None
#: How long a subscriber with a cursor waits for this process's mirror to reach it.
CATCH_UP_TIMEOUT_S = 5.0
#: A mirror without subscribers for this long is unloaded: the reader then reads only the
#: streams of sessions with local subscribers (or recent ones); a later use reloads it.
MIRROR_IDLE_UNLOAD_S = 60.0


def redis_store() -> RedisStore:
    """Return this loop's :class:`RedisStore`, starting its reader on first use (on the loop)."""
    global _store
    loop = asyncio.get_running_loop()
    if _store is None or _store.loop is not loop:
        config = get_config()
        _store = RedisStore(
            config.redis_url, config.redis_key_prefix, process_ttl_s=config.process_ttl_s
        )
        _store.start(_on_entries, _on_outage, _on_recovery, _on_control, _report_and_sweep)
    return _store


async def close_backend() -> None:
    """Stop the Redis reader and close its connections (shutdown, tests). Never raises."""
    global _store
    store, _store = _store, None
    if store is not None and not store.loop.is_closed():
        try:
            await store.aclose()
        except Exception:
            logger.debug("closing the Redis store failed", exc_info=True)


def _load_row(session_id: str) -> AgentSession:
    row = AgentSession.objects.filter(pk=session_id).first()
    if row is None:
        raise SessionNotFoundError(session_id)
    if row.is_closed:
        raise SessionClosedError(session_id, row.owner_id)
    return row


def _reserve_after_new_epoch(session_id: str, base: int, block: int) -> int:
    """Move the row's reservation a block above ``base`` and count a bus start (sync, DB)."""
    target = base + block
    AgentSession.objects.filter(pk=session_id).update(
        event_id_reserved=Greatest("event_id_reserved", target),
        bus_starts=models.F("bus_starts") + 1,
    )
    return target


#: The highest id this process knows was issued per session (its mirrors, its publishes,
#: the row's saved last id): kept across mirror reloads and Redis outages, so that a Redis
#: that comes back with older data than it gave out is recognised (see _restart_epoch).
_known_last: dict[str, int] = {}


def _note_issued(session_id: str, event_id: int) -> None:
    if event_id > _known_last.get(session_id, 0):
        _known_last[session_id] = event_id


def _known_last_id(live: LiveSession) -> int:
    return max(_known_last.get(live.session_id, 0), live.bus.last_event_id)


def _row_reserved(session_id: str) -> int:
    """The row's current ``event_id_reserved`` (sync, DB); 0 if the row is gone."""
    found = (
        AgentSession.objects.filter(pk=session_id)
        .values_list("event_id_reserved", flat=True)
        .first()
    )
    return int(found or 0)


async def _restart_epoch(
    live: LiveSession, stale_epoch: str | None, reason: str, known_last_id: int
) -> None:
    """Replace the session's data in Redis with a new epoch above every id ever issued.

    For data Redis went back in time on (restored from a snapshot older than what it gave
    out): in that epoch ids would be issued twice. The new epoch starts above the row's
    reserved mark (read now: another process may have moved it) and every id this process
    knows of, so every old cursor resyncs (EB-7). ``known_last_id`` is what the caller
    knew *before* it read Redis: Redis refuses the restart (atomically) if its last id has
    reached it since, i.e. if the data was not stale after all.
    """
    store = redis_store()
    block = get_config().id_reservation_block
    row_reserved = await database_sync_to_async(_row_reserved)(live.session_id)
    base = max(row_reserved, live.reserved_until, known_last_id, _known_last_id(live))
    epoch, replaced = await store.restart_epoch(live.session_id, stale_epoch, base, known_last_id)
    if replaced:
        live.reserved_until = await database_sync_to_async(_reserve_after_new_epoch)(
            live.session_id, base, block
        )
        logger.error(
            "epoch_restarted session=%s reason=%s stale_epoch=%s epoch=%s first_id=%d",
            live.session_id,
            reason,
            stale_epoch,
            epoch,
            base + 1,
        )


async def _load_redis(session_id: str) -> LiveSession:
    """Load the session's row, make sure Redis has its sequence, and build the mirror."""
    config = get_config()
    row = await database_sync_to_async(_load_row)(session_id)
    store = redis_store()
    base = row.event_id_reserved
    epoch, created = await store.ensure_session(session_id, base)
    reserved_until = base
    if created:
        reserved_until = await database_sync_to_async(_reserve_after_new_epoch)(
            session_id, base, config.id_reservation_block
        )
        logger.info(
            "epoch_started session=%s epoch=%s first_id=%d reserved_until=%d",
            session_id,
            epoch,
            base + 1,
            reserved_until,
        )
    live = LiveSession(
        session_id=session_id,
        title=row.title,
        owner_id=row.owner_id,
        bus=EventBus(ring_size=1, name=session_id),  # replaced by the mirror below
        reserved_until=reserved_until,
        created_at=row.created_at.isoformat(),
        ring_size=row.ring_size or config.ring_size,
    )
    _note_issued(session_id, row.last_event_id)
    await _build_mirror(live, store)
    return live


async def _build_mirror(live: LiveSession, store: RedisStore) -> None:
    """Fill a new bus from the shared ring (one MULTI read) and start reading after it."""
    config = get_config()
    known_last_id = _known_last_id(live)  # before the read, as in _ready_mirror
    window = await store.window(live.session_id)
    if window.head.closed:
        raise SessionClosedError(live.session_id, live.owner_id)
    if window.head.epoch is not None and window.head.last_event_id < known_last_id:
        await _restart_epoch(live, window.head.epoch, "stale_data", known_last_id)
        window = await store.window(live.session_id)
    if window.head.epoch is None:  # lost between ensure and read: let the caller retry
        raise BackendUnavailableError("Redis lost the session's data while loading it")
    entries = window.entries
    first_id = window.first_id
    # Keep the contiguous run of ids that ends the stream: a hole (ids the stream lost)
    # must read as "evicted" to older cursors (EB-7), never be replayed across.
    start = len(entries) - 1
    while start > 0 and entries[start - 1][0] == entries[start][0] - 1:
        start -= 1
    if entries and start > 0:
        logger.warning(
            "stream_hole session=%s kept_from=%d dropped_entries=%d",
            live.session_id,
            entries[start][0],
            start,
        )
        entries, first_id = entries[start:], entries[start][0]
    bus = EventBus(
        ring_size=live.ring_size,
        max_subscribers=config.max_subscribers,
        max_queued_bytes=config.max_queued_bytes,
        start_id=first_id,
        name=live.session_id,
        epoch=window.head.epoch,
    )
    for event_id, body in entries:
        bus.ingest(_frame_from_entry(event_id, body))
    _note_issued(live.session_id, bus.last_event_id)
    live.bus = bus
    store.watch(live.session_id, bus.last_event_id)
    logger.info(
        "mirror_loaded session=%s epoch=%s first_id=%d last_event_id=%d entries=%d",
        live.session_id,
        bus.epoch,
        first_id,
        bus.last_event_id,
        len(entries),
    )


def _frame_from_entry(event_id: int, body: bytes) -> Frame:
    encoded = entry_json(event_id, body)
    return Frame(orjson.loads(encoded), encoded)


def _backend_error_frame() -> Frame:
    return synthetic_frame(
        "stream_error", {"error": "event store unavailable", "code": "backend_unavailable"}
    )


def _drop_mirror(live: LiveSession, reason: str) -> None:
    """Forget a mirror that no longer matches Redis; its subscribers reconnect (new load)."""
    if registry.get(live.session_id) is live:
        registry.pop(live.session_id)
        if _store is not None:  # (a newer mirror of the session keeps its reading)
            _store.unwatch(live.session_id)
    count = live.bus.disconnect_all(reason)
    live._advanced.set()  # a subscriber waiting for this mirror to catch up retries now
    logger.warning(
        "mirror_dropped session=%s reason=%s subscribers=%d", live.session_id, reason, count
    )


async def subscribe(
    live: LiveSession,
    *,
    last_event_id: int | None = None,
    max_queued: int,
    epoch: str | None = None,
    label: str = "-",
) -> tuple[LiveSession, Subscription]:
    """Attach a subscriber (EB-6, EB-7); returns the live session used and the subscription.

    Memory backend: ``live.bus.subscribe``. Redis backend: first checks the session's
    head in Redis (closed, epoch); a mirror whose epoch Redis no longer has is rebuilt
    (that is how a client learns of lost data: ``epoch_reset``); a cursor the mirror has
    not reached yet but Redis has issued is waited for (at most ``CATCH_UP_TIMEOUT_S``),
    so replay and live meet without loss or repeat on any process.

    Raises:
        SubscriberLimitExceededError: EB-6.
        SessionClosedError: the session was closed (Redis knows before the row).
        BackendUnavailableError: Redis unreachable, or the mirror did not catch up.
    """
    if using_redis():
        live = await _ready_mirror(live, last_event_id)
    subscription = live.bus.subscribe(
        last_event_id=last_event_id, max_queued=max_queued, epoch=epoch, label=label
    )
    return live, subscription


async def caught_up(live: LiveSession) -> LiveSession:
    """Return the session holding every event issued before the call (read your writes).

    Memory backend: ``live`` (its bus assigns the ids). Redis backend: waits, at most
    ``CATCH_UP_TIMEOUT_S``, until this process's mirror has the last id Redis had issued
    (a mirror of an epoch Redis no longer has is rebuilt), so a snapshot taken after a
    publish returned, on any process, includes that event (section 5, load session).

    Raises:
        SessionClosedError: Redis says the session is closed.
        BackendUnavailableError: Redis unreachable, or the mirror did not catch up in time.
    """
    if not using_redis():
        return live
    head = await redis_store().head(live.session_id)
    return await _ready_mirror(live, head.last_event_id)


async def _ready_mirror(live: LiveSession, cursor: int | None) -> LiveSession:
    store = redis_store()
    # After an outage nothing live would arrive until the reader is back: wake it, wait.
    await store.wait_available(READER_RECOVERY_WAIT_S)
    for _ in range(3):
        # Taken before the read: an id issued (or mirrored) while it is in flight is not
        # Redis going back in time.
        known_last_id = _known_last_id(live)
        head = await store.head(live.session_id)
        if head.closed:
            raise SessionClosedError(live.session_id, live.owner_id)
        if head.epoch is not None and head.last_event_id < known_last_id:
            # Redis went back in time
            await _restart_epoch(live, head.epoch, "stale_data", known_last_id)
            head = await store.head(live.session_id)
        if head.epoch != live.bus.epoch or registry.get(live.session_id) is not live:
            if registry.get(live.session_id) is live:
                _drop_mirror(live, "epoch_reset")
            live = await get_live_session(live.session_id)
            continue
        if cursor is not None and live.bus.last_event_id < cursor <= head.last_event_id:
            await _caught_up(live, cursor)
            if registry.get(live.session_id) is not live:
                continue
        return live
    raise BackendUnavailableError("the session's data kept changing in Redis while attaching")


async def _caught_up(live: LiveSession, event_id: int) -> None:
    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
    while live.bus.last_event_id < event_id and registry.get(live.session_id) is live:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BackendUnavailableError(
                f"this process's reader did not reach event {event_id} in time"
            )
        try:
            async with asyncio.timeout(remaining):
                await live._advanced.wait()
        except TimeoutError:
            continue


def _on_entries(session_id: str, entries: list[tuple[int, bytes]]) -> None:
    """The reader's callback: feed a session's new stream entries to its mirror, in order."""
    live = registry.get(session_id)
    if live is None or live.bus.closed:
        if _store is not None:
            _store.unwatch(session_id)
        return
    bus = live.bus
    for event_id, body in entries:
        if event_id < bus.next_id:
            continue  # already taken (the window read and the reader overlapped)
        frame = _frame_from_entry(event_id, body)
        if not bus.ingest(frame):
            # A gap: the reader fell more than a ring behind, or Redis started a new epoch
            # (lost data) whose ids continue above ours. Either way the mirror is stale.
            _drop_mirror(live, "mirror_gap")
            break
        _note_issued(session_id, event_id)
        if frame.type == "session_closed":
            bus.close()
            _known_last.pop(session_id, None)  # closed for good: the row answers from now
            if _store is not None:
                _store.unwatch(session_id)
            break
    advanced, live._advanced = live._advanced, asyncio.Event()
    advanced.set()


def _on_outage(error: BaseException) -> None:
    """Redis went away: end every open stream with ``stream_error`` and forget the mirrors."""
    frame = _backend_error_frame()
    ended = 0
    for live in registry.values():
        ended += live.bus.disconnect_all("backend_unavailable", frame=frame)
        if _store is not None:
            _store.unwatch(live.session_id)
        live._advanced.set()  # wake any waiting subscriber: it fails, its client retries
    registry.clear()
    logger.error("streams_ended reason=backend_unavailable subscribers=%d", ended)


def _on_recovery() -> None:
    """Redis is back: nothing to do here, mirrors are rebuilt as clients come back."""


def _on_control(message: Mapping[str, Any]) -> None:
    """A control message from another process (pub/sub; never one of this process's own).

    ``disconnect``: end the session's subscribers here. ``activity``: dashboard activity
    items that happened there (:func:`relay_activity`); they go to this process's
    dashboards only, never on to another process.
    """
    op = message.get("op")
    if op == "disconnect":
        live = registry.get(str(message.get("session")))
        if live is not None:
            live.bus.disconnect_all(str(message.get("reason") or "operator"))
    elif op == "activity":
        items = message.get("items")
        if isinstance(items, list):
            from sessions.dashboard import feed  # imports this module

            feed.note_remote([item for item in items if isinstance(item, dict)])


async def relay_activity(items: Sequence[Mapping[str, Any]]) -> None:
    """Redis backend: send dashboard activity ``items`` to every other process's feed.

    One control message ``{"op": "activity", "items": [...]}`` on the prefixed control
    channel; each other process hands the items to its own dashboards (:func:`_on_control`)
    and sends them nowhere else. Fails at once while this process's reader has lost Redis.

    Raises:
        BackendUnavailableError: Redis unreachable.
    """
    store = redis_store()
    if not store.available:
        raise BackendUnavailableError("Redis is unavailable (this process's reader lost it)")
    await store.send_control({"op": "activity", "items": list(items)})


def _report_and_sweep() -> dict[str, Any]:
    """The reporter's periodic call: unload idle mirrors, then report (see below)."""
    _unload_idle_mirrors(time.monotonic())
    return _make_report()


def _unload_idle_mirrors(now: float) -> int:
    """Forget mirrors without a subscriber for ``MIRROR_IDLE_UNLOAD_S``; returns how many."""
    unloaded = 0
    for live in registry.values():
        if live.bus.subscriber_count:
            live._idle_since = None
        elif live._idle_since is None:
            live._idle_since = now
        elif now - live._idle_since >= MIRROR_IDLE_UNLOAD_S and live._renewal is None:
            registry.pop(live.session_id)
            if _store is not None:
                _store.unwatch(live.session_id)
            live._advanced.set()
            # Its counters leave this process's report: keep them on the row.
            _spawn(database_sync_to_async(_save_progress)(live))
            unloaded += 1
    if unloaded:
        logger.info("mirrors_unloaded count=%d reason=idle", unloaded)
    return unloaded


def _make_report() -> dict[str, Any]:
    """This process's live figures for operators (written to Redis with a TTL)."""
    sessions: dict[str, Any] = {}
    for session_id, stats in live_stats().items():
        sessions[session_id] = _stats_to_json(stats)
    return {"at": time.time(), "sessions": sessions}


def _stats_to_json(stats: BusStats) -> dict[str, Any]:
    return {
        "published": stats.published,
        "slow_client_warnings": stats.slow_client_warnings,
        "evictions": dict(stats.evictions),
        "resyncs": dict(stats.resyncs),
        "replayed_frames": stats.replayed_frames,
        "subscriber_count": stats.subscriber_count,
        "peak_subscribers": stats.peak_subscribers,
        "ring_length": stats.ring_length,
        "ring_size": stats.ring_size,
        "earliest_id": stats.earliest_id,
        "last_event_id": stats.last_event_id,
        "epoch": stats.epoch,
        "closed": stats.closed,
    }


def merge_reports(
    reports: Sequence[Mapping[str, Any]], session_ids: Any = None
) -> dict[str, BusStats]:
    """Sum the processes' reports into one :class:`BusStats` per session (operators).

    Subscriber counts, warnings, evictions, resyncs and replayed frames are sums over the
    processes; ``peak_subscribers`` is the sum of the processes' peaks (an upper bound);
    ``published``, ``last_event_id`` and the ring figures come from the process that has
    seen the most events. Never raises on a well-formed report.
    """
    wanted = None if session_ids is None else set(session_ids)
    merged: dict[str, dict[str, Any]] = {}
    for report in reports:
        for session_id, figures in (report.get("sessions") or {}).items():
            if wanted is not None and session_id not in wanted:
                continue
            into = merged.get(session_id)
            if into is None:
                merged[session_id] = {
                    **figures,
                    "evictions": dict(figures["evictions"]),
                    "resyncs": dict(figures["resyncs"]),
                }
                continue
            for name in ("slow_client_warnings", "replayed_frames", "subscriber_count"):
                into[name] += figures[name]
            into["peak_subscribers"] += figures["peak_subscribers"]
            for name in ("evictions", "resyncs"):
                for reason, count in figures[name].items():
                    into[name][reason] = into[name].get(reason, 0) + count
            if figures["last_event_id"] > into["last_event_id"]:
                for name in ("published", "last_event_id", "ring_length", "earliest_id", "epoch"):
                    into[name] = figures[name]
            into["closed"] = into["closed"] or figures["closed"]
    return {
        session_id: BusStats(
            **{
                **figures,
                "evictions": MappingProxyType(figures["evictions"]),
                "resyncs": MappingProxyType(figures["resyncs"]),
            }
        )
        for session_id, figures in merged.items()
    }


async def operator_stats(session_ids: Any = None) -> dict[str, BusStats]:
    """Live figures per session for operators, on the loop: this process's (memory
    backend) or the sum over every live process (Redis backend; this process's own
    figures are taken fresh, the others' are at most ``PROCESS_TTL_S / 4`` old).

    Raises:
        BackendUnavailableError: Redis backend, Redis unreachable.
    """
    if not using_redis():
        return live_stats(session_ids)
    return cluster_stats(await other_reports(), session_ids)


async def other_reports() -> list[dict[str, Any]]:
    """Return the reports of every other live process, on the loop (one ZRANGE + MGET).

    Memory backend: ``[]``. Raises :class:`BackendUnavailableError` (Redis unreachable).
    """
    if not using_redis():
        return []
    store = redis_store()
    return [r for r in await store.reports() if r.get("process") != store.process_uid]


def cluster_stats(
    others: Sequence[Mapping[str, Any]], session_ids: Any = None
) -> dict[str, BusStats]:
    """Sum this process's fresh figures with ``others`` (:func:`other_reports`), on the loop.

    For callers that fetch the other reports less often than they sample (the dashboard's
    feed, once per tick). With ``others`` empty this is :func:`live_stats`. Never raises
    on well-formed reports, never awaits.
    """
    if not others:
        return live_stats(session_ids)
    return merge_reports([*others, _make_report()], session_ids)


#: How long an operator page waits for the cluster's figures (Redis backend).
OPERATOR_STATS_TIMEOUT_S = 2.0


def operator_stats_blocking(
    session_ids: Any = None, *, timeout_s: float = OPERATOR_STATS_TIMEOUT_S
) -> dict[str, BusStats]:
    """Return :func:`operator_stats` from sync code in another thread (admin, dashboard).

    Memory backend: this process's live figures, read on the server loop (``{}`` when
    there is none: nothing is loaded). Redis backend: the sums over every live process —
    on the server loop when this process has one, else read with a short-lived
    synchronous client (:func:`~sessions.redis_store.read_reports_blocking`), so a process
    that has loaded nothing still shows the cluster's numbers and starts nothing. Blocks
    for about ``timeout_s`` at most (one more second if the loop itself is stuck).

    Raises:
        TimeoutError: the server loop did not answer in time.
        BackendUnavailableError: Redis backend, Redis unreachable or slower than
            ``timeout_s``.
    """
    if not using_redis():
        return call_on_server_loop(lambda: live_stats(session_ids), default={}, timeout_s=timeout_s)
    if server_loop() is None:
        config = get_config()
        reports = read_reports_blocking(
            config.redis_url, config.redis_key_prefix, timeout_s=timeout_s / 3
        )
        return merge_reports(reports, session_ids)

    async def bounded() -> dict[str, BusStats]:
        try:
            async with asyncio.timeout(timeout_s):
                return await operator_stats(session_ids)
        except TimeoutError:
            raise BackendUnavailableError(f"Redis did not answer within {timeout_s} s") from None

    return run_on_server_loop(bounded, timeout_s=timeout_s + 1.0)
