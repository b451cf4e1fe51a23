"""The session's database row as the backends use it: load, reserve ids, save counters.

Sync functions (each one short transaction), called through
``channels.db.database_sync_to_async`` by the backends, never on the event loop itself.
Ids are reserved in blocks of ``ID_RESERVATION_BLOCK`` above ``event_id_reserved``, so a
bus rebuilt after a restart starts above every id an earlier process could have issued
(EB-1, docs/protocol.md "Ids and epochs").
"""

from __future__ import annotations

import functools
import os
import secrets
import socket
from datetime import timedelta
from typing import Any

from django.db import models, transaction
from django.db.models.functions import Greatest
from django.utils import timezone

from sessions.backends.errors import (
    SessionClosedError,
    SessionHeldElsewhereError,
    SessionNotFoundError,
)
from sessions.bus import BusStats
from sessions.models import AgentSession

__all__ = [
    "holder_alive",
    "load_and_reserve",
    "load_row",
    "process_holder",
    "release_holds",
    "renew_holds",
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


@functools.cache
def _holder_for(pid: int) -> str:
    return f"{socket.gethostname()}:{pid}:{secrets.token_hex(4)}"


def process_holder() -> str:
    """This process's name on the rows it holds: ``host:pid:token`` (memory backend)."""
    return _holder_for(os.getpid())


def holder_alive(holder: str) -> bool:
    """Whether the process ``holder`` names may still run: on this host, whether its pid
    exists and is not a zombie (a killed server whose parent died is reparented, and a
    container's pid 1 may never reap it: its pid stays, its process is gone); on another
    host, True (its hold's expiry decides). Never raises."""
    host, _, rest = holder.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return True
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except OSError:  # (EPERM: it exists)
        return True
    return not _zombie(int(pid_text))


def _zombie(pid: int) -> bool:
    """Whether process ``pid`` has ended and waits to be reaped (state ``Z`` or ``X`` in
    ``/proc/<pid>/stat``); False where that cannot be read (then it may run)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            state = stat.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("Z", "X")


def load_and_reserve(
    session_id: str, block: int, *, holder: str = "", hold_ttl_s: float = 0.0
) -> tuple[AgentSession, int, int]:
    """Lock the open row, reserve the next ``block`` ids, count a bus start.

    With ``holder``, the row is also held for that process for ``hold_ttl_s`` seconds
    (renewed by :func:`renew_holds`): a row another live process holds is refused.

    Returns ``(row, first id of the new bus, reserved_until)``. Raises as :func:`load_row`,
    and :class:`SessionHeldElsewhereError` (held by another live process).
    """
    with transaction.atomic():
        row = AgentSession.objects.select_for_update().filter(pk=session_id).first()
        if row is None:
            raise SessionNotFoundError(session_id)
        if row.is_closed:
            raise SessionClosedError(session_id, row.owner_id)
        fields = ["event_id_reserved", "bus_starts"]
        if holder:
            now = timezone.now()
            if (
                row.held_by
                and row.held_by != holder
                and row.held_until is not None
                and row.held_until > now
                and holder_alive(row.held_by)
            ):
                raise SessionHeldElsewhereError(session_id, row.held_by)
            row.held_by = holder
            row.held_until = now + timedelta(seconds=hold_ttl_s)
            fields += ["held_by", "held_until"]
        start_id = row.event_id_reserved + 1
        reserved_until = row.event_id_reserved + block
        row.event_id_reserved = reserved_until
        row.bus_starts += 1
        row.save(update_fields=fields)
    return row, start_id, reserved_until


def renew_holds(holder: str, hold_ttl_s: float, session_ids: list[str]) -> int:
    """Extend ``holder``'s hold on the open rows of ``session_ids`` by ``hold_ttl_s`` s,
    taking back any of them whose hold was let go (``held_by`` empty); how many.

    A few UPDATEs (500 ids each)."""
    until = timezone.now() + timedelta(seconds=hold_ttl_s)
    renewed = 0
    for start in range(0, len(session_ids), 500):
        renewed += AgentSession.objects.filter(
            pk__in=session_ids[start : start + 500],
            held_by__in=(holder, ""),
            status=AgentSession.Status.OPEN,
        ).update(held_by=holder, held_until=until)
    return renewed


def release_holds(holder: str, session_ids: list[str] | None = None) -> int:
    """Let go of ``holder``'s rows (those of ``session_ids``, or all); how many."""
    rows = AgentSession.objects.filter(held_by=holder)
    if session_ids is not None:
        rows = rows.filter(pk__in=session_ids)
    return rows.update(held_by="", held_until=None)


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
