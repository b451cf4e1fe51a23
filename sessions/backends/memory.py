"""The memory backend (the default): one process, the bus assigns ids and holds the ring.

A session's bus starts above every id an earlier process could have issued: its row's
``event_id_reserved`` mark, renewed a block ahead in the background (EB-1, ids never
reissued; a rebuilt bus has a new epoch, so old cursors resync, EB-7). Publishing never
awaits and never raises (EB-2). Everything lives in this process: with several processes
use the Redis backend.

Idempotency keys live with the live session (:class:`IdempotencyStore`, bounded by
``IDEMPOTENCY_MAX_KEYS`` and ``IDEMPOTENCY_TTL_S``); the check and the publish happen in
one step on the loop, with no await between. A closed session's keys are kept for the
last ``CLOSED_KEY_STORES`` closed sessions, so a retried close (or a publish retried
after the close) still answers its first result. All of it is lost when the process
restarts, like the ring.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, ClassVar, Final

from channels.db import database_sync_to_async
from django.utils import timezone

from sessions.backends import rows
from sessions.backends.base import Backend, LiveSession, Published, SessionClosedError
from sessions.backends.idempotency import IdempotencyKey, IdempotencyStore
from sessions.bus import EventBus, Frame
from sessions.conf import QwenwebConfig
from sessions.hooks import Hooks
from sessions.models import AgentSession

__all__ = ["MemoryBackend"]

logger = logging.getLogger("qwenweb.backend")

CLOSED_KEY_STORES: Final = 1000
"""How many recently closed sessions keep their idempotency keys (the oldest go first)."""


class MemoryBackend(Backend):
    """Sessions held in this process only (setting ``BACKEND = "memory"``)."""

    name: ClassVar[str] = "memory"

    def __init__(self, config: QwenwebConfig, hooks: Hooks) -> None:
        super().__init__(config, hooks)
        self._closed_keys: OrderedDict[str, IdempotencyStore] = OrderedDict()

    async def _load(self, session_id: str) -> LiveSession:
        row, start_id, reserved_until = await database_sync_to_async(rows.load_and_reserve)(
            session_id, self.config.id_reservation_block
        )
        config = self.config
        bus = EventBus(
            ring_size=row.ring_size or config.ring_size,
            max_subscribers=config.max_subscribers,
            max_queued_bytes=config.max_queued_bytes,
            start_id=start_id,
            name=session_id,
        )
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
            idempotency=IdempotencyStore(config.idempotency_max_keys, config.idempotency_ttl_s),
        )

    async def publish(
        self,
        live: LiveSession,
        event: Mapping[str, Any],
        *,
        idempotency: IdempotencyKey | None = None,
    ) -> Published | None:
        return self._publish_once(live, event, idempotency)

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
        store = live.idempotency if live is not None else self._closed_keys.get(session_id)
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
        event = {"type": "session_closed", "data": {"reason": reason, "closedBy": closed_by}}
        published = self._publish_once(live, event, idempotency)
        if published is None:  # (an open bus publishes a server event: not reached)
            raise SessionClosedError(session_id, live.owner_id)
        if published.replayed:  # (a key records a close only once it closed: not reached)
            return published
        live.bus.close()
        if live.idempotency is not None:
            self._closed_keys[session_id] = live.idempotency
            while len(self._closed_keys) > CLOSED_KEY_STORES:
                self._closed_keys.popitem(last=False)
        # The closed bus stays registered until the row says closed: a request arriving in
        # between must see "closed", not reload the still-open row and build a new bus.
        await self.save_progress(live, status=AgentSession.Status.CLOSED, closed_at=timezone.now())
        self.registry.pop(session_id)
        last_id = live.bus.last_event_id
        logger.info("session_closed session=%s last_event_id=%d", session_id, last_id)
        self.hooks.session_closed(session_id, last_id)
        return published
