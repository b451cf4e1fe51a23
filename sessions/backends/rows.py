"""The session's database row as the backends use it: load, reserve ids, save counters.

Sync functions (each one short transaction), called through
``channels.db.database_sync_to_async`` by the backends, never on the event loop itself.
Ids are reserved in blocks of ``ID_RESERVATION_BLOCK`` above ``event_id_reserved``, so a
bus rebuilt after a restart starts above every id an earlier process could have issued
(EB-1, docs/protocol.md "Ids and epochs").
"""

from __future__ import annotations

from typing import Any

from django.db import models, transaction
from django.db.models.functions import Greatest

from sessions.backends.errors import SessionClosedError, SessionNotFoundError
from sessions.bus import BusStats
from sessions.models import AgentSession

__all__ = [
    "load_and_reserve",
    "load_row",
    "reserve_after_new_epoch",
    "row_reserved",
    "save_progress",
]


def load_row(session_id: str) -> AgentSession:
    """Return the open session's row.

    Raises:
        SessionNotFoundError: no such row.
        SessionClosedError: the row says closed.
    """
    row = AgentSession.objects.filter(pk=session_id).first()
    if row is None:
        raise SessionNotFoundError(session_id)
    if row.is_closed:
        raise SessionClosedError(session_id, row.owner_id)
    return row


def load_and_reserve(session_id: str, block: int) -> tuple[AgentSession, int, int]:
    """Lock the open row, reserve the next ``block`` ids, count a bus start.

    Returns ``(row, first id of the new bus, reserved_until)``. Raises as :func:`load_row`.
    """
    with transaction.atomic():
        row = AgentSession.objects.select_for_update().filter(pk=session_id).first()
        if row is None:
            raise SessionNotFoundError(session_id)
        if row.is_closed:
            raise SessionClosedError(session_id, row.owner_id)
        start_id = row.event_id_reserved + 1
        reserved_until = row.event_id_reserved + block
        row.event_id_reserved = reserved_until
        row.bus_starts += 1
        row.save(update_fields=["event_id_reserved", "bus_starts"])
    return row, start_id, reserved_until


def reserve_after_new_epoch(session_id: str, base: int, block: int) -> int:
    """Move the row's reservation a block above ``base`` and count a bus start; return it."""
    target = base + block
    AgentSession.objects.filter(pk=session_id).update(
        event_id_reserved=Greatest("event_id_reserved", target),
        bus_starts=models.F("bus_starts") + 1,
    )
    return target


def row_reserved(session_id: str) -> int:
    """The row's current ``event_id_reserved``; 0 if the row is gone."""
    found = (
        AgentSession.objects.filter(pk=session_id)
        .values_list("event_id_reserved", flat=True)
        .first()
    )
    return int(found or 0)


def save_progress(
    session_id: str,
    stats: BusStats,
    *,
    shared: bool,
    reserved_until: int | None = None,
    last_id: int = 0,
    **extra: Any,
) -> None:
    """Persist a bus's counters (and a new reservation) on the session's row.

    ``shared``: several processes save the same row (a multi-process backend); each one's
    counters are then a lower bound of the session's, so the largest is kept. ``extra``
    fields (``status``, ``closed_at``) are written as given.
    """
    updates: dict[str, Any] = {
        "last_event_id": Greatest("last_event_id", max(stats.last_event_id, last_id)),
        "events_published": stats.published,
        "slow_client_warnings": stats.slow_client_warnings,
        "evictions": sum(stats.evictions.values()),
        "peak_subscribers": stats.peak_subscribers,
        **extra,
    }
    if shared:
        for name in ("events_published", "slow_client_warnings", "evictions", "peak_subscribers"):
            updates[name] = Greatest(name, updates[name])
    if reserved_until is not None:
        updates["event_id_reserved"] = Greatest("event_id_reserved", reserved_until)
    AgentSession.objects.filter(pk=session_id).update(**updates)
