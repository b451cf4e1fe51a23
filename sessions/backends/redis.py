"""The Redis backend: ids, epoch and the ring live in Redis, shared by every process.

Setting ``BACKEND = "redis"`` (``REDIS_URL``, ``REDIS_KEY_PREFIX``, ``PROCESS_TTL_S``).
The store itself (keys, Lua scripts, the reader task) is :mod:`sessions.backends.redis_store`.

Mirrors
    Here a session's bus is a *mirror*: it takes the events in id order from this
    process's one reader task (:meth:`EventBus.ingest`) and keeps the local subscriber
    queues, so backpressure, warnings and evictions stay local and exact (EB-3 ... EB-5,
    EB-21). A publish goes to Redis and reaches every process's mirror through its reader,
    this one included. Before a subscriber attaches (or a snapshot is taken) the mirror
    is waited for until it has every id Redis had issued, so a client resuming on another
    process misses nothing and a live-only one gets nothing published before it.
    Mirrors without subscribers for ``MIRROR_IDLE_UNLOAD_S`` are unloaded.

Epochs (EB-7)
    When Redis has lost a session's data the next load starts a new epoch whose ids
    continue above the database's reserved high-water mark. When Redis comes back with
    *older* data than it gave out (restored from a snapshot), the session restarts in a
    new epoch above every id this process knows was issued: no id is ever issued twice.
    The same holds for a promoted replica that was behind (a Sentinel failover): either
    its id counter is below what this process has seen, or, once another process has
    written over the missing ids, the newest id this process took holds other bytes
    there (``diverged_data``). Either way every old cursor resyncs, never a silent gap.

Failures
    Redis unreachable, full or busy: publish and new streams raise
    :class:`BackendUnavailableError` (503); open streams get one ``stream_error`` (code
    ``backend_unavailable``) and end; everything resumes when Redis returns.

Operators
    Each process writes its live figures (and its subscribers) to Redis every
    ``PROCESS_TTL_S / 4`` with a time to live; operators see sums over the live processes.
    Disconnects and dashboard activity reach the other processes over a prefixed pub/sub
    control channel (:mod:`sessions.backends.redis_control`).

Idempotency
    A publish's ``Idempotency-Key`` is checked and stored by the publish script itself
    (:mod:`sessions.backends.redis_scripts`), so a publish that timed out here but ran in
    Redis answers its first result when retried, on any process.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson
from channels.db import database_sync_to_async
from django.utils import timezone

from sessions.backends import rows
from sessions.backends.base import (
    Health,
    LiveSession,
    Published,
    SnapshotPage,
    session_closed_event,
)
from sessions.backends.closed_history import closed_bus, history_kept
from sessions.backends.errors import BackendUnavailableError, SessionClosedError
from sessions.backends.idempotency import IdempotencyKey, IdempotencyKeyReusedError, Remembered
from sessions.backends.redis_clients import sync_client, unavailable_as_error
from sessions.backends.redis_control import RedisControlled, redis_target
from sessions.backends.redis_store import RedisStore, SessionWindow, entry_json
from sessions.bus import (
    MAX_EVENT_RING_SIZE,
    MAX_SAFE_INTEGER,
    EventBus,
    Frame,
    encode_envelope,
    envelope_fields,
    synthetic_frame,
)
from sessions.conf import QwenwebConfig
from sessions.hooks import Hooks
from sessions.models import AgentSession

__all__ = ["RedisBackend", "RedisLiveSession"]

logger = logging.getLogger("qwenweb.runtime")

#: How long a new stream waits for this process's reader to reconnect after an outage.
READER_RECOVERY_WAIT_S = 2.0
#: The Redis stream keeps up to this many entries even for a smaller ring size: it is also
#: the transport between processes, and a reader a little behind a tiny ring must not see
#: a gap (the local ring still keeps ``ring_size``). The byte and age limits always apply:
#: this floor never keeps bytes beyond ``RING_MAX_BYTES``.
STREAM_COUNT_FLOOR = 1000
#: How long a subscriber or a snapshot waits for this process's mirror to reach the last id
#: Redis issued.
CATCH_UP_TIMEOUT_S = 5.0
#: A mirror without subscribers for this long is unloaded: the reader then reads only the
#: streams of sessions with local subscribers (or recent ones); a later use reloads it.
MIRROR_IDLE_UNLOAD_S = 60.0


@dataclass(eq=False)
class RedisLiveSession(LiveSession):
    """A live session whose bus mirrors the shared ring."""

    # Set (and replaced) each time the mirror takes new events.
    _advanced: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    # Since when the mirror has had no subscriber (monotonic s), or None.
    _idle_since: float | None = field(default=None, repr=False)


# The envelope's first keys, in their fixed order ("Frames"): the type is read from them
# without parsing the (possibly large) rest.
_TYPE_PREFIX = re.compile(rb'\{"v":\d+,"type":("(?:[^"\\]|\\.)*")')


def _contiguous_tail(entries: tuple[tuple[int, bytes], ...]) -> int:
    """The index where the contiguous run of ids that ends the stream starts (0 if empty): a
    hole (ids the stream lost) must read as "evicted" to older cursors (EB-7), never be
    replayed across."""
    start = len(entries) - 1
    while start > 0 and entries[start - 1][0] == entries[start][0] - 1:
        start -= 1
    return max(0, start)


def _frame_from_entry(event_id: int, body: bytes) -> Frame:
    """A lazily parsed frame of a stream entry (only ``type`` is read from the bytes)."""
    encoded = entry_json(event_id, body)
    match = _TYPE_PREFIX.match(body)
    event_type = orjson.loads(match.group(1)) if match else orjson.loads(encoded)["type"]
    return Frame.from_json(event_id, event_type, encoded)


def _backend_error_frame() -> Frame:
    return synthetic_frame(
        "stream_error", {"error": "event store unavailable", "code": "backend_unavailable"}
    )


class RedisBackend(RedisControlled):
    """Sessions shared by every server process through Redis (module docstring)."""

    supports_multiple_processes: ClassVar[bool] = True
    events_outlive_process: ClassVar[bool] = True
    name: ClassVar[str] = "redis"
    store_label: ClassVar[str] = "Redis"

    @classmethod
    def deploy_problems(cls, config: QwenwebConfig) -> list[tuple[str, str]]:
        """Redis must answer at ``REDIS_URL``, through its Sentinels or at a Cluster's seeds
        (one PING, 1 s timeouts)."""
        try:
            with unavailable_as_error():  # (a blocking cluster client connects when built)
                client = sync_client(redis_target(config), 1.0)
                with contextlib.closing(client):
                    client.ping()
        except BackendUnavailableError as exc:
            return [
                (
                    "BACKEND is 'redis' but Redis does not answer at the configured URL: "
                    f"{type(exc.__cause__).__name__}",
                    "Start Redis or fix QWENWEB['REDIS_URL'] / $QWENWEB_REDIS_URL (or the "
                    "REDIS_SENTINELS and REDIS_SENTINEL_SERVICE settings); until "
                    "it answers, publish and new streams get 503.",
                )
            ]
        return []

    def __init__(self, config: QwenwebConfig, hooks: Hooks) -> None:
        super().__init__(config, hooks)
        self._store: RedisStore | None = None
        # The highest id this process knows was issued per session (its mirrors, its
        # publishes, the row's saved last id): kept across mirror reloads and Redis
        # outages, so that a Redis that comes back with older data than it gave out is
        # recognised (see _restart_epoch).
        self._known_last: dict[str, int] = {}
        # The newest event this process took per session: (id, epoch, digest of its bytes).
        # A Redis that comes back with the same epoch and that id holding *other* bytes (a
        # promoted replica that was behind, then written to by another process) is caught
        # by it, where the id counter alone looks fine (see _diverged).
        self._fingerprints: dict[str, tuple[int, str, bytes]] = {}
        # The server the reader read from before its last outage (failover detection).
        self._last_attached: tuple[str, int] | None = None

    # -- the store ---------------------------------------------------------------------

    def store(self) -> RedisStore:
        """Return this loop's :class:`RedisStore`; its reader starts on first use (on the loop)."""
        loop = asyncio.get_running_loop()
        if self._store is None or self._store.loop is not loop:
            config = self.config
            self._store = RedisStore(
                redis_target(config), config.redis_key_prefix, process_ttl_s=config.process_ttl_s,
                wait=(config.redis_wait_replicas, config.redis_wait_timeout_ms),
            )  # fmt: skip
            self._store.start(
                self._on_entries,
                self._on_outage,
                self._on_recovery,
                self._on_control,
                self._report_and_sweep,
            )
        return self._store

    @property
    def process_id(self) -> str:
        return self._store.process_uid if self._store is not None else super().process_id

    async def aclose(self) -> None:
        """Stop the Redis reader and close its connections (shutdown, tests). Never raises."""
        await super().aclose()
        store, self._store = self._store, None
        if store is not None and not store.loop.is_closed():
            try:
                await store.aclose()
            except Exception:
                logger.debug("closing the Redis store failed", exc_info=True)

    async def health(self) -> Health:
        try:
            store = self.store()
            await store.ping()  # the reader may not have noticed an outage yet
            await store.wait_available(READER_RECOVERY_WAIT_S)
        except BackendUnavailableError as exc:
            return Health(False, (f"redis: {exc}",))
        if not store.available:
            return Health(False, ("redis: this process's reader lost Redis",))
        return Health(True)

    # -- ids ---------------------------------------------------------------------------

    def _note_issued(self, session_id: str, event_id: int) -> None:
        if event_id > self._known_last.get(session_id, 0):
            self._known_last[session_id] = event_id

    def _note_fingerprint(self, session_id: str, event_id: int, epoch: str, body: bytes) -> None:
        known = self._fingerprints.get(session_id)
        if known is None or event_id >= known[0] or epoch != known[1]:
            self._fingerprints[session_id] = (event_id, epoch, _digest(body))

    def _diverged(self, session_id: str, window: SessionWindow) -> bool:
        """Whether Redis holds, in the epoch this process knows, other bytes under the id of
        the newest event this process took (EB-7: an id must never name two events)."""
        known = self._fingerprints.get(session_id)
        if known is None or known[1] != window.head.epoch:
            return False
        event_id, _, digest = known
        for entry_id, body in reversed(window.entries):
            if entry_id == event_id:
                return _digest(body) != digest
            if entry_id < event_id:
                break
        return False

    def _known_last_id(self, live: LiveSession) -> int:
        return max(self._known_last.get(live.session_id, 0), live.bus.last_event_id)

    async def _restart_epoch(
        self,
        live: LiveSession,
        stale_epoch: str | None,
        reason: str,
        known_last_id: int,
        *,
        diverged: bool = False,
    ) -> None:
        """Replace the session's data in Redis with a new epoch above every id ever issued.

        For data Redis went back in time on (restored from a snapshot older than what it
        gave out): in that epoch ids would be issued twice. The new epoch starts above the
        row's reserved mark (read now: another process may have moved it) and every id
        this process knows of, so every old cursor resyncs (EB-7). ``known_last_id`` is
        what the caller knew *before* it read Redis: Redis refuses the restart
        (atomically) if its last id has reached it since, i.e. if the data was not stale.
        ``diverged``: Redis holds other bytes under an id this process delivered (see
        :meth:`_diverged`); that stays wrong however far the ids go, so only another
        process's restart (the epoch changed) stops this one.
        """
        store = self.store()
        block = self.config.id_reservation_block
        row_reserved = await database_sync_to_async(rows.row_reserved)(live.session_id)
        base = max(row_reserved, live.reserved_until, known_last_id, self._known_last_id(live))
        refuse_from = MAX_SAFE_INTEGER if diverged else known_last_id
        epoch, replaced = await store.restart_epoch(live.session_id, stale_epoch, base, refuse_from)
        if replaced:
            live.reserved_until = await database_sync_to_async(rows.reserve_after_new_epoch)(
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

    # -- loading a mirror --------------------------------------------------------------

    async def _load(self, session_id: str) -> LiveSession:
        """Load the session's row, make sure Redis has its sequence, build the mirror."""
        config = self.config
        row = await database_sync_to_async(rows.load_row)(session_id)
        store = self.store()
        base = row.event_id_reserved
        epoch, created = await store.ensure_session(session_id, base)
        reserved_until = base
        if created:
            reserved_until = await database_sync_to_async(rows.reserve_after_new_epoch)(
                session_id, base, config.id_reservation_block
            )
            logger.info(
                "epoch_started session=%s epoch=%s first_id=%d reserved_until=%d",
                session_id,
                epoch,
                base + 1,
                reserved_until,
            )
        live = RedisLiveSession(
            session_id=session_id,
            title=row.title,
            owner_id=row.owner_id,
            bus=EventBus(ring_size=1, name=session_id),  # replaced by the mirror below
            reserved_until=reserved_until,
            created_at=row.created_at.isoformat(),
            ring_size=row.ring_size or config.ring_size,
            stream_compression=row.stream_compression,
        )
        self._note_issued(session_id, row.last_event_id)
        await self._build_mirror(live, store)
        return live

    async def _build_mirror(self, live: RedisLiveSession, store: RedisStore) -> None:
        """Fill a new bus from the shared ring (one MULTI read) and start reading after it."""
        known_last_id = self._known_last_id(live)  # before the read, as in _ready_mirror
        window = await store.window(live.session_id)
        if window.head.closed:
            raise SessionClosedError(live.session_id, live.owner_id)
        if window.head.epoch is not None and window.head.last_event_id < known_last_id:
            await self._restart_epoch(live, window.head.epoch, "stale_data", known_last_id)
            window = await store.window(live.session_id)
        elif self._diverged(live.session_id, window):
            await self._restart_epoch(
                live, window.head.epoch, "diverged_data", known_last_id, diverged=True
            )
            window = await store.window(live.session_id)
        if window.head.epoch is None:  # lost between ensure and read: let the caller retry
            raise BackendUnavailableError("Redis lost the session's data while loading it")
        entries = window.entries
        first_id = window.first_id
        start = _contiguous_tail(entries)
        if entries and start > 0:
            logger.warning(
                "stream_hole session=%s kept_from=%d dropped_entries=%d",
                live.session_id,
                entries[start][0],
                start,
            )
            entries, first_id = entries[start:], entries[start][0]
        bus = self.new_bus(
            live.session_id, live.ring_size, start_id=first_id, epoch=window.head.epoch
        )
        for event_id, body in entries:
            bus.ingest(_frame_from_entry(event_id, body))
        self._note_issued(live.session_id, bus.last_event_id)
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

    async def closed_snapshot(
        self, row: AgentSession, *, limit: int | None = None, before: int | None = None
    ) -> SnapshotPage | None:
        """The closed session's stream while Redis keeps it (it expires ``CLOSED_HISTORY_S``
        after the close) and the row's close is within ``CLOSED_HISTORY_S``."""
        if not history_kept(row.closed_at, self.config.closed_history_s):
            return None
        window = await self.store().window(row.id)
        entries = window.entries[_contiguous_tail(window.entries) :]
        if not window.head.closed or not entries:
            return None
        ring_size = min(MAX_EVENT_RING_SIZE, max(row.ring_size or 0, len(entries)))
        bus = self.new_bus(row.id, ring_size, start_id=entries[0][0], epoch=window.head.epoch)
        frames = (_frame_from_entry(event_id, body) for event_id, body in entries)
        closed = closed_bus(bus, frames)
        created_at = row.created_at.isoformat()
        live = LiveSession(row.id, row.title, row.owner_id, closed, 0, created_at, ring_size)
        return self._snapshot_page(live, limit, before, 0)

    def _drop_mirror(self, live: LiveSession, reason: str) -> None:
        """Forget a mirror that no longer matches Redis; its subscribers reconnect."""
        if self.registry.get(live.session_id) is live:
            self.registry.pop(live.session_id)
            if self._store is not None:  # (a newer mirror of the session keeps its reading)
                self._store.unwatch(live.session_id)
        count = live.bus.disconnect_all(reason)
        _advanced(live).set()  # a subscriber waiting for this mirror to catch up retries now
        logger.warning(
            "mirror_dropped session=%s reason=%s subscribers=%d", live.session_id, reason, count
        )

    # -- publish and close -------------------------------------------------------------

    async def publish(
        self,
        live: LiveSession,
        event: Mapping[str, Any],
        *,
        idempotency: IdempotencyKey | None = None,
    ) -> Published | None:
        """Publish through Redis: the id is assigned there and the event reaches every
        process's subscribers through their readers. None for a closed session or an
        event that cannot be serialized (it must cross processes as JSON). The
        idempotency key is checked and stored by the same script that assigns the id.

        Raises:
            IdempotencyKeyReusedError: the key is known with another request digest.
            BackendUnavailableError: Redis cannot be reached (the caller answers 503).
        """
        fields = envelope_fields(event, None)
        body = encode_envelope(fields) if fields is not None else None
        if body is None:
            if fields is not None:
                logger.warning(
                    "publish_refused session=%s reason=not_serializable", live.session_id
                )
            return None
        published = await self._append(live, body, close=False, idempotency=idempotency)
        if published is None:
            return None
        if not published.replayed:
            self.keep_reservation_ahead(live, published.id)
        return published

    async def _append(
        self,
        live: LiveSession,
        body: bytes,
        *,
        close: bool,
        idempotency: IdempotencyKey | None = None,
    ) -> Published | None:
        """Append ``body`` to the session's stream; None if the session is closed."""
        store = self.store()
        config = self.config
        for _ in range(3):
            known_last_id = self._known_last_id(live)
            outcome = await store.publish(
                live.session_id,
                body,
                max(live.ring_size, STREAM_COUNT_FLOOR),
                close=close,
                max_bytes=config.ring_max_bytes,
                max_age_s=config.ring_max_age_s,
                known_last_id=known_last_id,
                idempotency=idempotency,
                idempotency_ttl_s=config.idempotency_ttl_s,
                idempotency_max_keys=config.idempotency_max_keys,
                closed_ttl_ms=int(config.closed_history_s * 1000),
            )
            if outcome.status == "replay":
                assert outcome.remembered is not None
                assert idempotency is not None
                return _replayed(outcome.remembered, idempotency)
            if outcome.status == "ok":
                assert outcome.event_id is not None
                assert outcome.epoch is not None
                self._note_issued(live.session_id, outcome.event_id)
                self._note_fingerprint(live.session_id, outcome.event_id, outcome.epoch, body)
                self.hooks.event_published(live.session_id)  # here, not in every mirror
                return Published(outcome.event_id, outcome.epoch)
            if outcome.status == "closed":
                return None
            if outcome.status == "stale":  # Redis went back in time: never reissue an id
                await self._restart_epoch(live, outcome.epoch, "stale_data", known_last_id)
            # Redis lost (or we replaced) the session's data. Reload: a new epoch above
            # the mark.
            self._drop_mirror(live, "epoch_reset")
            live = await self.get_live_session(live.session_id)
        raise BackendUnavailableError("Redis keeps losing the session's data")

    async def recall(self, session_id: str, idempotency: IdempotencyKey) -> Published | None:
        remembered = await self.store().recall(
            session_id, idempotency.key, ttl_s=self.config.idempotency_ttl_s
        )
        return _replayed(remembered, idempotency) if remembered is not None else None

    async def close_session(
        self,
        session_id: str,
        *,
        reason: str,
        closed_by: str = "",
        idempotency: IdempotencyKey | None = None,
    ) -> Published:
        """One script publishes ``session_closed`` and marks the session closed in Redis;
        every process's reader closes its mirror after delivering it."""
        live = await self.get_live_session(session_id)
        body = encode_envelope(envelope_fields(session_closed_event(reason, closed_by), None) or {})
        assert body is not None
        published = await self._append(live, body, close=True, idempotency=idempotency)
        if published is None:
            raise SessionClosedError(session_id, live.owner_id)
        if published.replayed:  # (a key records a close only once it closed: not reached)
            return published
        last_id = published.id
        await self.save_progress(
            live, status=AgentSession.Status.CLOSED, closed_at=timezone.now(), last_id=last_id
        )
        logger.info("session_closed session=%s last_event_id=%d", session_id, last_id)
        self.hooks.session_closed(session_id, last_id)
        return published

    # -- subscribe: wait for the mirror to reach Redis's head ---------------------------

    async def caught_up(self, live: LiveSession) -> LiveSession:
        """Waits, at most ``CATCH_UP_TIMEOUT_S``, until this process's mirror has the last
        id Redis had issued (a mirror of an epoch Redis no longer has is rebuilt: that is
        how a client learns of lost data, ``epoch_reset``), whatever the cursor: a snapshot
        taken after a publish returned, on any process, includes that event, and a
        subscriber's replay and live meet without loss or repeat, a live-only stream
        starts after the events published before it, and a cursor of another epoch
        replays them all (EB-13).

        Raises:
            SessionClosedError: Redis says the session is closed.
            BackendUnavailableError: Redis unreachable, or the mirror did not catch up.
        """
        return await self._ready_mirror(live)

    async def snapshot(
        self, live: LiveSession, *, limit: int | None = None, before: int | None = None
    ) -> SnapshotPage:
        live = await self.caught_up(live)
        subscribers = await self.subscriber_count(live)
        return self._snapshot_page(live, limit, before, subscribers)

    async def _ready_mirror(self, live: LiveSession) -> LiveSession:
        store = self.store()
        # After an outage nothing live would arrive until the reader is back: wake it, wait.
        await store.wait_available(READER_RECOVERY_WAIT_S)
        for _ in range(3):
            # Taken before the read: an id issued (or mirrored) while it is in flight is
            # not Redis going back in time.
            known_last_id = self._known_last_id(live)
            head = await store.head(live.session_id)
            if head.closed:
                raise SessionClosedError(live.session_id, live.owner_id)
            if head.epoch is not None and head.last_event_id < known_last_id:
                # Redis went back in time
                await self._restart_epoch(live, head.epoch, "stale_data", known_last_id)
                head = await store.head(live.session_id)
            if head.epoch != live.bus.epoch or self.registry.get(live.session_id) is not live:
                if self.registry.get(live.session_id) is live:
                    self._drop_mirror(live, "epoch_reset")
                live = await self.get_live_session(live.session_id)
                continue
            # The mirror first reaches every id Redis had issued, whatever the cursor: a
            # live-only subscriber (no cursor) then starts after the events published
            # before it, and a cursor from another epoch replays them all (EB-13).
            if live.bus.last_event_id < head.last_event_id:
                await self._caught_up(live, head.last_event_id)
                if self.registry.get(live.session_id) is not live:
                    continue
            return live
        raise BackendUnavailableError("the session's data kept changing in Redis while attaching")

    async def _caught_up(self, live: LiveSession, event_id: int) -> None:
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        while live.bus.last_event_id < event_id and self.registry.get(live.session_id) is live:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BackendUnavailableError(
                    f"this process's reader did not reach event {event_id} in time"
                )
            try:
                async with asyncio.timeout(remaining):
                    await _advanced(live).wait()
            except TimeoutError:
                continue

    # -- the reader's callbacks (on the loop) ------------------------------------------

    def _on_entries(self, session_id: str, entries: list[tuple[int, bytes]]) -> None:
        """Feed a session's new stream entries to its mirror, in order."""
        live = self.registry.get(session_id)
        if live is None or live.bus.closed:
            if self._store is not None:
                self._store.unwatch(session_id)
            return
        bus = live.bus
        taken: tuple[int, bytes] | None = None
        for event_id, body in entries:
            if event_id < bus.next_id:
                continue  # already taken (the window read and the reader overlapped)
            frame = _frame_from_entry(event_id, body)
            if not bus.ingest(frame):
                # A gap: the reader fell more than a ring behind, or Redis started a new
                # epoch (lost data) whose ids continue above ours. The mirror is stale.
                self._drop_mirror(live, "mirror_gap")
                break
            self._note_issued(session_id, event_id)
            taken = (event_id, body)
            if frame.type == "session_closed":
                bus.close()
                taken = None
                self._known_last.pop(session_id, None)  # closed for good: the row answers
                self._fingerprints.pop(session_id, None)
                if self._store is not None:
                    self._store.unwatch(session_id)
                break
        if taken is not None and bus.epoch is not None:  # one digest per batch, not per event
            self._note_fingerprint(session_id, taken[0], bus.epoch, taken[1])
        assert isinstance(live, RedisLiveSession)
        advanced, live._advanced = live._advanced, asyncio.Event()
        advanced.set()

    def _on_outage(self, error: BaseException, session_ids: Collection[str] | None) -> None:
        """Redis went away (``session_ids`` None), or one cluster node with those sessions:
        end their open streams with ``stream_error``, forget their mirrors."""
        frame = _backend_error_frame()
        ended = 0
        lost = list(self.registry.values())
        if session_ids is not None:
            lost = [live for live in lost if live.session_id in session_ids]
        for live in lost:
            ended += live.bus.disconnect_all("backend_unavailable", frame=frame)
            if self._store is not None:
                self._store.unwatch(live.session_id)
            _advanced(live).set()  # wake any waiting subscriber: it fails, its client retries
            self.registry.pop(live.session_id)
        logger.error("streams_ended reason=backend_unavailable subscribers=%d", ended)
        if self._store is not None and self._store.attached_to is not None:
            self._last_attached = self._store.attached_to
        self.hooks.backend_link("lost")

    def _on_recovery(self) -> None:
        """Redis is back: mirrors are rebuilt as clients come back; announce the link (a
        ``failover`` when the reader now reads from another server than before)."""
        store = self._store
        attached = store.attached_to if store is not None else None
        self.hooks.backend_link("reattached")
        if attached is not None and self._last_attached not in (None, attached):
            logger.warning("backend_failover from=%s to=%s", self._last_attached, attached)
            self.hooks.backend_link("failover")
        self._last_attached = attached

    def _report_and_sweep(self) -> dict[str, Any]:
        """The reporter's periodic call: unload idle mirrors, then report."""
        self.unload_idle_mirrors(time.monotonic())
        return self._make_report()

    def unload_idle_mirrors(self, now: float) -> int:
        """Forget mirrors without a subscriber for ``MIRROR_IDLE_UNLOAD_S``; return how many."""
        unloaded = 0
        for live in self.registry.values():
            assert isinstance(live, RedisLiveSession)
            if live.bus.subscriber_count:
                live._idle_since = None
            elif live._idle_since is None:
                live._idle_since = now
            elif now - live._idle_since >= MIRROR_IDLE_UNLOAD_S and live._renewal is None:
                self.registry.pop(live.session_id)
                if self._store is not None:
                    self._store.unwatch(live.session_id)
                live._advanced.set()
                # Its counters leave this process's report: keep them on the row.
                self.spawn(self.save_progress(live))
                unloaded += 1
        if unloaded:
            logger.info("mirrors_unloaded count=%d reason=idle", unloaded)
        return unloaded


def _replayed(remembered: Remembered, idempotency: IdempotencyKey) -> Published:
    """The first result of a key, as a replayed publish; raises if the request differs."""
    if remembered.digest != idempotency.digest:
        raise IdempotencyKeyReusedError(idempotency.key)
    return Published(remembered.id, remembered.epoch, replayed=True)


def _digest(body: bytes) -> bytes:
    """A 16-byte digest of an event's stored bytes (what :meth:`RedisBackend._diverged`
    compares)."""
    return hashlib.blake2b(body, digest_size=16).digest()


def _advanced(live: LiveSession) -> asyncio.Event:
    assert isinstance(live, RedisLiveSession)
    return live._advanced
