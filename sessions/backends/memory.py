"""The memory backend (``BACKEND = "memory"``): one process, the bus assigns ids and holds
the ring; the durable default (:mod:`sessions.backends.durable`) builds on it.

A session's bus starts above every id an earlier process could have issued: its row's
``event_id_reserved`` mark, renewed a block ahead in the background (EB-1, ids never
reissued; a rebuilt bus has a new epoch, so old cursors resync, EB-7). Publishing never
awaits and never raises (EB-2). Everything lives in this process: with several processes
use the Redis backend.

Idempotency keys live with the live session (:class:`IdempotencyStore`, bounded by
``IDEMPOTENCY_MAX_KEYS`` and ``IDEMPOTENCY_TTL_S``); the check and the publish happen in
one step on the loop, with no await between; all stores count in the process's
:class:`KeyBudget` (``IDEMPOTENCY_MAX_KEYS_TOTAL``). A closed session's keys are kept until
they expire (``IDEMPOTENCY_TTL_S`` after the close at most), so a retried close (or a
publish retried after the close) still answers its first result. All of it is lost when
the process restarts, like the ring.

A closed session's bus is kept ``CLOSED_HISTORY_S`` after the close (its ring still
counted in the process's ring budget), so its snapshot answers the history
(:mod:`sessions.backends.closed_history`); lost at a restart, like the ring.

One process per database: loading a session *holds* its row for this process
(``host:pid:token``, renewed every ``SESSION_HOLD_TTL_S / 3``); another memory-backend
process on the same database refuses that session (503 ``session_held_elsewhere``,
pointing at the Redis backend) until the hold is let go (the session closes or is
unloaded, the process stops) or lapses (its process died). Idle unload (opt-in,
``IDLE_UNLOAD_S``): a bus without subscriber and without publish for that long is dropped
and its hold let go; its next use reloads it with a new epoch above the reserved ids, as
after a restart (docs/protocol.md, "Ring limits").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from channels.db import database_sync_to_async
from django.utils import timezone

from sessions.backends import rows
from sessions.backends.base import (
    Backend,
    LiveSession,
    Published,
    SessionClosedError,
    session_closed_event,
)
from sessions.backends.closed_history import ClosedHistories
from sessions.backends.idempotency import IdempotencyKey, IdempotencyStore, KeyBudget
from sessions.backends.snapshot import SnapshotPage
from sessions.bus import Frame
from sessions.conf import QwenwebConfig
from sessions.hooks import Hooks
from sessions.models import AgentSession

__all__ = ["MemoryBackend"]

logger = logging.getLogger("qwenweb.backend")


class MemoryBackend(Backend):
    """Sessions held in this process only (setting ``BACKEND = "memory"``)."""

    name: ClassVar[str] = "memory"

    def __init__(self, config: QwenwebConfig, hooks: Hooks) -> None:
        super().__init__(config, hooks)
        #: Monotonic seconds of the idempotency keys (tests set their own before loading).
        self.clock: Callable[[], float] = time.monotonic
        #: Every idempotency key of this process (live and closed sessions).
        self.key_budget = KeyBudget(config.idempotency_max_keys_total)
        #: Closed sessions' keys, in closing order: ``session id -> (closed at, store)``.
        self._closed_keys: OrderedDict[str, tuple[float, IdempotencyStore]] = OrderedDict()
        self._housekeeper: asyncio.Task[None] | None = None
        self.closed_histories: ClosedHistories[LiveSession] = ClosedHistories(
            config.closed_history_s
        )

    async def _load(self, session_id: str) -> LiveSession:
        config = self.config
        row, start_id, reserved_until = await database_sync_to_async(rows.load_and_reserve)(
            session_id,
            config.id_reservation_block,
            holder=rows.process_holder(),
            hold_ttl_s=config.session_hold_ttl_s,
        )
        self._start_tasks()
        bus = self.new_bus(session_id, row.ring_size or config.ring_size, start_id=start_id)
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
            ring_size=bus.ring_size,
            stream_compression=row.stream_compression,
            idempotency=IdempotencyStore(
                config.idempotency_max_keys,
                config.idempotency_ttl_s,
                clock=self.clock,
                budget=self.key_budget,
            ),
        )

    async def publish(
        self,
        live: LiveSession,
        event: Mapping[str, Any],
        *,
        idempotency: IdempotencyKey | None = None,
    ) -> Published | None:
        return self._publish_once(await self._current(live), event, idempotency)

    async def caught_up(self, live: LiveSession) -> LiveSession:
        """``live``, or the session's new bus when ``live``'s was unloaded (idle) meanwhile."""
        return await self._current(live)

    async def _current(self, live: LiveSession) -> LiveSession:
        """``live``, or the session's new bus if ``live``'s was unloaded (idle) meanwhile:
        nothing is published into, or read from, a bus nobody else can reach."""
        if self.registry.get(live.session_id) is live or live.bus.closed:
            return live
        return await self.get_live_session(live.session_id)

    def _publish_once(
        self, live: LiveSession, event: Mapping[str, Any], idempotency: IdempotencyKey | None
    ) -> Published | None:
        """The key check, the publish and the key's record in one step (no await)."""
        store = live.idempotency
        if idempotency is not None and store is not None:
            remembered = store.recall(idempotency)  # raises IdempotencyKeyReusedError
            if remembered is not None:
                return Published(remembered.id, remembered.epoch, replayed=True)
        frame = self.publish_nowait(live, event)
        if frame is None or frame.id is None:
            return None
        if idempotency is not None and store is not None:
            store.remember(idempotency, frame.id, live.bus.epoch)
        return Published(frame.id, live.bus.epoch)

    async def recall(self, session_id: str, idempotency: IdempotencyKey) -> Published | None:
        live = self.registry.get(session_id)
        self._drop_expired_closed_keys()
        closed = self._closed_keys.get(session_id)
        store = live.idempotency if live is not None else closed[1] if closed else None
        remembered = store.recall(idempotency) if store is not None else None
        if remembered is None:
            return None
        return Published(remembered.id, remembered.epoch, replayed=True)

    def publish_nowait(self, live: LiveSession, event: Mapping[str, Any]) -> Frame | None:
        """Publish ``event`` on the session's bus (EB-2); the frame, or None.

        Never raises and never awaits: the reservation is renewed by a background task
        once half of the current block is used.
        """
        frame = live.bus.publish(event)
        if frame is not None and frame.id is not None:
            self.keep_reservation_ahead(live, frame.id)
            self.hooks.event_published(live.session_id)
        return frame

    async def close_session(
        self,
        session_id: str,
        *,
        reason: str,
        closed_by: str = "",
        idempotency: IdempotencyKey | None = None,
    ) -> Published:
        live = await self.get_live_session(session_id)
        event = session_closed_event(reason, closed_by)
        published = self._publish_once(live, event, idempotency)
        if published is None:  # (an open bus publishes a server event: not reached)
            raise SessionClosedError(session_id, live.owner_id)
        if published.replayed:  # (a key records a close only once it closed: not reached)
            return published
        await self._after_close(live)
        return published

    def _start_tasks(self) -> None:
        """Start the housekeeping task on this loop if it does not run (on the loop)."""
        if self._housekeeper is None or self._housekeeper.done():
            self._housekeeper = asyncio.get_running_loop().create_task(self._housekeep())

    async def _after_close(self, live: LiveSession) -> None:
        """Close the bus of a session whose ``session_closed`` is published, keep its keys,
        mark its row closed, unregister it and announce :meth:`Hooks.session_closed`."""
        session_id = live.session_id
        live.bus.close()
        if live.idempotency is not None:
            self._drop_expired_closed_keys()
            self._closed_keys[session_id] = (self.clock(), live.idempotency)
        # The closed bus stays registered until the row says closed: a request arriving in
        # between must see "closed", not reload the still-open row and build a new bus.
        await self.save_progress(
            live, status=AgentSession.Status.CLOSED, closed_at=timezone.now(), held_by=""
        )
        self.registry.pop(session_id)
        self.closed_histories.keep(session_id, live)
        last_id = live.bus.last_event_id
        logger.info("session_closed session=%s last_event_id=%d", session_id, last_id)
        self.hooks.session_closed(session_id, last_id)

    def _drop_expired_closed_keys(self) -> None:
        """Drop the stores of sessions closed ``IDEMPOTENCY_TTL_S`` ago or more: every key
        they hold has expired (none is written after the close). O(1) amortized."""
        closed, ttl_s = self._closed_keys, self.config.idempotency_ttl_s
        now = self.clock()
        while closed and now - next(iter(closed.values()))[0] >= ttl_s:
            closed.popitem(last=False)[1][1].clear()

    async def closed_snapshot(
        self, row: AgentSession, *, limit: int | None = None, before: int | None = None
    ) -> SnapshotPage | None:
        """The closed bus kept since its close in this process (``CLOSED_HISTORY_S``)."""
        live = self.closed_histories.get(row.id)
        return None if live is None else self._snapshot_page(live, limit, before, 0)

    # -- holds and idle unload ---------------------------------------------------------

    async def _housekeep(self) -> None:
        """Renew this process's holds and unload idle buses, until :meth:`aclose`."""
        config = self.config
        interval = config.session_hold_ttl_s / 3
        if config.idle_unload_s:
            interval = min(interval, max(0.05, config.idle_unload_s / 4))
        renewed_at = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            self._drop_expired_closed_keys()
            try:
                self.closed_histories.prune()
                if config.idle_unload_s:
                    await self.unload_idle(now)
                if now - renewed_at >= config.session_hold_ttl_s / 3 and len(self.registry):
                    await database_sync_to_async(rows.renew_holds)(
                        rows.process_holder(),
                        config.session_hold_ttl_s,
                        [live.session_id for live in self.registry.values()],
                    )
                    renewed_at = now
            except Exception as exc:  # never dies; a database that is down is logged
                logger.error("housekeeping_failed error=%s", f"{type(exc).__name__}: {exc}")

    async def unload_idle(self, now: float) -> int:
        """Drop buses without subscriber and without publish for ``IDLE_UNLOAD_S`` (0: none)
        as seen at successive calls (``now``: monotonic s); save their counters and let go of
        their holds. Returns how many; one log line when any."""
        idle_s = self.config.idle_unload_s
        unloaded: list[LiveSession] = []
        for live in self.registry.values():
            mark = (live.bus.next_id, live.bus.subscriber_count)
            if live._idle_mark is None or live._idle_mark[:2] != mark or mark[1]:
                live._idle_mark = (*mark, now)
            elif idle_s and now - live._idle_mark[2] >= idle_s and live._renewal is None:
                self.registry.pop(live.session_id)
                unloaded.append(live)
        for live in unloaded:
            await self.save_progress(live)
            if self.registry.get(live.session_id) is None:  # (not reloaded meanwhile)
                await database_sync_to_async(rows.release_holds)(
                    rows.process_holder(), [live.session_id]
                )
        if unloaded:
            logger.info("buses_unloaded count=%d reason=idle idle_s=%g", len(unloaded), idle_s)
        return len(unloaded)

    async def aclose(self) -> None:
        """Stop housekeeping and let go of this process's holds (shutdown, tests)."""
        await super().aclose()
        task, self._housekeeper = self._housekeeper, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        if len(self.registry):
            with contextlib.suppress(Exception):
                await database_sync_to_async(rows.release_holds)(
                    rows.process_holder(), [live.session_id for live in self.registry.values()]
                )
