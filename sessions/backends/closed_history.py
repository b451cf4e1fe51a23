"""Closed sessions stay readable: their history, kept within ``CLOSED_HISTORY_S``.

``GET /session/<id>`` of a closed session answers what the ring still holds (docs/protocol.md,
"GET /session/<id>", closed session), for ``CLOSED_HISTORY_S`` seconds after the close.
The memory backend keeps the closed bus (its ring stays counted in the process's
``RingBudget``, so the oldest events of every ring, closed ones included, leave first past
``MAX_RING_BYTES_TOTAL``) in :class:`ClosedHistories` and drops it after the retention; the
Redis backend lets the session's keys expire after it (``PUBLISH_LUA``'s close) and
reads the stream with :func:`closed_bus`. Both check the retention with
:func:`history_kept`. Not thread-safe: on the server's loop (EB-11), never awaits.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Final, Generic, TypeVar

from django.utils import timezone

from sessions.bus import EventBus, Frame

__all__ = ["CLOSED_HISTORIES_MAX", "ClosedHistories", "closed_bus", "history_kept"]

T = TypeVar("T")

CLOSED_HISTORIES_MAX: Final = 10_000
"""Closed buses a memory-backend process keeps at most (the oldest closed go first); their
bytes are bounded by the ring budget, this bounds the buses themselves."""


def history_kept(closed_at: datetime | None, retention_s: float) -> bool:
    """Whether a session closed at ``closed_at`` is still within ``retention_s`` seconds.

    A session without a close time is not (nothing says how old it is). Never raises.
    """
    if closed_at is None or retention_s <= 0:
        return False
    return (timezone.now() - closed_at).total_seconds() < retention_s


class ClosedHistories(Generic[T]):
    """The closed sessions of one process, kept ``retention_s`` seconds after their close.

    ``T`` is what is kept (the memory backend's ``LiveSession``). At most ``max_kept``
    (oldest closed dropped first); nothing when ``retention_s`` is 0. ``clock`` gives
    monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        retention_s: float,
        max_kept: int = CLOSED_HISTORIES_MAX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.retention_s = retention_s
        self.max_kept = max_kept
        self._clock = clock
        self._kept: OrderedDict[str, tuple[T, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, session_id: str, item: T) -> None:
        """Keep ``item`` as ``session_id``'s history from now on (replacing any)."""
        if self.retention_s <= 0:
            return
        self._kept.pop(session_id, None)
        self._kept[session_id] = (item, self._clock())
        while len(self._kept) > self.max_kept:
            self._kept.popitem(last=False)

    def get(self, session_id: str) -> T | None:
        """The history kept for ``session_id``, or None (never kept, or past the retention)."""
        self.prune()
        entry = self._kept.get(session_id)
        return entry[0] if entry is not None else None

    def prune(self) -> int:
        """Drop what is past the retention (oldest first); return how many were dropped."""
        deadline = self._clock() - self.retention_s
        dropped = 0
        while self._kept:
            _, (_, closed_at) = next(iter(self._kept.items()))
            if closed_at > deadline:
                break
            self._kept.popitem(last=False)
            dropped += 1
        return dropped


def closed_bus(bus: EventBus, frames: Iterable[Frame]) -> EventBus:
    """Fill ``bus`` (new, its ``start_id`` the first frame's id) with ``frames`` and close it:
    a read-only history for :func:`~sessions.backends.snapshot.snapshot_page`. Frames that
    do not continue the ids are left out (as a mirror would). Returns ``bus``."""
    for frame in frames:
        bus.ingest(frame)
    bus.close()
    return bus
