"""One subscriber's bounded queue: :class:`Subscription` and its statistics (EB-3 ... EB-8).

Overflow and forced frames (EB-3 ... EB-5)
    Live frames (queued by ``publish``) count against two caps, ``max_queued`` frames and
    ``max_queued_bytes`` serialized bytes. A live push that does not fit is refused, never
    blocked; the bus then evicts the subscriber, which gets a terminal ``client_evicted``
    after what is already queued (EB-5). At 75 % of either cap it gets one
    ``slow_client_warning``, re-armed at 37.5 % of both (EB-4). Forced frames (replay,
    warnings, terminal frames) bypass both caps and never count toward them; each queued
    item carries its own live/forced tag. A frame handed straight to a consumer that is
    already waiting is not sized at all.

No eviction without a slow reader (EB-3, EB-4)
    The warning and both caps judge the reader, not the server: with an
    ``overflow_grace_s`` above 0 they apply only once the queue has stayed past 75 % of a
    cap for that long while the consumer did not come back for frames (it is away in one
    ``send`` that its connection blocks). Until then live frames past ``maxQueued``, and
    past ``max_queued_bytes`` up to :data:`~sessions.bus.limits.GRACE_BYTES_RATIO` times
    it, are queued; a push past that ceiling is refused at once (memory per subscriber:
    that ceiling plus the batch its consumer holds). Frames that piled up
    behind a ``send`` that then returned, or behind a burst released at once (a mirror's
    catch-up, a durable commit, a pause of the process), start a new episode each time
    the consumer comes back, so a reader that keeps up is never warned or evicted.
    ``overflow_grace_s == 0`` is the strict rule: the caps apply at once, whatever the
    consumer does.

Like the bus (EB-11), a subscription belongs to one event loop and is not thread-safe.
It knows its bus only through the narrow :class:`_Owner` protocol, so this module does
not import the bus.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, Protocol

from sessions.bus.frame import Frame, synthetic_frame
from sessions.bus.limits import GRACE_BYTES_RATIO, WARN_RESET_RATIO, WARN_THRESHOLD_RATIO
from sessions.bus.sweep import sweeper

__all__ = ["WATCH", "Subscription", "SubscriptionStats"]

logger = logging.getLogger("qwenweb.bus")

# The overflow grace's clock (monotonic seconds); unit tests replace it to move time.
_now = time.monotonic

# Keys of a client_evicted frame that its log line always shows; others are appended.
_LOGGED: Final = frozenset(
    {"reason", "droppedAfter", "queueSize", "maxQueued", "queuedBytes", "maxQueuedBytes"}
)


class _Owner(Protocol):
    """What a :class:`Subscription` needs of its bus: to be detached from it (EB-8)."""

    def _detach(self, sub: Subscription) -> None: ...


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


class _Unsized:
    """A queued frame that the caps do not count (EB-3): a forced frame (replay, warnings,
    terminal frames) or one handed straight to a consumer that was waiting.

    Each queued item carries its own tag, never inferred from position: a bare
    :class:`Frame` in the queue is live (counted), a frame wrapped in this is not. Live
    frames, the common case, cost no wrapper object.
    """

    __slots__ = ("frame",)

    def __init__(self, frame: Frame) -> None:
        self.frame = frame


# What :meth:`Subscription._push` returns for a live frame it queued while the warning
# must be looked at (past 75 % of a cap, or a warning to re-arm): the bus then calls
# ``_check_warning``. None: queued, nothing to look at; any other string: refused.
WATCH: Final = "watch"


class Subscription:
    """One subscriber: an async iterator of :class:`Frame`, usable as ``async with`` (EB-6).

    Iteration ends (``StopAsyncIteration``) after the terminal frame when the bus evicts
    the subscriber, disconnects it or closes, or at once after :meth:`abort`. Waiting for
    the next frame is cancellation-safe: a cancelled ``__anext__`` loses no frame, so a
    caller may bound each wait with ``asyncio.timeout`` (:meth:`next_frame` takes a timeout).

    Attributes:
        label: what log lines call this subscriber (``subscriber=<label>``).
        max_queued: cap on live frames queued (EB-3); fixed at construction (the push's
            fast path keeps its 75 % mark).
        max_queued_bytes: cap on live serialized bytes queued (EB-3); within the grace
            up to ``GRACE_BYTES_RATIO`` times it; fixed at construction, like
            ``max_queued``.
        overflow_grace_s: how long the queue may stay past 75 % of a cap while the
            consumer is away before the subscriber counts as slow (module docstring); 0:
            the caps apply at once.
        last_event_id: the id of the last event (a frame with an ``id``) handed out by
            iteration, :meth:`next_nowait` or :meth:`next_frame`; None before any. Synthetic
            frames leave it unchanged, so it is the subscriber's cursor (EB-7, SC-9).
        since: when the subscription was created, ``time.time()`` (epoch seconds).
        details: what the subscriber's owner attached for operators (who, from where), or
            None; the bus never reads it.
        bytes_sent: body bytes the owner wrote for this subscriber so far (the transport
            adds each ``send``'s size: one integer add per batch, never per frame); the
            bus never reads it. Operators derive bytes per second from it.
        end_note: what the code that ended this subscriber from outside noted about why
            (e.g. ``{"reason": "operator_disconnect", "by": "alice"}``), or None; set
            before :meth:`EventBus.disconnect`, read by the owner; the bus never reads it.
        on_evicted: called once, synchronously, when the bus evicts this subscriber
            (EB-5), after ``client_evicted`` is queued; None: nothing. It must neither
            block nor raise (the owner's transport, e.g. to keep a frozen reader's
            connection for its last frames).
    """

    __slots__ = (
        "__weakref__",  # operators keep per-subscription samples in weak mappings
        "_bus",
        "_end_reason",
        "_ended",
        "_evicted",
        "_items",
        "_live_bytes",
        "_live_count",
        "_pressure_since",
        "_pressure_visit",
        "_visits",
        "_waiter",
        "_warn_bytes",
        "_warn_frames",
        "_warned",
        "bytes_sent",
        "details",
        "end_note",
        "label",
        "last_event_id",
        "max_queued",
        "max_queued_bytes",
        "on_evicted",
        "overflow_grace_s",
        "since",
    )

    def __init__(
        self,
        bus: _Owner | None,
        max_queued: int,
        max_queued_bytes: int,
        label: str = "-",
        overflow_grace_s: float = 0.0,
    ) -> None:
        self._bus = bus
        # A deque only while frames are queued (an empty one is 0.6 KiB per idle stream).
        self._items: deque[Frame | _Unsized] | tuple[()] = ()
        self._waiter: asyncio.Future[None] | None = None
        self._live_count = 0
        self._live_bytes = 0
        self._warned = False
        self._evicted = False
        # Times the consumer came for frames, and the visit and moment (``_now``) at which
        # the queue was last found past 75 % of a cap: the overflow episode (EB-3, EB-4).
        self._visits = 0
        self._pressure_visit = -1
        self._pressure_since = 0.0
        self.overflow_grace_s = overflow_grace_s
        # Set once nothing more can be queued; iteration ends when the queue is empty.
        self._ended = bus is None
        self._end_reason: str | None = None if bus is not None else "closed"
        self.label = label
        self.max_queued = max_queued
        self.max_queued_bytes = max_queued_bytes
        # Where the warning starts to be looked at (EB-4): the push's fast path compares.
        self._warn_frames = WARN_THRESHOLD_RATIO * max_queued
        self._warn_bytes = WARN_THRESHOLD_RATIO * max_queued_bytes
        self.last_event_id: int | None = None
        self.since = time.time()
        self.details: Mapping[str, Any] | None = None
        self.bytes_sent = 0
        self.end_note: Mapping[str, Any] | None = None
        self.on_evicted: Callable[[], None] | None = None

    # -- consumer side -------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[Frame]:
        return self

    async def __anext__(self) -> Frame:
        self._visits += 1
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
        it waits with a deadline of the loop's :class:`~sessions.bus.sweep.Sweeper` (up to
        an eighth of ``timeout_s`` late, at most 1 s) instead of an ``asyncio.timeout``
        scope or a timer handle of its own, which matters on the per-frame path of the
        writer and for the memory of an idle stream. Each call (not :meth:`next_nowait`)
        is the consumer coming back for frames: it ends an overflow episode (EB-3).
        """
        self._visits += 1
        if not self._items:
            if self._ended:
                raise StopAsyncIteration
            loop = asyncio.get_running_loop()
            waiter = loop.create_future()
            self._waiter = waiter
            deadlines = sweeper(loop)  # (a timer handle per wait: memory per idle stream)
            deadlines.call_at(waiter, loop.time() + timeout_s, _expire, timeout_s / 8)
            try:
                await waiter
            finally:
                deadlines.cancel(waiter)
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
        items = self._items
        assert isinstance(items, deque)
        item = items.popleft()
        if not items:
            self._items = ()
        if isinstance(item, _Unsized):
            frame = item.frame
        else:
            frame = item
            if self._live_count:
                self._live_count -= 1
                self._live_bytes -= frame.nbytes
        if frame.id is not None:
            self.last_event_id = frame.id
        return frame

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
        self._items = ()
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
        returned by a closed bus), ``"disconnected"`` (``EventBus.disconnect`` or
        ``disconnect_all``) or ``"aborted"`` (:meth:`abort`, EB-8). Set once; never
        changes afterwards.
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

    def _enqueue(self, item: Frame | _Unsized) -> None:
        items = self._items
        if not isinstance(items, deque):
            items = self._items = deque()
        items.append(item)

    def _force_push(self, frame: Frame) -> None:
        self._enqueue(_Unsized(frame))
        self._wake()

    def _push(self, frame: Frame) -> str | None:
        """Queue a live frame (EB-3): None if accepted; :data:`WATCH` if accepted and the
        warning must be looked at (:meth:`_check_warning`); else the rejection reason.

        The per-delivery path (one call per frame and subscriber): no call of its own
        unless the queue is near a cap, no object but the deque's slot.
        """
        items = self._items
        waiter = self._waiter
        if waiter is not None and not items and not waiter.done():
            # A consumer is already waiting: hand it over without byte sizing. It still
            # goes through the deque, so a consumer cancelled right now loses nothing.
            self._items = deque((_Unsized(frame),))
            self._waiter = None
            waiter.set_result(None)
            return WATCH if self._warned else None
        count = self._live_count
        if count >= self.max_queued and self._blocked():
            return "queue_overflow"
        nbytes = self._live_bytes + frame.nbytes
        if (
            count > 0
            and nbytes > self.max_queued_bytes
            and (nbytes > GRACE_BYTES_RATIO * self.max_queued_bytes or self._blocked())
        ):
            return "queue_bytes_overflow"
        if items:
            items.append(frame)
        else:
            self._items = deque((frame,))
        count += 1
        self._live_count = count
        self._live_bytes = nbytes
        if waiter is not None:
            self._wake()
        if self._warned or count >= self._warn_frames or nbytes >= self._warn_bytes:
            return WATCH
        return None

    def _end(self, reason: str, terminal: Frame | None = None) -> None:
        """Close with drain: queued frames, then ``terminal`` (if any), then iteration ends."""
        if terminal is not None:
            self._enqueue(_Unsized(terminal))
        self._ended = True
        self._end_reason = reason
        self._bus = None
        self._wake()

    def _blocked(self) -> bool:
        """Whether the consumer counts as blocked by its connection (EB-3, EB-4).

        Called only while the queue is past 75 % of a cap. The first call after the
        consumer came for frames starts an episode; the consumer is blocked once one
        episode has lasted ``overflow_grace_s`` seconds. Never raises, never awaits.
        """
        if self.overflow_grace_s <= 0:
            return True
        if self._pressure_visit != self._visits:
            self._pressure_visit = self._visits
            self._pressure_since = _now()
            return False
        return _now() - self._pressure_since >= self.overflow_grace_s

    def _check_warning(self, session: str, last_event_id: int, *, evicting: bool = False) -> bool:
        """EB-4: warn once per overflow episode, re-arm at 37.5 % of both caps.

        Called after a live push that :meth:`_push` flagged (:data:`WATCH`: the queue is
        past 75 % of a cap, or a warning may re-arm) or refused; returns whether it
        warned (one log line and a forced ``slow_client_warning``). Past 75 % it warns
        only a consumer that is blocked (:meth:`_blocked`), or when ``evicting`` (the push
        was refused: the warning goes before ``client_evicted``, as it would have without
        a grace).
        """
        frames, nbytes = self._live_count, self._live_bytes
        if (
            self._warned
            and frames <= WARN_RESET_RATIO * self.max_queued
            and nbytes <= WARN_RESET_RATIO * self.max_queued_bytes
        ):
            self._warned = False
        if self._warned:
            return False
        by_frames = frames >= WARN_THRESHOLD_RATIO * self.max_queued
        by_bytes = nbytes >= WARN_THRESHOLD_RATIO * self.max_queued_bytes
        if not (by_frames or by_bytes) or not (evicting or self._blocked()):
            return False
        self._warned = True
        threshold = (
            "frames_and_bytes" if by_frames and by_bytes else "frames" if by_frames else "bytes"
        )
        logger.warning(
            "slow_client_warning session=%s subscriber=%s queueSize=%d maxQueued=%d "
            "queuedBytes=%d maxQueuedBytes=%d threshold=%s lastEventId=%d",
            session,
            self.label,
            frames,
            self.max_queued,
            nbytes,
            self.max_queued_bytes,
            threshold,
            last_event_id,
        )
        self._force_push(
            synthetic_frame(
                "slow_client_warning",
                {
                    "queueSize": frames,
                    "maxQueued": self.max_queued,
                    "lastEventId": last_event_id,
                    "queuedBytes": nbytes,
                    "maxQueuedBytes": self.max_queued_bytes,
                    "threshold": threshold,
                },
            )
        )
        return True

    def _evict(
        self,
        session: str,
        reason: str,
        dropped_after: int,
        frame: Frame | None,
        details: Mapping[str, Any] | None,
    ) -> None:
        """EB-5: log one line, queue ``client_evicted`` after what is queued, end with drain.

        ``frame`` is the live frame that did not fit (None for an eviction decided
        outside the bus); the caller detaches the subscriber and counts the eviction.
        """
        data: dict[str, Any] = {
            "reason": reason,
            "droppedAfter": dropped_after,
            "queueSize": self._live_count,
            "maxQueued": self.max_queued,
            "queuedBytes": self._live_bytes,
            "maxQueuedBytes": self.max_queued_bytes,
        }
        if reason == "queue_bytes_overflow" and frame is not None:
            data["eventBytes"] = frame.nbytes
        data.update(details or {})
        logger.warning(
            "client_evicted session=%s subscriber=%s reason=%s droppedAfter=%s queueSize=%d "
            "maxQueued=%d queuedBytes=%d maxQueuedBytes=%d%s",
            session,
            self.label,
            reason,
            dropped_after,
            self._live_count,
            self.max_queued,
            self._live_bytes,
            self.max_queued_bytes,
            "".join(f" {key}={value}" for key, value in data.items() if key not in _LOGGED),
        )
        self._evicted = True
        self._end("evicted", synthetic_frame("client_evicted", data))
        if self.on_evicted is not None:
            self.on_evicted()


def _expire(waiter: asyncio.Future[None]) -> None:
    # (the deadline of a wait: it ends without a frame)
    if not waiter.done():
        waiter.set_result(None)
