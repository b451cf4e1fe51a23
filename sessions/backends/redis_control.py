"""The Redis backend's cross-process side: the control channel and the operators' view.

:class:`RedisControlled` is the part of :class:`sessions.backends.redis.RedisBackend`
that talks to the *other* processes: control messages on the prefixed pub/sub channel
(disconnect a session's subscribers, relay dashboard activity) and the operators'
figures summed over every live process's report. It needs only the backend's
:meth:`store` and local state; mirrors, publish and subscribe are in ``redis.py``.

Concurrency: every method runs on the server's event loop (EB-11); the control listener
hands each message to :meth:`RedisControlled._on_control` on that loop.
"""

from __future__ import annotations

import asyncio
import logging
from abc import abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sessions.backends.base import Backend, Disconnected, LiveSession
from sessions.backends.errors import BackendUnavailableError
from sessions.backends.redis_blocking import read_reports_blocking, send_control_blocking
from sessions.backends.redis_clients import RedisTarget
from sessions.backends.redis_store import RedisStore
from sessions.backends.reports import make_report, merge_reports
from sessions.backends.revoked_streams import Revocation
from sessions.bus import BusStats
from sessions.conf import QwenwebConfig

__all__ = ["RedisControlled", "redis_target"]

logger = logging.getLogger("qwenweb.runtime")


def redis_target(config: QwenwebConfig) -> RedisTarget:
    """Where the settings put Redis: ``REDIS_URL``, its Sentinels, or a Cluster's seeds."""
    return RedisTarget(
        config.redis_url,
        config.redis_sentinels,
        config.redis_sentinel_service,
        config.redis_sentinel_password,
        config.redis_cluster,
    )


class RedisControlled(Backend):
    """Control messages and cluster-wide operator figures over one Redis (abstract)."""

    @abstractmethod
    def store(self) -> RedisStore:
        """This loop's store (started on first use)."""

    # -- control messages (on the loop) ------------------------------------------------

    def _on_control(self, message: Mapping[str, Any]) -> None:
        """A control message from another process (pub/sub; never one of this process's).

        ``disconnect``: end the session's subscribers here (all, or the one named by
        ``subscriber``, noting ``by``, who asked). ``activity``: dashboard activity items
        that happened there; they are announced to this process's listeners only, never
        relayed on. ``revoke``:
        a :class:`Revocation` made there (:meth:`Backend.revoke_local` here).
        """
        op = message.get("op")
        if op == "revoke":
            revocation = Revocation.from_message(message)
            if revocation is None:
                logger.warning("control_message_ignored reason=bad_revocation")
            else:
                self.revoke_local(revocation)
            return
        if op == "disconnect":
            session_id = str(message.get("session"))
            reason = str(message.get("reason") or "operator")
            subscriber = message.get("subscriber")
            if subscriber is not None:
                by = str(message.get("by") or "")
                self.disconnect_local_subscriber(session_id, str(subscriber), reason, by=by)
                return
            live = self.registry.get(session_id)
            if live is not None:
                live.bus.disconnect_all(reason)
        elif op == "activity":
            items = message.get("items")
            if isinstance(items, list):
                self.hooks.activity_received([item for item in items if isinstance(item, dict)])

    def _make_report(self) -> dict[str, Any]:
        """This process's live figures and subscribers (written to Redis with a TTL)."""
        subscribers = {
            live.session_id: self.local_subscribers(live.session_id)
            for live in self.registry.values()
        }
        return make_report(self.live_stats(), subscribers)

    # -- operators ---------------------------------------------------------------------

    async def other_reports(self) -> list[dict[str, Any]]:
        store = self.store()
        return [r for r in await store.reports() if r.get("process") != store.process_uid]

    def cluster_stats(
        self, others: Sequence[Mapping[str, Any]], session_ids: Iterable[str] | None = None
    ) -> dict[str, BusStats]:
        if not others:
            return self.live_stats(session_ids)
        return merge_reports([*others, self._make_report()], session_ids)

    def operator_stats_blocking(
        self, session_ids: Iterable[str] | None = None, *, timeout_s: float = 2.0
    ) -> dict[str, BusStats]:
        """The sums over every live process: on the server loop when this process has one,
        else read with a short-lived synchronous client, so a process that has loaded
        nothing still shows the cluster's numbers and starts nothing."""
        if self.loop.get() is None:
            reports = read_reports_blocking(
                redis_target(self.config), self.config.redis_key_prefix, timeout_s=timeout_s / 3
            )
            return merge_reports(reports, session_ids)

        async def bounded() -> dict[str, BusStats]:
            try:
                async with asyncio.timeout(timeout_s):
                    return await self.operator_stats(session_ids)
            except TimeoutError:
                raise BackendUnavailableError(
                    f"Redis did not answer within {timeout_s} s"
                ) from None

        return self.loop.run(bounded, timeout_s=timeout_s + 1.0)

    async def subscriber_count(self, live: LiveSession) -> int:
        stats = (await self.operator_stats([live.session_id])).get(live.session_id)
        return stats.subscriber_count if stats is not None else 0

    async def list_subscribers(self, session_id: str) -> list[dict[str, Any]]:
        rows_here = self.local_subscribers(session_id)
        for report in await self.other_reports():
            rows_here.extend((report.get("subscribers") or {}).get(session_id) or [])
        return sorted(rows_here, key=lambda row: row.get("since") or 0)

    async def disconnect_subscriber(
        self, session_id: str, subscriber_id: str, *, reason: str, by: str = ""
    ) -> bool:
        """Here if the subscriber is one of this process's; else one control message
        ``{"op": "disconnect", "session", "subscriber", "reason", "by"}`` that the process
        holding it acts on (True: some other process heard it)."""
        if self.disconnect_local_subscriber(session_id, subscriber_id, reason, by=by):
            return True
        message = {
            "op": "disconnect",
            "session": session_id,
            "subscriber": subscriber_id,
            "reason": reason,
            "by": by,
        }
        return await self.store().send_control(message) > 0

    async def disconnect_everywhere(self, session_id: str, *, reason: str) -> Disconnected:
        live = self.registry.get(session_id)
        here = live.bus.disconnect_all(reason) if live is not None else 0
        message = {"op": "disconnect", "session": session_id, "reason": reason}
        try:
            told = await self.store().send_control(message)
        except BackendUnavailableError as exc:
            logger.error("disconnect_not_relayed session=%s error=%s", session_id, exc)
            return Disconnected(here, None)
        return Disconnected(here, told)

    async def relay_activity(self, items: Sequence[Mapping[str, Any]]) -> None:
        """One control message ``{"op": "activity", "items": [...]}`` on the prefixed
        control channel. Fails at once while this process's reader has lost Redis."""
        store = self.store()
        if not store.available:
            raise BackendUnavailableError("Redis is unavailable (this process's reader lost it)")
        await store.send_control({"op": "activity", "items": list(items)})

    # -- revocation --------------------------------------------------------------------

    async def revoke(self, revocation: Revocation) -> int:
        """Here, then one ``{"op": "revoke", ...}`` control message to every other process."""
        here = self.revoke_local(revocation)
        try:
            await self.store().send_control(revocation.message())
        except BackendUnavailableError as exc:
            logger.error("revocation_not_relayed error=%s (the sweeps still see it)", exc)
        return here

    def relay_revocation_blocking(self, revocation: Revocation) -> None:
        config = self.config
        try:
            told = send_control_blocking(
                redis_target(config), config.redis_key_prefix, revocation.message(), timeout_s=2.0
            )
        except BackendUnavailableError as exc:
            logger.error("revocation_not_relayed error=%s (the sweeps still see it)", exc)
            return
        logger.info("revocation_relayed processes=%d", told)
