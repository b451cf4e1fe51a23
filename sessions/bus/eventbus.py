"""The per-session event bus: ids, the replay ring, bounded subscriber queues.

Protocol: ``docs/protocol.md``, rules EB-1 ... EB-11 (its rule index).

Concurrency model (EB-11)
    A bus is owned by the event loop that first uses it and is **not thread-safe**.
    Every method is synchronous and never awaits, except iterating a
    :class:`Subscription`. Code running on another thread hands work to the loop
    (``loop.call_soon_threadsafe`` or ``asgiref.sync.async_to_sync``) and never touches
    a bus directly.

Overflow policy (EB-3 ... EB-5)
    ``publish`` never blocks and never raises. Each subscriber has a bounded queue of
    *live* frames (``max_queued`` frames and ``max_queued_bytes`` serialized bytes). At
    75 % of either cap the subscriber gets one ``slow_client_warning`` (re-armed at
    37.5 %); a live frame that does not fit evicts it: it gets a ``client_evicted``
    terminal frame after what is already queued, and is removed from the bus at once.
    With ``overflow_grace_s`` the warning and both caps wait until the subscriber's
    consumer has stayed away that long, the byte cap up to ``GRACE_BYTES_RATIO`` times
    itself (``queue``: no eviction without a slow reader).
    Replay and synthetic frames are *forced*: they bypass both caps and never count
    toward them. One slow subscriber never slows the publisher or its siblings.

Log lines (``qwenweb.bus``) are one line of ``key=value`` each and name the session
(the bus's ``name``) and the subscriber (its ``label``), so an operator can grep them.

Each published event is serialized to compact JSON once (:attr:`Frame.json`); every
subscriber and the wire share those bytes, and the ring keeps only those bytes
(:meth:`Frame.from_json`). The ring (``ring``) is bounded by count, bytes and age and by
the process's :class:`~sessions.bus.ring.RingBudget` (docs/protocol.md, "Ring limits");
its eviction is O(1) per event.

A subscriber's queue, with its warning and eviction frames, is ``queue``; replay is
``replay``. Nothing here imports Django or Redis (a test proves it in a fresh interpreter).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sessions.bus.frame import Frame, _dumps, disconnect_frame, envelope_fields, is_valid_epoch
from sessions.bus.limits import (
    DEFAULT_MAX_QUEUED,
    DEFAULT_MAX_QUEUED_BYTES,
    DEFAULT_MAX_SUBSCRIBERS,
    DEFAULT_RING_MAX_BYTES,
    DEFAULT_RING_SIZE,
    MAX_EVENT_RING_SIZE,
    MAX_SAFE_INTEGER,
)
from sessions.bus.queue import WATCH, Subscription
from sessions.bus.replay import replay
from sessions.bus.ring import Ring, RingBudget

__all__ = ["BusStats", "EventBus", "SubscriberLimitExceededError"]

logger = logging.getLogger("qwenweb.bus")


class SubscriberLimitExceededError(Exception):
    """Raised by :meth:`EventBus.subscribe` when ``limit`` subscribers are attached (EB-6)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"subscriber limit reached ({limit})")
        self.limit = limit


@dataclass(frozen=True, slots=True)
class BusStats:
    """A snapshot of a bus for operators (EB-10). Reading it touches no subscriber queue.

    ``evictions`` and ``resyncs`` map a reason (``queue_overflow``,
    ``queue_bytes_overflow``; ``epoch_reset``, ``ring_evicted``) to a count.
    ``earliest_id`` is None when the ring is empty; ``ring_bytes`` is what the ring
    holds (bytes of ``held_bytes``, docs/protocol.md "Ring limits").
    """

    published: int
    slow_client_warnings: int
    evictions: Mapping[str, int]
    resyncs: Mapping[str, int]
    replayed_frames: int
    subscriber_count: int
    peak_subscribers: int
    ring_length: int
    ring_size: int
    earliest_id: int | None
    last_event_id: int
    epoch: str
    closed: bool
    ring_bytes: int = 0


@dataclass(slots=True)
class _Counters:
    published: int = 0
    slow_client_warnings: int = 0
    replayed_frames: int = 0
    peak_subscribers: int = 0
    evictions: dict[str, int] = field(default_factory=dict)
    resyncs: dict[str, int] = field(default_factory=dict)


class EventBus:
    """The event bus of one session (EB-1).

    Args:
        ring_size: events kept for replay, in ``[1, MAX_EVENT_RING_SIZE]``.
        max_subscribers: concurrent subscribers allowed (a positive int).
        max_queued_bytes: per-subscriber cap on live serialized bytes, a positive int
            ``<= 2**53 - 1``.
        start_id: the first id this bus assigns (``>= 1``); a bus rebuilt after a
            restart starts above every id issued before (docs/protocol.md, "Ids and epochs").
        name: what log lines call this bus (``session=<name>``): the session id.
        epoch: the bus's epoch token (``[A-Za-z0-9_-]{1,64}``); None draws a random one.
            A mirror of a shared store (:meth:`ingest`) takes the store's epoch.
        ring_max_bytes: the ring's byte limit (``>= 1``; docs/protocol.md "Ring limits").
        ring_max_age_s: seconds an event stays in the ring at most; 0: no age limit.
        budget: the process's :class:`RingBudget` the ring counts against, or None.
        overflow_grace_s: seconds (``>= 0``) a subscriber's queue may stay past 75 % of a
            cap while its consumer is away before the warning and the caps apply
            (:mod:`sessions.bus.queue`); 0, the default: at once (strict).
        gap: a forked epoch's ``(fork id, first own id)`` (EB-23): the ids between are
            never issued in this epoch, so the event after ``fork id`` is ``first own id``
            (:meth:`ingest` takes it) and a cursor between them has missed nothing before
            ``first own id``. None: no gap.
        lineage: ``{ancestor epoch: the last id it shares with this epoch}``: a cursor of
            an ancestor at or below its id is a cursor of this epoch (no ``epoch_reset``).

    Raises:
        ValueError: ``ring_size`` outside ``[1, 1_000_000]`` (the message names the
            range), ``max_subscribers`` or ``start_id`` below 1.
        TypeError: ``max_queued_bytes`` not a positive int or above ``2**53 - 1``, or a
            non-int ``ring_size``, ``max_subscribers`` or ``start_id``.
    """

    def __init__(
        self,
        ring_size: int = DEFAULT_RING_SIZE,
        max_subscribers: int = DEFAULT_MAX_SUBSCRIBERS,
        *,
        max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
        start_id: int = 1,
        name: str = "-",
        epoch: str | None = None,
        ring_max_bytes: int = DEFAULT_RING_MAX_BYTES,
        ring_max_age_s: float = 0.0,
        budget: RingBudget | None = None,
        overflow_grace_s: float = 0.0,
        gap: tuple[int, int] | None = None,
        lineage: Mapping[str, int] | None = None,
    ) -> None:
        for argument, value in (
            ("ring_size", ring_size),
            ("max_subscribers", max_subscribers),
            ("start_id", start_id),
        ):
            if not _is_int(value):
                raise TypeError(f"{argument} must be an int, got {type(value).__name__}")
        if not 1 <= ring_size <= MAX_EVENT_RING_SIZE:
            raise ValueError(f"ring_size must be in [1, {MAX_EVENT_RING_SIZE:_}], got {ring_size}")
        if max_subscribers < 1:
            raise ValueError(f"max_subscribers must be >= 1, got {max_subscribers}")
        if not 1 <= start_id <= MAX_SAFE_INTEGER:
            raise ValueError(f"start_id must be in [1, 2**53 - 1], got {start_id}")
        if epoch is not None and not is_valid_epoch(epoch):
            raise ValueError("epoch must match [A-Za-z0-9_-]{1,64}")
        if gap is not None and not 0 <= gap[0] < gap[1] - 1:
            raise ValueError(f"gap must be (fork id, first own id) with ids between, got {gap!r}")
        if not _is_int(max_queued_bytes) or not 1 <= max_queued_bytes <= MAX_SAFE_INTEGER:
            raise TypeError(
                f"max_queued_bytes must be a positive int <= 2**53 - 1, got {max_queued_bytes!r}"
            )
        self.ring_size = ring_size
        self.max_subscribers = max_subscribers
        self.max_queued_bytes = max_queued_bytes
        self.start_id = start_id
        self.name = name
        self._epoch = epoch if epoch is not None else secrets.token_urlsafe(12)
        self._next_id = start_id
        if not _is_int(ring_max_bytes) or ring_max_bytes < 1:
            raise TypeError(f"ring_max_bytes must be a positive int, got {ring_max_bytes!r}")
        if ring_max_age_s < 0:
            raise ValueError(f"ring_max_age_s must be >= 0, got {ring_max_age_s!r}")
        if not overflow_grace_s >= 0:
            raise ValueError(f"overflow_grace_s must be >= 0, got {overflow_grace_s!r}")
        self.overflow_grace_s = overflow_grace_s
        self.gap = gap
        self.lineage: Mapping[str, int] = MappingProxyType(dict(lineage or {}))
        self._ring = Ring(
            ring_size, ring_max_bytes, ring_max_age_s, budget=budget, name=name, gap=gap
        )
        self._subscribers: dict[Subscription, None] = {}  # insertion-ordered set
        self._closed = False
        self._counters = _Counters()

    # -- read-only state (EB-10) -----------------------------------------------------

    @property
    def last_event_id(self) -> int:
        """The last id assigned (``start_id - 1`` before any publish)."""
        return self._next_id - 1

    @property
    def epoch(self) -> str:
        """A random token per bus instance, ``[A-Za-z0-9_-]{16}`` (EB-10)."""
        return self._epoch

    @property
    def next_id(self) -> int:
        """The id the next ``publish`` will assign (past a fork's ``gap``, its first own id)."""
        gap = self.gap
        if gap is not None and self._next_id == gap[0] + 1:
            return gap[1]
        return self._next_id

    @property
    def subscriber_count(self) -> int:
        """Subscribers currently attached."""
        return len(self._subscribers)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def subscriptions(self) -> tuple[Subscription, ...]:
        """Return the attached subscribers, in attach order. Never raises, never awaits."""
        return tuple(self._subscribers)

    def ring_snapshot(self) -> tuple[Frame, ...]:
        """Return the events in the ring, oldest first (for the load-session snapshot)."""
        self._ring.expire()
        return tuple(self._ring)

    @property
    def ring(self) -> Ring:
        """The replay ring (read it, never append to it): ``frames_after``, ``newest``."""
        return self._ring

    def stats(self) -> BusStats:
        """Return a snapshot for operators (EB-10). Never raises, never touches a queue."""
        counters = self._counters
        return BusStats(
            published=counters.published,
            slow_client_warnings=counters.slow_client_warnings,
            evictions=MappingProxyType(dict(counters.evictions)),
            resyncs=MappingProxyType(dict(counters.resyncs)),
            replayed_frames=counters.replayed_frames,
            subscriber_count=len(self._subscribers),
            peak_subscribers=counters.peak_subscribers,
            ring_length=len(self._ring),
            ring_size=self.ring_size,
            earliest_id=self._ring.earliest_id,
            last_event_id=self.last_event_id,
            epoch=self.epoch,
            closed=self._closed,
            ring_bytes=self._ring.nbytes,
        )

    # -- publish (EB-2 ... EB-5) -------------------------------------------------------

    def publish(self, event: Mapping[str, Any]) -> Frame | None:
        """Assign the next id, stamp, keep in the ring and deliver to every subscriber (EB-2).

        Args:
            event: a mapping with ``type`` (non-empty str without CR/LF/NUL), ``data``
                (any JSON value), optional ``_meta`` (a mapping) and
                ``originatorClientId`` (str).

        Returns:
            The published :class:`Frame`, or ``None`` when the bus is closed (no id is
            consumed) or the event cannot be framed (one log line).

        Never raises. Data that cannot be serialized is still delivered, as a frame of
        0 bytes with ``json`` None, and logged.
        """
        try:
            return self._publish(event)
        except Exception:  # EB-2: publish never raises, whatever the input
            logger.exception("publish failed unexpectedly; event dropped")
            return None

    def _publish(self, event: Mapping[str, Any]) -> Frame | None:
        if self._closed:
            return None
        event_id = self.next_id
        fields = envelope_fields(event, event_id)
        if fields is None:
            return None
        encoded = _dumps(fields)
        if encoded is None:
            logger.warning("event %d (%s) data is not JSON-serializable", event_id, fields["type"])
            frame = Frame(fields, None)
        else:  # the ring keeps the bytes only: the parsed data is dropped here
            frame = Frame.from_json(event_id, fields["type"], encoded)
        self._deliver(frame, event_id)
        return frame

    def ingest(self, frame: Frame) -> bool:
        """Take an event whose id was assigned elsewhere (a shared store), as ``publish`` would.

        For a bus that mirrors a shared ring (the Redis backend): ``frame`` must be a real
        event (``frame.id`` set) and the next one in sequence, ``frame.id == next_id``.
        (After a fork's ``gap`` the next one is its first own id.)
        It is appended to the ring and delivered to every subscriber with the same
        overflow rules as ``publish`` (EB-3 ... EB-5).

        Returns True if ingested; False (and does nothing) when the bus is closed or the
        id is not ``next_id`` (a repeat or a gap: the caller resynchronizes the mirror).
        Never raises, never awaits.
        """
        event_id = frame.id
        if self._closed or event_id is None:
            return False
        if event_id != self.next_id:  # (past a fork's gap, its first own id)
            return False
        self._deliver(frame, event_id)
        return True

    def _deliver(self, frame: Frame, event_id: int) -> None:
        self._next_id = event_id + 1
        self._ring.append(frame)  # sets accepted_at; drops the oldest past a limit, O(1)
        self._counters.published += 1
        evicted: list[tuple[Subscription, str]] = []
        for sub in self._subscribers:
            reason = sub._push(frame)
            if reason is None:
                continue
            if reason is WATCH:
                if sub._check_warning(self.name, event_id):
                    self._counters.slow_client_warnings += 1
            else:  # the last event it holds is the one before: ids go up by one
                if sub._check_warning(self.name, event_id - 1, evicting=True):
                    self._counters.slow_client_warnings += 1
                evicted.append((sub, reason))
        for sub, reason in evicted:
            self._evict(sub, reason, frame)

    def evict(self, subscription: Subscription, reason: str, **details: Any) -> bool:
        """Evict ``subscription`` for a reason found outside the bus (EB-5 semantics).

        Used by the route when the socket accepts no byte for too long
        (``writer_idle_timeout``): the subscriber gets ``client_evicted`` with ``reason``,
        ``droppedAfter`` (the next id it would have needed), its queue figures and
        ``details``, after what is already queued; it is detached at once and counted in
        ``stats().evictions[reason]``. Returns False (and does nothing) if the
        subscription is not attached. Never raises, never awaits.
        """
        if subscription not in self._subscribers:
            return False
        self._evict(subscription, reason, None, details)
        return True

    def _evict(
        self,
        sub: Subscription,
        reason: str,
        frame: Frame | None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        """EB-5: terminal frame after what is queued, drain, and detach at once."""
        dropped_after = frame.id if frame is not None and frame.id is not None else self._next_id
        evictions = self._counters.evictions
        evictions[reason] = evictions.get(reason, 0) + 1
        sub._evict(self.name, reason, dropped_after, frame, details)
        self._subscribers.pop(sub, None)

    # -- subscribe (EB-6, EB-7) --------------------------------------------------------

    def subscribe(
        self,
        *,
        last_event_id: int | None = None,
        max_queued: int = DEFAULT_MAX_QUEUED,
        epoch: str | None = None,
        label: str = "-",
    ) -> Subscription:
        """Register a subscriber synchronously and return its :class:`Subscription` (EB-6).

        Args:
            last_event_id: the client's cursor (``>= 0``); ``None`` means live only.
                Given (``0`` included), replay frames are queued before this returns:
                an optional ``state_resync_required``, the ring events after the
                cursor, then ``replay_complete`` (EB-7).
            max_queued: cap on live frames queued for this subscriber (``>= 1``).
            epoch: the bus epoch the cursor belongs to; a different one means the
                cursor came from an earlier bus (``epoch_reset``).
            label: what log lines call this subscriber (``subscriber=<label>``).

        Raises:
            SubscriberLimitExceededError: ``subscriber_count >= max_subscribers``;
                nothing is registered.
            ValueError: ``max_queued`` below 1 or ``last_event_id`` negative.

        On a closed bus returns an already-exhausted subscription (no limit check).
        """
        if not _is_int(max_queued) or max_queued < 1:
            raise ValueError(f"max_queued must be a positive int, got {max_queued!r}")
        if last_event_id is not None and (not _is_int(last_event_id) or last_event_id < 0):
            raise ValueError(f"last_event_id must be an int >= 0, got {last_event_id!r}")
        if self._closed:
            return Subscription(
                None, max_queued, self.max_queued_bytes, label, self.overflow_grace_s
            )
        if len(self._subscribers) >= self.max_subscribers:
            raise SubscriberLimitExceededError(self.max_subscribers)
        sub = Subscription(self, max_queued, self.max_queued_bytes, label, self.overflow_grace_s)
        counters = self._counters
        if last_event_id is not None:
            resync, replayed = replay(
                sub,
                self._ring,
                self.next_id,
                self.epoch,
                last_event_id,
                epoch,
                self.name,
                gap=self.gap,
                lineage=self.lineage,
            )
            if resync is not None:
                counters.resyncs[resync] = counters.resyncs.get(resync, 0) + 1
            counters.replayed_frames += replayed
        self._subscribers[sub] = None
        counters.peak_subscribers = max(counters.peak_subscribers, len(self._subscribers))
        return sub

    # -- teardown (EB-8, EB-9) -----------------------------------------------------------

    def _detach(self, sub: Subscription) -> None:
        self._subscribers.pop(sub, None)

    def close(self) -> None:
        """Close every subscriber with drain and refuse further work (EB-9). Idempotent."""
        if self._closed:
            return
        self._closed = True
        subscribers = list(self._subscribers)
        self._subscribers.clear()
        for sub in subscribers:
            sub._end("closed")

    def disconnect(
        self, subscription: Subscription, reason: str, *, frame: Frame | None = None
    ) -> bool:
        """End one subscription now with a terminal frame, as :meth:`disconnect_all` does.

        ``subscription`` gets :func:`disconnect_frame` (``stream_error``, code
        ``server_disconnect``, carrying ``reason``), or ``frame`` instead, after the frames
        already queued for it; its queue is closed with drain (EB-9 semantics,
        ``end_reason == "disconnected"``) and it is detached at once. The bus and the
        other subscribers go on.

        Returns False (and does nothing) if ``subscription`` is not attached to this bus
        (already ended, another bus's, or this bus is closed). Never raises, never
        awaits; logs one line when it disconnects.
        """
        if subscription not in self._subscribers:
            return False
        self._disconnect((subscription,), reason, frame)
        logger.info(
            "subscriber_disconnected session=%s subscriber=%s reason=%s",
            self.name,
            subscription.label,
            reason,
        )
        return True

    def disconnect_all(self, reason: str, *, frame: Frame | None = None) -> int:
        """End every subscription now with a terminal frame, like :meth:`close` (EB-9).

        Each attached subscriber gets :func:`disconnect_frame` (``stream_error``, code
        ``server_disconnect``, carrying ``reason``) after the frames already queued for
        it; its queue is closed with drain (those frames and the terminal frame are
        still delivered, then iteration ends, ``end_reason == "disconnected"``) and it
        is detached at once, so ``subscriber_count`` is 0 when this returns. Unlike
        :meth:`close`, the bus stays open: ``publish`` and ``subscribe`` go on working
        and clients may reconnect with their cursor.

        ``frame`` replaces that terminal frame (a synthetic ``stream_error`` of the
        caller's, e.g. the Redis backend's ``backend_unavailable``).

        Returns the number of subscribers disconnected (0 on a closed bus). Never raises,
        never awaits; logs one line when it disconnects anyone.
        """
        subscribers = tuple(self._subscribers)
        self._disconnect(subscribers, reason, frame)
        if subscribers:
            logger.info(
                "subscribers_disconnected session=%s count=%d reason=%s",
                self.name,
                len(subscribers),
                reason,
            )
        return len(subscribers)

    def _disconnect(self, subs: tuple[Subscription, ...], reason: str, frame: Frame | None) -> None:
        """EB-9 without closing the bus: terminal frame after what is queued, drain, detach."""
        terminal = frame if frame is not None else disconnect_frame(reason)
        for sub in subs:
            self._subscribers.pop(sub, None)
            sub._end("disconnected", terminal)

    def __repr__(self) -> str:
        return (
            f"<EventBus epoch={self.epoch} last_event_id={self.last_event_id} "
            f"subscribers={len(self._subscribers)} closed={self._closed}>"
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
