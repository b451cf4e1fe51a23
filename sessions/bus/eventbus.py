"""The per-session event bus: ids, the replay ring, bounded subscriber queues.

Contract: ``shared/spec/event-bus.md`` section 3 (rules EB-1 ... EB-11).

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
    Replay and synthetic frames are *forced*: they bypass both caps and never count
    toward them. One slow subscriber never slows the publisher or its siblings.

Log lines (``qwenweb.bus``) are one line of ``key=value`` each and name the session
(the bus's ``name``) and the subscriber (its ``label``), so an operator can grep them.

Each published event is serialized to compact JSON once (:attr:`Frame.json`); every
subscriber and the wire share those bytes. The ring is a ``collections.deque`` with
``maxlen``, so ring eviction is O(1).

This package imports nothing from Django (a test proves it in a fresh interpreter).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Any, Final

import orjson

__all__ = [
    "DEFAULT_MAX_QUEUED",
    "DEFAULT_MAX_QUEUED_BYTES",
    "DEFAULT_MAX_SUBSCRIBERS",
    "DEFAULT_RING_SIZE",
    "EVENT_SCHEMA_VERSION",
    "MAX_EVENT_RING_SIZE",
    "MAX_SAFE_INTEGER",
    "WARN_RESET_RATIO",
    "WARN_THRESHOLD_RATIO",
    "BusStats",
    "EventBus",
    "Frame",
    "SubscriberLimitExceededError",
    "Subscription",
    "SubscriptionStats",
    "disconnect_frame",
    "encode_envelope",
    "envelope_fields",
    "is_valid_epoch",
    "synthetic_frame",
]

logger = logging.getLogger("qwenweb.bus")

EVENT_SCHEMA_VERSION: Final = 1
DEFAULT_RING_SIZE: Final = 8000
MAX_EVENT_RING_SIZE: Final = 1_000_000
DEFAULT_MAX_QUEUED: Final = 256
DEFAULT_MAX_QUEUED_BYTES: Final = 2 * 1024 * 1024
DEFAULT_MAX_SUBSCRIBERS: Final = 64
WARN_THRESHOLD_RATIO: Final = 0.75
WARN_RESET_RATIO: Final = 0.375
MAX_SAFE_INTEGER: Final = 2**53 - 1

_EPOCH_ALPHABET: Final = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
)
_FORBIDDEN_TYPE_CHARS: Final = ("\r", "\n", "\0")
_LOGGED: Final = frozenset(
    {"reason", "droppedAfter", "queueSize", "maxQueued", "queuedBytes", "maxQueuedBytes"}
)


def is_valid_epoch(value: object) -> bool:
    """Return whether ``value`` is an epoch token: ``[A-Za-z0-9_-]{1,64}`` (EB-10, EB-13).

    Never raises.
    """
    return (
        isinstance(value, str)
        and 1 <= len(value) <= 64
        and all(ch in _EPOCH_ALPHABET for ch in value)
    )


class SubscriberLimitExceededError(Exception):
    """Raised by :meth:`EventBus.subscribe` when ``limit`` subscribers are attached (EB-6)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"subscriber limit reached ({limit})")
        self.limit = limit


class Frame(Mapping[str, Any]):
    """One frame: a read-only mapping in envelope key order (spec section 2).

    Keys, in order, absent ones left out: ``id`` (real events only), ``v``, ``type``,
    ``data``, ``_meta``, ``originatorClientId``.

    Attributes:
        id: the per-session event id (``int >= 1``), or ``None`` on a synthetic frame.
        type: the event type (non-empty, no CR/LF/NUL).
        json: the whole envelope as compact UTF-8 JSON, serialized once; ``None`` when
            the data could not be serialized (EB-2) or for a synthetic frame whose bytes
            the writer produces itself (synthetic frames get a timestamp at write time).
        nbytes: ``len(json)`` (0 when ``json`` is None): what counts against the byte cap.
    """

    __slots__ = ("_fields", "id", "json", "nbytes", "type", "wire")

    def __init__(self, fields: dict[str, Any], json: bytes | None) -> None:
        # A memo for the writer (the SSE route stores the frame's wire bytes here, so a
        # frame fanned out to many subscribers is framed once); the bus never reads it.
        self.wire: bytes | None = None
        self._fields = MappingProxyType(fields)
        self.id: int | None = fields.get("id")
        self.type: str = fields["type"]
        self.json = json
        self.nbytes = len(json) if json is not None else 0

    @property
    def synthetic(self) -> bool:
        """Whether the frame was made up by the bus or route (it has no ``id``)."""
        return self.id is None

    def __getitem__(self, key: str) -> Any:
        return self._fields[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __repr__(self) -> str:
        return f"Frame({dict(self._fields)!r})"


def synthetic_frame(event_type: str, data: Any) -> Frame:
    """Build a synthetic frame ``{"v": 1, "type": event_type, "data": data}`` (no id).

    Its ``json`` is ``None``: the writer serializes it when it writes it, adding
    ``_meta.serverTimestamp`` (EB-18). Never raises for a str ``event_type``.
    """
    return Frame({"v": EVENT_SCHEMA_VERSION, "type": event_type, "data": data}, None)


def disconnect_frame(reason: str) -> Frame:
    """Build the terminal frame of :meth:`EventBus.disconnect_all` (a ``stream_error``).

    Shape: ``{"v": 1, "type": "stream_error", "data": {"error": "disconnected by the
    server", "code": "server_disconnect", "reason": reason}}``. It is a ``stream_error``
    so that every client already treats it as terminal and reconnects after its
    ``retry`` (SC-12). Never raises.
    """
    return synthetic_frame(
        "stream_error",
        {"error": "disconnected by the server", "code": "server_disconnect", "reason": reason},
    )


@dataclass(frozen=True, slots=True)
class SubscriptionStats:
    """A snapshot of one subscriber's queue (like anyio's ``statistics()``)."""

    live_count: int
    live_bytes: int
    forced_count: int
    max_queued: int
    max_queued_bytes: int
    warned: bool
    evicted: bool
    ended: bool


@dataclass(frozen=True, slots=True)
class BusStats:
    """A snapshot of a bus for operators (EB-10). Reading it touches no subscriber queue.

    ``evictions`` and ``resyncs`` map a reason (``queue_overflow``,
    ``queue_bytes_overflow``; ``epoch_reset``, ``ring_evicted``) to a count.
    ``earliest_id`` is None when the ring is empty.
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


@dataclass(slots=True)
class _Item:
    frame: Frame
    live: bool  # EB-3: each item carries its own tag, never inferred from position


class Subscription:
    """One subscriber: an async iterator of :class:`Frame`, usable as ``async with`` (EB-6).

    Iteration ends (``StopAsyncIteration``) after the terminal frame when the bus evicts
    the subscriber or closes, or at once after :meth:`abort`. Waiting for the next frame
    is cancellation-safe: a cancelled ``__anext__`` loses no frame, so a caller may
    bound each wait with ``asyncio.timeout`` (the route does, for heartbeats).
    """

    __slots__ = (
        "_bus",
        "_end_reason",
        "_ended",
        "_evicted",
        "_items",
        "_live_bytes",
        "_live_count",
        "_waiter",
        "_warned",
        "label",
        "max_queued",
        "max_queued_bytes",
    )

    def __init__(
        self, bus: EventBus | None, max_queued: int, max_queued_bytes: int, label: str = "-"
    ) -> None:
        self._bus = bus
        self._items: deque[_Item] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._live_count = 0
        self._live_bytes = 0
        self._warned = False
        self._evicted = False
        # Set once nothing more can be queued; iteration ends when the queue is empty.
        self._ended = bus is None
        self._end_reason: str | None = None if bus is not None else "closed"
        self.label = label
        self.max_queued = max_queued
        self.max_queued_bytes = max_queued_bytes

    # -- consumer side -------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[Frame]:
        return self

    async def __anext__(self) -> Frame:
        while not self._items:
            if self._ended:
                raise StopAsyncIteration
            waiter = asyncio.get_running_loop().create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                if self._waiter is waiter:
                    self._waiter = None
        frame = self.next_nowait()
        assert frame is not None
        return frame

    async def next_frame(self, timeout_s: float) -> Frame | None:
        """Return the next frame, or None if none arrived within ``timeout_s`` seconds.

        Raises ``StopAsyncIteration`` once the subscription has ended and its queue is
        drained. Like ``__anext__`` it is cancellation-safe (a frame is never lost), and
        it waits with one timer handle instead of an ``asyncio.timeout`` scope, which
        matters on the per-frame path of the writer.
        """
        if not self._items:
            if self._ended:
                raise StopAsyncIteration
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()
            self._waiter = waiter
            timer = loop.call_later(timeout_s, _expire, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                if self._waiter is waiter:
                    self._waiter = None
            if not self._items:
                if self._ended:
                    raise StopAsyncIteration
                return None
        return self.next_nowait()

    def next_nowait(self) -> Frame | None:
        """Return the next queued frame without waiting, or None if none is queued.

        Never raises; an ended subscription with nothing queued also gives None (the
        next ``__anext__`` then raises ``StopAsyncIteration``).
        """
        if not self._items:
            return None
        item = self._items.popleft()
        if item.live and self._live_count:
            self._live_count -= 1
            self._live_bytes -= item.frame.nbytes
        return item.frame

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.abort()

    def abort(self) -> None:
        """Detach now, drop buffered frames and end any pending iteration (EB-8).

        Idempotent; never raises. ``subscriber_count`` falls at once. A subscription the
        bus already ended (evicted, or the bus closed) is left alone, so its remaining
        frames, ending with the terminal frame, are still delivered.
        """
        if self._ended:
            return
        self._ended = True
        self._end_reason = "aborted"
        self._items.clear()
        self._live_count = self._live_bytes = 0
        if self._bus is not None:
            self._bus._detach(self)
        self._wake()

    @property
    def ended(self) -> bool:
        """Whether nothing more will be queued (aborted, evicted, or the bus closed)."""
        return self._ended

    @property
    def evicted(self) -> bool:
        """Whether the bus evicted this subscriber for overflow (EB-5)."""
        return self._evicted

    @property
    def end_reason(self) -> str | None:
        """Why nothing more will be queued, or None while the subscription is attached.

        ``"evicted"`` (EB-5), ``"closed"`` (the bus closed, EB-9; also a subscription
        returned by a closed bus), ``"disconnected"`` (:meth:`EventBus.disconnect_all`)
        or ``"aborted"`` (:meth:`abort`, EB-8). Set once; never changes afterwards.
        """
        return self._end_reason

    def statistics(self) -> SubscriptionStats:
        """Return a snapshot of this queue. Never raises."""
        return SubscriptionStats(
            live_count=self._live_count,
            live_bytes=self._live_bytes,
            forced_count=len(self._items) - self._live_count,
            max_queued=self.max_queued,
            max_queued_bytes=self.max_queued_bytes,
            warned=self._warned,
            evicted=self._evicted,
            ended=self._ended,
        )

    # -- producer side (the bus) -----------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _force_push(self, frame: Frame) -> None:
        self._items.append(_Item(frame, live=False))
        self._wake()

    def _push(self, frame: Frame) -> str | None:
        """Queue a live frame; return None if accepted, else the rejection reason (EB-3)."""
        if self._waiter is not None and not self._waiter.done() and not self._items:
            # A consumer is already waiting: hand it over without byte sizing. It still
            # goes through the deque, so a consumer cancelled right now loses nothing.
            self._items.append(_Item(frame, live=False))
            self._wake()
            return None
        if self._live_count >= self.max_queued:
            return "queue_overflow"
        if self._live_count > 0 and self._live_bytes + frame.nbytes > self.max_queued_bytes:
            return "queue_bytes_overflow"
        self._items.append(_Item(frame, live=True))
        self._live_count += 1
        self._live_bytes += frame.nbytes
        self._wake()
        return None

    def _end(self, reason: str) -> None:
        """Close with drain: queued frames are still delivered, then iteration ends."""
        self._ended = True
        self._end_reason = reason
        self._bus = None
        self._wake()


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
            restart starts above every id issued before (spec section 5).
        name: what log lines call this bus (``session=<name>``): the session id.
        epoch: the bus's epoch token (``[A-Za-z0-9_-]{1,64}``); None draws a random one.
            A mirror of a shared store (:meth:`ingest`) takes the store's epoch.

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
        self._ring: deque[Frame] = deque(maxlen=ring_size)
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
        """The id the next ``publish`` will assign."""
        return self._next_id

    @property
    def subscriber_count(self) -> int:
        """Subscribers currently attached."""
        return len(self._subscribers)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def ring_snapshot(self) -> tuple[Frame, ...]:
        """Return the events in the ring, oldest first (for the load-session snapshot)."""
        return tuple(self._ring)

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
            earliest_id=self._ring[0].id if self._ring else None,
            last_event_id=self.last_event_id,
            epoch=self.epoch,
            closed=self._closed,
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
        event_id = self._next_id
        fields = envelope_fields(event, event_id)
        if fields is None:
            return None
        encoded = _dumps(fields)
        if encoded is None:
            logger.warning("event %d (%s) data is not JSON-serializable", event_id, fields["type"])
        frame = Frame(fields, encoded)
        self._deliver(frame, event_id)
        return frame

    def ingest(self, frame: Frame) -> bool:
        """Take an event whose id was assigned elsewhere (a shared store), as ``publish`` would.

        For a bus that mirrors a shared ring (the Redis backend): ``frame`` must be a real
        event (``frame.id`` set) and the next one in sequence, ``frame.id == next_id``.
        It is appended to the ring and delivered to every subscriber with the same
        overflow rules as ``publish`` (EB-3 ... EB-5).

        Returns True if ingested; False (and does nothing) when the bus is closed or the
        id is not ``next_id`` (a repeat or a gap: the caller resynchronizes the mirror).
        Never raises, never awaits.
        """
        event_id = frame.id
        if self._closed or event_id is None or event_id != self._next_id:
            return False
        self._deliver(frame, event_id)
        return True

    def _deliver(self, frame: Frame, event_id: int) -> None:
        self._next_id = event_id + 1
        self._ring.append(frame)  # deque(maxlen=...) drops the oldest in O(1)
        self._counters.published += 1
        evicted: list[tuple[Subscription, str]] = []
        for sub in self._subscribers:
            reason = sub._push(frame)
            if reason is not None:
                evicted.append((sub, reason))
            else:
                self._check_warning(sub, event_id)
        for sub, reason in evicted:
            self._evict(sub, reason, frame)

    def _check_warning(self, sub: Subscription, last_event_id: int) -> None:
        """EB-4: warn once per overflow episode, re-arm at 37.5 % of both caps."""
        frames, nbytes = sub._live_count, sub._live_bytes
        if (
            sub._warned
            and frames <= WARN_RESET_RATIO * sub.max_queued
            and nbytes <= WARN_RESET_RATIO * sub.max_queued_bytes
        ):
            sub._warned = False
        if sub._warned:
            return
        by_frames = frames >= WARN_THRESHOLD_RATIO * sub.max_queued
        by_bytes = nbytes >= WARN_THRESHOLD_RATIO * sub.max_queued_bytes
        if not (by_frames or by_bytes):
            return
        sub._warned = True
        threshold = (
            "frames_and_bytes" if by_frames and by_bytes else "frames" if by_frames else "bytes"
        )
        self._counters.slow_client_warnings += 1
        logger.warning(
            "slow_client_warning session=%s subscriber=%s queueSize=%d maxQueued=%d "
            "queuedBytes=%d maxQueuedBytes=%d threshold=%s lastEventId=%d",
            self.name,
            sub.label,
            frames,
            sub.max_queued,
            nbytes,
            sub.max_queued_bytes,
            threshold,
            last_event_id,
        )
        sub._force_push(
            synthetic_frame(
                "slow_client_warning",
                {
                    "queueSize": frames,
                    "maxQueued": sub.max_queued,
                    "lastEventId": last_event_id,
                    "queuedBytes": nbytes,
                    "maxQueuedBytes": sub.max_queued_bytes,
                    "threshold": threshold,
                },
            )
        )

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
        dropped_after = frame.id if frame is not None else self._next_id
        data: dict[str, Any] = {
            "reason": reason,
            "droppedAfter": dropped_after,
            "queueSize": sub._live_count,
            "maxQueued": sub.max_queued,
            "queuedBytes": sub._live_bytes,
            "maxQueuedBytes": sub.max_queued_bytes,
        }
        if reason == "queue_bytes_overflow" and frame is not None:
            data["eventBytes"] = frame.nbytes
        data.update(details or {})
        evictions = self._counters.evictions
        evictions[reason] = evictions.get(reason, 0) + 1
        logger.warning(
            "client_evicted session=%s subscriber=%s reason=%s droppedAfter=%s queueSize=%d "
            "maxQueued=%d queuedBytes=%d maxQueuedBytes=%d%s",
            self.name,
            sub.label,
            reason,
            dropped_after,
            sub._live_count,
            sub.max_queued,
            sub._live_bytes,
            sub.max_queued_bytes,
            "".join(f" {key}={value}" for key, value in data.items() if key not in _LOGGED),
        )
        sub._evicted = True
        sub._force_push(synthetic_frame("client_evicted", data))
        self._subscribers.pop(sub, None)
        sub._end("evicted")

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
            return Subscription(None, max_queued, self.max_queued_bytes, label)
        if len(self._subscribers) >= self.max_subscribers:
            raise SubscriberLimitExceededError(self.max_subscribers)
        sub = Subscription(self, max_queued, self.max_queued_bytes, label)
        if last_event_id is not None:
            self._replay(sub, last_event_id, epoch)
        self._subscribers[sub] = None
        counters = self._counters
        counters.peak_subscribers = max(counters.peak_subscribers, len(self._subscribers))
        return sub

    def _replay(self, sub: Subscription, cursor: int, epoch: str | None) -> None:
        ring = self._ring
        earliest = ring[0].id if ring else self._next_id
        assert earliest is not None
        resync: dict[str, Any] | None = None
        replay_from = cursor
        if cursor >= self._next_id or (epoch is not None and epoch != self.epoch):
            resync = {
                "reason": "epoch_reset",
                "lastDeliveredId": cursor,
                "earliestAvailableId": earliest,
            }
            if epoch is not None and epoch != self.epoch:
                resync["detail"] = "epoch_mismatch"
            replay_from = 0  # the whole ring
        elif earliest > cursor + 1:
            # Covers both a ring that dropped events after the cursor and an empty ring
            # on a bus whose ids were issued elsewhere (start_id after a restart).
            resync = {
                "reason": "ring_evicted",
                "lastDeliveredId": cursor,
                "earliestAvailableId": earliest,
            }
        if resync is not None:
            resyncs = self._counters.resyncs
            resyncs[resync["reason"]] = resyncs.get(resync["reason"], 0) + 1
            logger.info(
                "state_resync_required session=%s subscriber=%s reason=%s lastDeliveredId=%d "
                "earliestAvailableId=%d%s",
                self.name,
                sub.label,
                resync["reason"],
                cursor,
                earliest,
                " detail=epoch_mismatch" if "detail" in resync else "",
            )
            sub._force_push(synthetic_frame("state_resync_required", resync))
        replayed = 0
        last_replayed: int | None = None
        if ring:
            # Ids in the ring are contiguous, so the first index after the cursor is
            # computed, not searched: replay costs O(replayed), not O(ring).
            first_id = ring[0].id
            assert first_id is not None
            start = max(0, replay_from - first_id + 1)
            for index in range(start, len(ring)):
                frame = ring[index]
                sub._force_push(frame)
                replayed += 1
                last_replayed = frame.id
        self._counters.replayed_frames += replayed
        complete: dict[str, Any] = {"replayedCount": replayed}
        if last_replayed is not None:
            complete["lastReplayedEventId"] = last_replayed
        sub._force_push(synthetic_frame("replay_complete", complete))

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
        subscribers = list(self._subscribers)
        self._subscribers.clear()
        terminal = frame if frame is not None else disconnect_frame(reason)
        for sub in subscribers:
            sub._force_push(terminal)
            sub._end("disconnected")
        if subscribers:
            logger.info(
                "subscribers_disconnected session=%s count=%d reason=%s",
                self.name,
                len(subscribers),
                reason,
            )
        return len(subscribers)

    def __repr__(self) -> str:
        return (
            f"<EventBus epoch={self.epoch} last_event_id={self.last_event_id} "
            f"subscribers={len(self._subscribers)} closed={self._closed}>"
        )


def envelope_fields(event: Mapping[str, Any], event_id: int | None) -> dict[str, Any] | None:
    """Return the envelope of ``event`` in key order (spec section 2), or None if refused.

    ``event_id`` None leaves ``id`` out (a shared store assigns it later). Stamps
    ``_meta.serverTimestamp`` (epoch ms) unless the caller gave a finite one (EB-2).
    Returns None, with one log line, when ``type`` is missing, empty or holds CR/LF/NUL.
    Never raises.
    """
    event_type = event.get("type") if isinstance(event, Mapping) else None
    if (
        not isinstance(event_type, str)
        or not event_type
        or any(ch in event_type for ch in _FORBIDDEN_TYPE_CHARS)
    ):
        logger.warning("publish refused: type must be a non-empty string without CR/LF/NUL")
        return None
    meta_in = event.get("_meta")
    meta = dict(meta_in) if isinstance(meta_in, Mapping) else {}
    if not _is_timestamp(meta.get("serverTimestamp")):
        meta["serverTimestamp"] = time.time_ns() // 1_000_000
    fields: dict[str, Any] = {} if event_id is None else {"id": event_id}
    fields["v"] = EVENT_SCHEMA_VERSION
    fields["type"] = event_type
    if "data" in event:
        fields["data"] = event["data"]
    fields["_meta"] = meta
    originator = event.get("originatorClientId")
    if originator is not None:
        fields["originatorClientId"] = originator
    return fields


def encode_envelope(fields: Mapping[str, Any]) -> bytes | None:
    """Compact UTF-8 JSON of an envelope (spec section 2), or None if not serializable."""
    return _dumps(fields)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _dumps(fields: Mapping[str, Any]) -> bytes | None:
    """Compact UTF-8 JSON of ``fields``, or None when it is not JSON-serializable (EB-2).

    orjson is fast but refuses integers beyond 64 bits, which are valid JSON numbers; the
    standard library serializes those (same compact form, non-ASCII kept as UTF-8).
    """
    try:
        # orjson's bytes keep a 4 KiB allocation however short the JSON; a frame lives in
        # the ring for thousands of events, so keep an exact-size copy (~0.2 us).
        return bytes(memoryview(orjson.dumps(fields)))
    except orjson.JSONEncodeError:
        pass
    try:
        return json.dumps(
            fields, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode()
    except (TypeError, ValueError, RecursionError):
        return None


def _is_timestamp(value: object) -> bool:
    """A caller's ``serverTimestamp`` is kept if it is a finite JSON-safe number (EB-2)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER
    return isinstance(value, float) and math.isfinite(value)
