"""The live side of sessions: one :class:`~sessions.bus.EventBus` per open session.

This is the only module that builds buses. It loads a session's row on first use, starts
its bus above every id an earlier process could have issued (ids are reserved in blocks of
``ID_RESERVATION_BLOCK`` and the reservation is renewed at half of a block, off the hot
path), and keeps the buses in a process-wide :class:`~sessions.bus.Registry`.

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
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from channels.db import database_sync_to_async
from django.db import transaction
from django.db.models.functions import Greatest
from django.utils import timezone

from sessions.bus import BusStats, EventBus, Frame, Registry
from sessions.conf import get_config
from sessions.models import AgentSession

__all__ = [
    "LiveSession",
    "ServerLoopUnavailableError",
    "SessionClosedError",
    "SessionNotFoundError",
    "attach_server_loop",
    "call_on_server_loop",
    "call_soon_on_server_loop",
    "close_session",
    "disconnect_subscribers",
    "flush_all",
    "get_live_session",
    "live_stats",
    "publish",
    "registry",
    "run_on_server_loop",
    "server_loop",
    "snapshot_json",
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
    _renewal: asyncio.Task[None] | None = field(default=None, repr=False)


registry: Registry[LiveSession] = Registry()
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
    loaded = await registry.get_or_create(
        session_id, lambda: database_sync_to_async(_load_and_reserve)(session_id)
    )
    assert loaded is not None  # the factory raises instead of returning None
    return loaded


def publish(live: LiveSession, event: Mapping[str, Any]) -> Frame | None:
    """Publish ``event`` on the session's bus (EB-2) and keep the id reservation ahead.

    Never raises and never awaits: the reservation is renewed by a background task once
    half of the current block is used.
    """
    frame = live.bus.publish(event)
    if frame is not None and frame.id is not None:
        block = get_config().id_reservation_block
        if frame.id > live.reserved_until - block // 2 and live._renewal is None:
            live._renewal = _spawn(_renew_reservation(live, block))
        if frame.id > live.reserved_until:
            logger.error(
                "id_reservation_overrun session=%s id=%d reserved_until=%d",
                live.session_id,
                frame.id,
                live.reserved_until,
            )
    return frame


async def _renew_reservation(live: LiveSession, block: int) -> None:
    try:
        target = live.bus.last_event_id + block
        await database_sync_to_async(_save_progress)(live, target)
        live.reserved_until = max(live.reserved_until, target)
    except Exception:
        logger.exception("id_reservation_failed session=%s", live.session_id)
    finally:
        live._renewal = None


def _save_progress(live: LiveSession, reserved_until: int | None = None, **extra: Any) -> None:
    """Persist the bus's counters (and a new reservation) on the session's row (sync, DB)."""
    stats = live.bus.stats()
    updates: dict[str, Any] = {
        "last_event_id": stats.last_event_id,
        "events_published": stats.published,
        "slow_client_warnings": stats.slow_client_warnings,
        "evictions": sum(stats.evictions.values()),
        "peak_subscribers": stats.peak_subscribers,
        **extra,
    }
    if reserved_until is not None:
        updates["event_id_reserved"] = Greatest("event_id_reserved", reserved_until)
    AgentSession.objects.filter(pk=live.session_id).update(**updates)


async def close_session(session_id: str, *, reason: str, closed_by: str = "") -> int:
    """Close a session: publish ``session_closed``, close its bus (EB-9), mark the row.

    Returns the last event id. Raises :class:`SessionNotFoundError` or
    :class:`SessionClosedError` (already closed).
    """
    live = await get_live_session(session_id)
    publish(live, {"type": "session_closed", "data": {"reason": reason, "closedBy": closed_by}})
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


def snapshot_json(live: LiveSession) -> bytes:
    """Return the load-session body (section 5): metadata, cursor, epoch and the ring.

    Shape: ``{"id", "title", "status", "createdAt", "lastEventId", "epoch",
    "subscriberCount", "ringSize", "earliestAvailableId", "events": [...]}``; ``events``
    starts with a synthetic ``{"v":1,"type":"history_truncated","data":
    {"earliestAvailableId": N}}`` when events before the ring's first were dropped. Event
    bytes are the ones serialized at publish time (``orjson.Fragment``), not re-encoded.
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
            "subscriberCount": bus.subscriber_count,
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
    future = asyncio.run_coroutine_threadsafe(coroutine(), loop)
    try:
        return future.result(timeout_s)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"the server loop did not answer within {timeout_s} s") from None


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
    """End every subscriber of a loaded session with a terminal frame (``disconnect_all``).

    Returns how many were disconnected; 0 when the session is not loaded in this process
    (then it has no subscriber here). The session stays open; clients may reconnect.
    """
    live = registry.get(session_id)
    if live is None:
        return 0
    return live.bus.disconnect_all(reason)
