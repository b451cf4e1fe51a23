"""The replay ring of one session, bounded by count, bytes and age, and the process budget.

Rules: docs/protocol.md, "Ring limits". A :class:`Ring` keeps a session's newest events
(contiguous ids, oldest first, except at most one ``gap`` of ids never issued: a forked
epoch's, EB-23) for replay (EB-7) and the snapshot. The oldest events
leave when any limit is passed: ``max_events`` (the ring size, EB-1), ``max_bytes`` (the
sum of :func:`held_bytes` of its frames) or ``max_age_s`` (seconds since an event entered
the ring; 0 turns it off). A cursor that fell out of the ring gets ``state_resync_required``
(``ring_evicted``) as before.

A :class:`RingBudget` is shared by every ring of a process (``MAX_RING_BYTES_TOTAL``):
when the rings together hold more, the oldest events *across all rings* leave first,
down to :data:`BUDGET_LOW_WATER` of the budget, with one log line per such episode;
publishing never fails because of it. ``RingBudget.evicted_events`` counts the events it
removed (for metrics).

Pure and synchronous; a ring and its budget belong to one event loop (EB-11).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Final

from sessions.bus.frame import Frame

__all__ = ["BUDGET_LOW_WATER", "FRAME_OVERHEAD_BYTES", "Ring", "RingBudget", "held_bytes"]

logger = logging.getLogger("qwenweb.bus")

FRAME_OVERHEAD_BYTES: Final = 240
"""What a ring entry costs beyond its JSON bytes: the frame object (its arrival time
included), the bytes object's header and the deque slot (measured with ``sys.getsizeof``,
rounded up)."""

BUDGET_LOW_WATER: Final = 0.9
"""Over budget, the oldest events leave until the rings hold at most this share of it."""


def held_bytes(frame: Frame) -> int:
    """What one frame in a ring counts against the byte limits: ``nbytes`` plus
    :data:`FRAME_OVERHEAD_BYTES`. (A frame whose data could not be serialized keeps its
    fields instead of bytes: it counts the overhead only.)"""
    return frame.nbytes + FRAME_OVERHEAD_BYTES


class RingBudget:
    """The byte budget shared by every ring of a process (module docstring).

    Args:
        max_bytes: the budget (``>= 1``), in bytes of :func:`held_bytes`.

    Attributes:
        total_bytes: what the registered rings hold now.
        evicted_events: events removed because of the budget, since start (a counter).
        episodes: how many times the budget was passed (one log line each).
    """

    def __init__(self, max_bytes: int) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.total_bytes = 0
        self.evicted_events = 0
        self.episodes = 0
        self._rings: weakref.WeakSet[Ring] = weakref.WeakSet()
        self._relieving = False

    def _add(self, ring: Ring) -> None:
        self._rings.add(ring)

    def _relieve(self) -> None:
        """Drop the oldest events across all rings down to the low-water mark."""
        self._relieving = True
        try:
            target = int(self.max_bytes * BUDGET_LOW_WATER)
            order = itertools.count()
            heap = [(ring.oldest_at, next(order), ring) for ring in self._rings if len(ring)]
            heapq.heapify(heap)
            events = freed = 0
            touched: set[str] = set()
            while heap and self.total_bytes > target:
                _, _, ring = heapq.heappop(heap)
                freed += ring._drop_oldest()
                events += 1
                touched.add(ring.name)
                if len(ring):
                    heapq.heappush(heap, (ring.oldest_at, next(order), ring))
            self.evicted_events += events
            self.episodes += 1
            logger.warning(
                "ring_budget_exceeded budget_bytes=%d evicted_events=%d freed_bytes=%d "
                "sessions=%d held_bytes=%d",
                self.max_bytes,
                events,
                freed,
                len(touched),
                self.total_bytes,
            )
        finally:
            self._relieving = False


class Ring:
    """One session's replay ring (module docstring): frames with contiguous ids.

    Args:
        gap: ``(last, next)``: ids above ``last`` and below ``next`` are never issued
            (a forked epoch, EB-1): the frame after ``last`` is ``next``. None: none.
        max_events: the ring size, ``>= 1``.
        max_bytes: the byte limit (``>= 1``), in bytes of :func:`held_bytes`.
        max_age_s: seconds an event stays at most (``> 0``), or 0 for no age limit.
        budget: the process's :class:`RingBudget`, or None.
        name: what log lines call the ring (the session id).
        clock: monotonic seconds (tests pass their own).

    Not thread-safe; never awaits, never raises for a frame with an id.
    """

    __slots__ = (
        "__weakref__",
        "_budget",
        "_clock",
        "_frames",
        "gap",
        "max_age_s",
        "max_bytes",
        "max_events",
        "name",
        "nbytes",
    )

    def __init__(
        self,
        max_events: int,
        max_bytes: int,
        max_age_s: float = 0.0,
        *,
        budget: RingBudget | None = None,
        name: str = "-",
        clock: Callable[[], float] = time.monotonic,
        gap: tuple[int, int] | None = None,
    ) -> None:
        self.gap = gap
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.name = name
        self.nbytes = 0
        self._frames: deque[Frame] = deque()
        self._budget = budget
        self._clock = clock
        if budget is not None:
            budget._add(self)

    def __len__(self) -> int:
        return len(self._frames)

    def __iter__(self) -> Iterator[Frame]:
        return iter(self._frames)

    def __getitem__(self, index: int) -> Frame:
        return self._frames[index]

    @property
    def earliest_id(self) -> int | None:
        """The oldest id kept, or None when empty."""
        return self._frames[0].id if self._frames else None

    @property
    def oldest_at(self) -> float:
        """When the oldest event entered (monotonic s); ``inf`` when empty."""
        return self._frames[0].accepted_at if self._frames else float("inf")

    def append(self, frame: Frame) -> None:
        """Keep ``frame`` (the next id), then drop the oldest events past any limit.

        Sets ``frame.accepted_at`` to the ring's clock: when it entered (the age limit and
        the delivery latency both count from it; one clock read per event). The newest
        event always stays (a ring never empties itself on append), except when the
        process budget needs its bytes.
        """
        # held_bytes() and _drop_oldest() inlined: this runs once per published event.
        now = frame.accepted_at = self._clock()
        size = frame.nbytes + FRAME_OVERHEAD_BYTES
        frames = self._frames
        frames.append(frame)
        held = self.nbytes + size
        change = size
        while len(frames) > self.max_events or held > self.max_bytes:
            if len(frames) == 1:
                break
            dropped = frames.popleft().nbytes + FRAME_OVERHEAD_BYTES
            held -= dropped
            change -= dropped
        self.nbytes = held
        if self.max_age_s:
            change -= self._expire_before(now - self.max_age_s)
        budget = self._budget
        if budget is not None:
            budget.total_bytes += change
            if budget.total_bytes > budget.max_bytes and not budget._relieving:
                budget._relieve()

    def expire(self) -> int:
        """Drop events older than ``max_age_s`` (no-op when 0); return how many."""
        if not self.max_age_s:
            return 0
        before = len(self._frames)
        self._budget_drop(self._expire_before(self._clock() - self.max_age_s))
        return before - len(self._frames)

    def _expire_before(self, cutoff: float) -> int:
        """Drop the events that entered before ``cutoff``; return their bytes (not yet
        taken off the budget: the caller does)."""
        frames = self._frames
        freed = 0
        while frames and frames[0].accepted_at < cutoff:
            freed += frames.popleft().nbytes + FRAME_OVERHEAD_BYTES
        self.nbytes -= freed
        return freed

    def _budget_drop(self, size: int) -> None:
        if self._budget is not None:
            self._budget.total_bytes -= size

    def _rank(self, event_id: int) -> int:
        """How many frames have an id at or below ``event_id``, in O(1) (ids contiguous
        but for the one ``gap``)."""
        frames = self._frames
        first = frames[0].id
        assert first is not None
        rank = event_id - first + 1
        gap = self.gap
        if gap is not None and first <= gap[0] < event_id:
            rank = gap[0] - first + 1 + max(0, event_id - gap[1] + 1)
        return min(max(0, rank), len(frames))

    def frames_after(self, cursor: int) -> Iterator[Frame]:
        """Iterate the frames with an id above ``cursor``, oldest first, in O(returned)."""
        if not self._frames:
            return iter(())
        start = self._rank(cursor)
        if start >= len(self._frames):
            return iter(())
        return itertools.islice(self._frames, start, None)

    def newest(self, count: int, before: int | None = None) -> list[Frame]:
        """Return up to ``count`` frames with an id below ``before`` (None: the newest),
        newest first."""
        frames = self._frames
        if not frames or count <= 0:
            return []
        end = len(frames) if before is None else self._rank(before - 1)
        return [frames[index] for index in range(end - 1, max(-1, end - 1 - count), -1)]

    def _drop_oldest(self) -> int:
        frame = self._frames.popleft()
        size = held_bytes(frame)
        self.nbytes -= size
        if self._budget is not None:
            self._budget.total_bytes -= size
        return size

    def __del__(self) -> None:
        # A ring dropped with its bus (unloaded, closed) gives its bytes back to the budget.
        budget = getattr(self, "_budget", None)
        if budget is not None:
            budget.total_bytes -= self.nbytes
