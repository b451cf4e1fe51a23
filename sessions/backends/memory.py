"""The memory backend (the default): one process, the bus assigns ids and holds the ring.

A session's bus starts above every id an earlier process could have issued: its row's
``event_id_reserved`` mark, renewed a block ahead in the background (EB-1, ids never
reissued; a rebuilt bus has a new epoch, so old cursors resync, EB-7). Publishing never
awaits and never raises (EB-2). Everything lives in this process: with several processes
use the Redis backend.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from channels.db import database_sync_to_async
from django.utils import timezone

from sessions.backends import rows
from sessions.backends.base import Backend, LiveSession, Published
from sessions.bus import EventBus, Frame
from sessions.models import AgentSession

__all__ = ["MemoryBackend"]

logger = logging.getLogger("qwenweb.backend")


class MemoryBackend(Backend):
    """Sessions held in this process only (setting ``BACKEND = "memory"``)."""

    name: ClassVar[str] = "memory"

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
        )

    async def publish(self, live: LiveSession, event: Mapping[str, Any]) -> Published | None:
        frame = self.publish_nowait(live, event)
        return None if frame is None or frame.id is None else Published(frame.id, live.bus.epoch)

    def publish_nowait(self, live: LiveSession, event: Mapping[str, Any]) -> Frame | None:
        """Publish ``event`` on the session's bus (EB-2); the frame, or None.

        Never raises and never awaits: the reservation is renewed by a background task
        once half of the current block is used.
        """
        frame = live.bus.publish(event)
        if frame is not None and frame.id is not None:
            self.keep_reservation_ahead(live, frame.id)
        return frame

    async def close_session(self, session_id: str, *, reason: str, closed_by: str = "") -> int:
        live = await self.get_live_session(session_id)
        self.publish_nowait(
            live, {"type": "session_closed", "data": {"reason": reason, "closedBy": closed_by}}
        )
        live.bus.close()
        # The closed bus stays registered until the row says closed: a request arriving in
        # between must see "closed", not reload the still-open row and build a new bus.
        await self.save_progress(live, status=AgentSession.Status.CLOSED, closed_at=timezone.now())
        self.registry.pop(session_id)
        last_id = live.bus.last_event_id
        logger.info("session_closed session=%s last_event_id=%d", session_id, last_id)
        self.hooks.session_closed(session_id, last_id)
        return last_id
