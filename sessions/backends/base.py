"""The backend seam: :class:`Backend`, what every backend offers, and what they share.

A backend holds the live sessions of this process: it loads a session's row on first use,
builds its :class:`~sessions.bus.EventBus` (the memory backend) or a mirror of a shared
ring (the Redis backend), publishes, subscribes with a cursor, closes, snapshots, and
answers operators (statistics, subscribers, disconnects, health) — for one process or
for every process of a deployment. Which backend runs is chosen in one place,
:func:`sessions.backends.get_backend` (setting ``BACKEND``: ``memory``, ``redis`` or the
dotted path of a class of your own, as Channels builds its channel layer). A new backend
is a new module with a subclass of :class:`Backend`; nothing else changes.

Concurrency model: a backend's sessions belong to the server's event loop (EB-11,
:attr:`Backend.loop`); every coroutine here runs there, database work goes through
``channels.db.database_sync_to_async`` (a worker thread for one query, never one per
stream). Code on other threads uses :attr:`Backend.loop` and the ``*_blocking``
methods. A backend announces what happens (a session closed, the loop attached) to its
:class:`~sessions.hooks.Hooks`; it never imports the operator or web side.

State: everything a backend knows (its registry of live sessions, its server loop, its
background tasks, a store's connections) is state of the backend object, so a test
builds one, uses it and drops it (:meth:`Backend.aclose`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from channels.db import database_sync_to_async

from sessions import token_versions
from sessions.backends import rows
from sessions.backends.errors import (
    BackendStartError,
    BackendUnavailableError,
    QuotaExceededError,
    SessionClosedError,
    SessionNotFoundError,
)
from sessions.backends.idempotency import (
    IdempotencyKey,
    IdempotencyKeyReusedError,
    IdempotencyStore,
)
from sessions.backends.rates import ByteRates, TokenBucket, ValuesQuota
from sessions.backends.reports import subscriber_row
from sessions.backends.revoked_streams import Revocation, RevocationSweep, revoked_frame
from sessions.backends.snapshot import SnapshotPage, snapshot_page
from sessions.bus import BusStats, EventBus, Frame, Registry, RingBudget, Subscription
from sessions.conf import QwenwebConfig
from sessions.hooks import Hooks
from sessions.models import AgentSession
from sessions.process_state import process_state
from sessions.runtime import ServerLoop

__all__ = [
    "OPERATOR_DISCONNECT",
    "Backend",
    "BackendStartError",
    "BackendUnavailableError",
    "Disconnected",
    "Health",
    "IdempotencyKey",
    "IdempotencyKeyReusedError",
    "LiveSession",
    "Published",
    "QuotaExceededError",
    "Revocation",
    "SessionClosedError",
    "SessionNotFoundError",
    "SnapshotPage",
    "StoreFigures",
    "session_closed_event",
]

logger = logging.getLogger("qwenweb.backend")

#: After a failed reservation renewal, the next attempt waits this long (seconds).
RENEWAL_RETRY_S = 5.0
#: How long an operator page waits for the cluster's figures (multi-process backends).
OPERATOR_STATS_TIMEOUT_S = 2.0
#: A session's publish token buckets hold this many seconds of their rate (the burst).
PUBLISH_BURST_S: Final = 2.0


def session_closed_event(reason: str, closed_by: str) -> dict[str, Any]:
    """The ``session_closed`` event a backend's :meth:`Backend.close_session` publishes:
    ``{"type": "session_closed", "data": {"reason": ..., "closedBy": ...}}`` (EB-9)."""
    return {"type": "session_closed", "data": {"reason": reason, "closedBy": closed_by}}


OPERATOR_DISCONNECT: Final = "operator_disconnect"
"""The ``reason`` of a subscriber an operator disconnected (:meth:`Backend.disconnect_subscriber`
with ``by``): its terminal frame's ``reason`` and its record's end reason."""


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
    stream_compression: bool = True  # False: its streams are never gzipped (the row's, EB-17)
    #: The memory backend's keys of idempotent publishes (None where the store keeps them).
    idempotency: IdempotencyStore | None = field(default=None, repr=False)
    _renewal: asyncio.Task[None] | None = field(default=None, repr=False)
    # No new reservation attempt before this time (monotonic s) after a failed one.
    _renew_not_before: float = field(default=0.0, repr=False)
    # The publish quotas' token buckets (events, bytes), made on the first publish.
    _buckets: tuple[TokenBucket, TokenBucket] | None = field(default=None, repr=False)
    # (next id, subscribers seen, monotonic s) at the idle sweep that last saw it change.
    _idle_mark: tuple[int, int, float] | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class Published:
    """What a publish returns: the event's ``id`` and the ``epoch`` of its sequence.

    ``replayed``: the request's ``Idempotency-Key`` had published already; ``id`` and
    ``epoch`` are that first result's, and nothing was published now.
    """

    id: int
    epoch: str
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class Disconnected:
    """What :meth:`Backend.disconnect_everywhere` did.

    ``here``: subscribers ended in this process. ``told``: how many other processes
    received the request (each ends its own and sends no count back): 0 for a
    single-process backend, None when the shared store could not be reached.
    """

    here: int
    told: int | None


@dataclass(frozen=True, slots=True)
class StoreFigures:
    """A durable store's figures for ``/metrics`` (:meth:`Backend.store_figures`): each
    commit's batch size (events and other writes) and latency (seconds) since the last
    call, the store's files (bytes) and its event rows."""

    batch_sizes: Sequence[int]
    commit_latencies_s: Sequence[float]
    file_bytes: int
    rows: int


@dataclass(frozen=True, slots=True)
class Health:
    """Whether the backend can serve: ``ok``, and ``problems`` in words when not."""

    ok: bool
    problems: tuple[str, ...] = ()


class Backend(ABC):
    """The interface every backend implements, and the parts they share.

    Args:
        config: the effective settings (``sessions.conf.get_config()``).
        hooks: where the backend announces sessions closed and the loop attached.

    Subclasses implement :meth:`_load`, :meth:`publish` and :meth:`close_session`; a
    multi-process backend also overrides the operator methods to see every process.
    """

    #: Whether several server processes may share this backend's sessions.
    supports_multiple_processes: ClassVar[bool] = False
    #: Whether a published event outlives this process (kept in a shared store).
    events_outlive_process: ClassVar[bool] = False
    #: What log lines and settings call the backend.
    name: ClassVar[str] = "backend"
    #: What operator pages call its shared store ("Redis is unavailable").
    store_label: ClassVar[str] = "The event store"

    @classmethod
    def deploy_problems(cls, config: QwenwebConfig) -> list[tuple[str, str]]:
        """``check --deploy``: ``[(problem, hint)]`` for this backend (sync; may do I/O)."""
        return []

    @classmethod  # noqa: B027 - optional: most backends can always start
    def check_can_start(cls, config: QwenwebConfig) -> None:
        """Before serving, in the starting process: raise :class:`BackendStartError` (one
        line) when this backend cannot serve at all, so the server refuses to start."""

    def __init__(self, config: QwenwebConfig, hooks: Hooks) -> None:
        self.config = config
        self.hooks = hooks
        self.registry: Registry[LiveSession] = Registry()
        self.loop = ServerLoop(hooks)
        self.rates = ByteRates()
        #: Every ring of this process together (``MAX_RING_BYTES_TOTAL``); its
        #: ``evicted_events`` counts the events it removed (for metrics).
        self.ring_budget = RingBudget(config.max_ring_bytes_total)
        self._background: set[asyncio.Task[Any]] = set()
        self.revocation_sweep = RevocationSweep(self._all_subscriptions, self._end_subscription)
        #: The JSON values publishers may make this process parse (charged before parsing).
        self.values_quota = ValuesQuota(
            config.publish_values_per_s, config.publish_user_values_per_s, PUBLISH_BURST_S
        )

    def takes_publishes(self) -> bool:
        """False while this process drains (``process_state.draining``) and its events live only
        here: an event accepted then would be lost when the process exits, after every
        stream ended (the publish view answers 503 ``draining``)."""
        return self.events_outlive_process or not process_state.draining

    @property
    def process_id(self) -> str:
        """What operator pages call this process (``host:pid``)."""
        return f"{socket.gethostname()}:{os.getpid()}"

    # -- sessions ---------------------------------------------------------------------

    async def get_live_session(self, session_id: str) -> LiveSession:
        """Return the loaded session ``session_id``, loading it if needed (on the loop).

        Raises:
            SessionNotFoundError: no such session.
            SessionClosedError: the session is closed.
            BackendUnavailableError: the shared store cannot be reached.
        """
        live = self.registry.get(session_id)
        if live is not None:
            if live.bus.closed:
                raise SessionClosedError(session_id, live.owner_id)
            return live
        self.loop.attach()
        loaded = await self.registry.get_or_create(session_id, lambda: self._load(session_id))
        assert loaded is not None  # the factory raises instead of returning None
        return loaded

    def new_bus(
        self,
        session_id: str,
        ring_size: int,
        *,
        start_id: int = 1,
        epoch: str | None = None,
        gap: tuple[int, int] | None = None,
        lineage: Mapping[str, int] | None = None,
    ) -> EventBus:
        """A bus for ``session_id`` with this process's limits: ``ring_size`` events,
        ``RING_MAX_BYTES``, ``RING_MAX_AGE_S``, the process budget (docs/protocol.md, "Ring
        limits"), ``MAX_SUBSCRIBERS``, ``MAX_QUEUED_BYTES`` and ``OVERFLOW_GRACE_S``. Both
        backends build theirs here (the Redis backend's mirror passes the store's ``epoch``;
        the durable backend a forked epoch's ``gap`` and ``lineage``, EventBus)."""
        config = self.config
        return EventBus(
            ring_size=ring_size,
            max_subscribers=config.max_subscribers,
            max_queued_bytes=config.max_queued_bytes,
            overflow_grace_s=config.overflow_grace_s,
            start_id=start_id,
            name=session_id,
            epoch=epoch,
            ring_max_bytes=config.ring_max_bytes,
            ring_max_age_s=config.ring_max_age_s,
            budget=self.ring_budget,
            gap=gap,
            lineage=lineage,
        )

    def check_publish_quota(self, live: LiveSession, nbytes: int) -> None:
        """Spend one event and ``nbytes`` from the session's publish token buckets
        (``PUBLISH_RATE_PER_S``, ``PUBLISH_BYTES_PER_S``, a burst of ``PUBLISH_BURST_S``
        seconds of each), in this process (docs/protocol.md, "Quotas").

        Raises:
            QuotaExceededError: a bucket has not enough; nothing is spent. Its
                ``retry_after_s`` is when the request fits (whole seconds, ``>= 1``).

        Never awaits; O(1).
        """
        config = self.config
        if live._buckets is None:
            rate, byte_rate = config.publish_rate_per_s, config.publish_bytes_per_s
            live._buckets = (
                TokenBucket(rate, max(1.0, rate * PUBLISH_BURST_S)),
                TokenBucket(byte_rate, byte_rate * PUBLISH_BURST_S),
            )
        events, volume = live._buckets
        for bucket, cost, quota, unit in (
            (events, 1, "PUBLISH_RATE_PER_S", "events/s"),
            (volume, nbytes, "PUBLISH_BYTES_PER_S", "bytes/s"),
        ):
            wait_s = bucket.wait_s(cost)
            if wait_s > 0:
                retry = max(1, int(wait_s + 0.999))
                raise QuotaExceededError(
                    quota,
                    bucket.rate_per_s,
                    retry,
                    f"publishing faster than {quota} ({bucket.rate_per_s:g} {unit} per "
                    f"session, bursts of {PUBLISH_BURST_S:g} s); retry in {retry} s",
                )
        events.take(1)
        volume.take(nbytes)

    @abstractmethod
    async def _load(self, session_id: str) -> LiveSession:
        """Build the live session of an open row (raises as :meth:`get_live_session`)."""

    @abstractmethod
    async def publish(
        self,
        live: LiveSession,
        event: Mapping[str, Any],
        *,
        idempotency: IdempotencyKey | None = None,
    ) -> Published | None:
        """Publish ``event`` in the session (EB-2): its id and epoch, or None.

        None when the session is closed or the event cannot be framed or serialized (one
        log line). With ``idempotency``, a key the session already published with (within
        ``IDEMPOTENCY_TTL_S``, among its ``IDEMPOTENCY_MAX_KEYS`` newest) publishes nothing
        and returns that first result with ``replayed=True``; the check and the publish are
        one atomic step, also across processes.

        Raises:
            IdempotencyKeyReusedError: the key is known with another request digest.
            BackendUnavailableError: a shared store cannot be reached (a single-process
                backend never raises it).
        """

    @abstractmethod
    async def close_session(
        self,
        session_id: str,
        *,
        reason: str,
        closed_by: str = "",
        idempotency: IdempotencyKey | None = None,
    ) -> Published:
        """Publish ``session_closed``, close the bus (EB-9), mark the row; return the
        ``session_closed`` event's id and epoch (``replayed`` as for :meth:`publish`).

        Announces :meth:`Hooks.session_closed`. Raises :class:`SessionNotFoundError`,
        :class:`SessionClosedError` (already closed, and ``idempotency`` is not the key
        that closed it) or :class:`IdempotencyKeyReusedError`.
        """

    async def recall(self, session_id: str, idempotency: IdempotencyKey) -> Published | None:
        """Return the first result of ``idempotency`` in the session, or None if unknown.

        For a request that found the session closed: a retry of a publish (or of the
        close) made before it closed still answers its first result. Never publishes.
        Raises :class:`IdempotencyKeyReusedError` (another digest) and, for a shared
        store, :class:`BackendUnavailableError`.
        """
        return None

    async def subscribe(
        self,
        live: LiveSession,
        *,
        last_event_id: int | None = None,
        max_queued: int,
        epoch: str | None = None,
        label: str = "-",
        details: Mapping[str, Any] | None = None,
    ) -> tuple[LiveSession, Subscription]:
        """Attach a subscriber (EB-6, EB-7); return the live session used and the subscription.

        ``details`` (who, from where) are kept on the subscription for
        :meth:`list_subscribers`. The bus is :meth:`caught_up` first, so the replay holds
        every event issued before the call. Raises ``SubscriberLimitExceededError``
        (EB-6) and, for a shared store, :class:`SessionClosedError` /
        :class:`BackendUnavailableError`.
        """
        live = await self.caught_up(live)
        subscription = live.bus.subscribe(
            last_event_id=last_event_id, max_queued=max_queued, epoch=epoch, label=label
        )
        subscription.details = details
        if details and details.get("auth"):
            self.revocation_sweep.wake()
        return live, subscription

    async def caught_up(self, live: LiveSession) -> LiveSession:
        """Return the session holding every event issued before the call (read your writes).

        A single-process backend's bus assigns the ids itself: ``live``.
        """
        return live

    async def snapshot(
        self, live: LiveSession, *, limit: int | None = None, before: int | None = None
    ) -> SnapshotPage:
        """Return the load-session page (:func:`~sessions.backends.snapshot.snapshot_page`):
        the newest ``limit`` events (default ``SNAPSHOT_LIMIT``) with an id below ``before``,
        within ``SNAPSHOT_MAX_BYTES``, with every event published before the call and the
        subscriber count of every process. The caller writes it out with ``chunks()``.

        Raises :class:`SessionClosedError` / :class:`BackendUnavailableError` (shared store).
        """
        live = await self.caught_up(live)
        return self._snapshot_page(live, limit, before, None)

    async def closed_snapshot(
        self, row: AgentSession, *, limit: int | None = None, before: int | None = None
    ) -> SnapshotPage | None:
        """Return the closed session ``row``'s history still held, within ``CLOSED_HISTORY_S``
        (``sessions/backends/closed_history.py``), as :meth:`snapshot` pages it; None when
        none is. Raises :class:`BackendUnavailableError` (shared store)."""
        return None

    def _snapshot_page(
        self, live: LiveSession, limit: int | None, before: int | None, subscribers: int | None
    ) -> SnapshotPage:
        return snapshot_page(
            live,
            limit=self.config.snapshot_limit if limit is None else limit,
            max_bytes=self.config.snapshot_max_bytes,
            before=before,
            subscriber_count=subscribers,
        )

    # -- ids reserved ahead (EB-1: never reissued) ------------------------------------

    def keep_reservation_ahead(self, live: LiveSession, event_id: int) -> None:
        """Renew the row's id reservation in the background once half a block is used.

        Never raises, never awaits. A single-process backend logs an overrun (an id past
        the reservation): it means the database refused the renewals.
        """
        block = self.config.id_reservation_block
        if (
            event_id > live.reserved_until - block // 2
            and live._renewal is None
            and time.monotonic() >= live._renew_not_before
        ):
            live._renewal = self.spawn(self._renew_reservation(live, event_id, block))
        if event_id > live.reserved_until and not self.supports_multiple_processes:
            # (With several processes another one may have renewed the row's reservation
            # already; this process's figure is only a lower bound.)
            logger.error(
                "id_reservation_overrun session=%s id=%d reserved_until=%d",
                live.session_id,
                event_id,
                live.reserved_until,
            )

    async def _renew_reservation(self, live: LiveSession, event_id: int, block: int) -> None:
        try:
            target = max(event_id, live.bus.last_event_id) + block
            await self.save_progress(live, reserved_until=target)
            live.reserved_until = max(live.reserved_until, target)
        except Exception as exc:
            # One line per failed attempt, at most one attempt per RENEWAL_RETRY_S: a
            # database that is down must not turn every publish into a traceback.
            live._renew_not_before = time.monotonic() + RENEWAL_RETRY_S
            logger.error(
                "id_reservation_failed session=%s error=%s retry_in_s=%g",
                live.session_id,
                f"{type(exc).__name__}: {exc}",
                RENEWAL_RETRY_S,
            )
        finally:
            live._renewal = None

    async def save_progress(self, live: LiveSession, **fields: Any) -> None:
        """Persist the bus's counters on the row (:func:`rows.save_progress`), off the loop."""
        await database_sync_to_async(rows.save_progress)(
            live.session_id,
            live.bus.stats(),
            shared=self.supports_multiple_processes,
            **fields,
        )

    def spawn(self, coroutine: Any) -> asyncio.Task[Any]:
        """Run ``coroutine`` as a background task of this backend (awaited by :meth:`flush_all`)."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # -- operators --------------------------------------------------------------------

    def live_stats(self, session_ids: Iterable[str] | None = None) -> dict[str, BusStats]:
        """Return ``{session id: bus.stats()}`` of this process's sessions (EB-10), on the loop.

        ``session_ids`` limits the answer; None means every loaded session. Never raises,
        never awaits, never touches a subscriber queue.
        """
        wanted = None if session_ids is None else set(session_ids)
        return {
            live.session_id: live.bus.stats()
            for live in self.registry.values()
            if wanted is None or live.session_id in wanted
        }

    async def other_reports(self) -> list[dict[str, Any]]:
        """Return the reports of every other live process (``[]`` for one process).

        Raises :class:`BackendUnavailableError` (shared store unreachable).
        """
        return []

    def cluster_stats(
        self, others: Sequence[Mapping[str, Any]], session_ids: Iterable[str] | None = None
    ) -> dict[str, BusStats]:
        """Sum this process's fresh figures with ``others`` (:meth:`other_reports`), on the
        loop; with ``others`` empty this is :meth:`live_stats`. Never awaits."""
        return self.live_stats(session_ids)

    async def operator_stats(self, session_ids: Iterable[str] | None = None) -> dict[str, BusStats]:
        """Live figures per session for operators, on the loop: this process's, or the sum
        over every live process. Raises :class:`BackendUnavailableError` (shared store)."""
        return self.cluster_stats(await self.other_reports(), session_ids)

    def operator_stats_blocking(
        self,
        session_ids: Iterable[str] | None = None,
        *,
        timeout_s: float = OPERATOR_STATS_TIMEOUT_S,
    ) -> dict[str, BusStats]:
        """Return :meth:`operator_stats` from sync code in another thread (admin, pages).

        ``{}`` when this process has no server loop (nothing is loaded). Blocks for about
        ``timeout_s`` at most.

        Raises:
            TimeoutError: the server loop did not answer in time.
            BackendUnavailableError: the shared store is unreachable or too slow.
        """
        return self.loop.call(lambda: self.live_stats(session_ids), default={}, timeout_s=timeout_s)

    async def subscriber_count(self, live: LiveSession) -> int:
        """Subscribers of the session in every process (this one's for one process)."""
        return live.bus.subscriber_count

    async def list_subscribers(self, session_id: str) -> list[dict[str, Any]]:
        """Return the session's current subscribers in every process, oldest first.

        Rows as :func:`subscriber_row`; ``bytesPerSecond`` is the rate between two samples
        at least one second apart (:mod:`sessions.backends.rates`). A multi-process
        backend's other processes' rows are at most one report interval old. Raises
        :class:`BackendUnavailableError`.
        """
        return self.local_subscribers(session_id)

    def local_subscribers(self, session_id: str) -> list[dict[str, Any]]:
        """This process's rows of :meth:`list_subscribers`, on the loop. Never raises."""
        live = self.registry.get(session_id)
        if live is None:
            return []
        return [
            subscriber_row(self.process_id, live.bus, s, self.rates.rate(s))
            for s in live.bus.subscriptions()
        ]

    async def disconnect_subscriber(
        self, session_id: str, subscriber_id: str, *, reason: str, by: str = ""
    ) -> bool:
        """End one subscriber (by its id, the connection id) with a terminal frame.

        ``by`` names who asked (an operator); it is noted on the subscription
        (``end_note``), so the stream records it. Returns whether it was found in this
        process; a multi-process backend also tells every other process (then True means
        "asked"). Raises :class:`BackendUnavailableError` when the others cannot be told.
        """
        return self.disconnect_local_subscriber(session_id, subscriber_id, reason, by=by)

    def disconnect_local_subscriber(
        self, session_id: str, subscriber_id: str, reason: str, *, by: str = ""
    ) -> bool:
        """End this process's subscriber ``subscriber_id`` of the session; whether found.

        The subscription gets ``end_note = {"reason": reason, "by": by}`` before the bus
        ends it (``stream_error`` code ``server_disconnect`` with ``reason``, EB-9
        semantics); its siblings go on. Never raises, never awaits.
        """
        live = self.registry.get(session_id)
        if live is None:
            return False
        for subscription in live.bus.subscriptions():
            if subscription.label == subscriber_id:
                subscription.end_note = {"reason": reason, "by": by}
                return live.bus.disconnect(subscription, reason)
        return False

    async def disconnect_everywhere(self, session_id: str, *, reason: str) -> Disconnected:
        """End every subscriber of a session with a terminal frame, here and (shared store)
        in every other process. The session stays open; clients may reconnect.

        Never raises: an unreachable store gives ``told=None`` (local ones are ended).
        """
        live = self.registry.get(session_id)
        return Disconnected(live.bus.disconnect_all(reason) if live is not None else 0, 0)

    def end_all_streams(self, reason: str) -> int:
        """End every subscriber of every loaded session (shutdown); return how many."""
        return sum(live.bus.disconnect_all(reason) for live in self.registry.values())

    async def relay_activity(  # noqa: B027 - optional: nothing to relay in one process
        self, items: Sequence[Mapping[str, Any]]
    ) -> None:
        """Send operator activity ``items`` to every other process (nothing for one process).

        Each other process announces them with :meth:`Hooks.activity_received`.
        Raises :class:`BackendUnavailableError`.
        """

    async def health(self) -> Health:
        """Whether this backend can serve now (a shared store answers, its reader runs)."""
        return Health(True)

    def store_figures(self) -> StoreFigures | None:
        """The figures of a store on this machine's disk since the last call (on the loop),
        or None (none: memory, Redis). Never raises, never awaits."""
        return None

    # -- revocation (docs/protocol.md, "Revocation") ------------------------------------

    def _all_subscriptions(self) -> list[tuple[str, Subscription]]:
        return [
            (live.session_id, subscription)
            for live in self.registry.values()
            for subscription in live.bus.subscriptions()
        ]

    def _end_subscription(
        self, session_id: str, subscription: Subscription, reason: str, frame: Frame
    ) -> bool:
        live = self.registry.get(session_id)
        return live is not None and live.bus.disconnect(subscription, reason, frame=frame)

    def revoke_local(self, revocation: Revocation) -> int:
        """End this process's subscriptions that ``revocation`` makes invalid, each with a
        ``stream_error`` (code ``token_revoked``), and drop the cached versions it touches;
        return how many ended. On the loop; never raises, never awaits."""
        token_versions.invalidate(user_id=revocation.user_id, session_id=revocation.session_id)
        ended = 0
        for session_id, subscription in self._all_subscriptions():
            if revocation.ends(session_id, subscription.details):
                ended += self._end_subscription(
                    session_id, subscription, "token_revoked", revoked_frame()
                )
        if ended:
            logger.info("streams_ended reason=token_revoked count=%d", ended)
        return ended

    async def revoke(self, revocation: Revocation) -> int:
        """:meth:`revoke_local` here and, for a multi-process backend, in every process
        (relayed; the others send no count back). Returns the count here. Never raises:
        a relay that fails is logged, and the other processes' sweeps still catch it
        within about a second."""
        return self.revoke_local(revocation)

    def revoke_blocking(self, revocation: Revocation) -> None:
        """:meth:`revoke` from synchronous code on any thread; never waits, never raises.

        On the server loop when this process has one; otherwise only a multi-process
        backend can tell the servers (:meth:`relay_revocation_blocking`): with the
        memory backend the server's sweep sees the new versions in the database.
        """
        loop = self.loop.get()
        if loop is not None:
            self.loop.call_soon(lambda: self.spawn(self.revoke(revocation)))
            return
        self.relay_revocation_blocking(revocation)

    def relay_revocation_blocking(self, revocation: Revocation) -> None:  # noqa: B027
        """Tell every server process of ``revocation`` without a server loop here (a
        management command); nothing for a single-process backend. Never raises."""

    # -- shutdown ---------------------------------------------------------------------

    async def flush_all(self) -> None:
        """Persist every loaded session's counters and wait for pending renewals (shutdown)."""
        for live in self.registry.values():
            await self.save_progress(live)
        if self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    async def aclose(self) -> None:
        """Release what the backend holds (connections, tasks). Idempotent; never raises."""
        self.revocation_sweep.stop()
