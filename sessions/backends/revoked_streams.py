"""Revoked and expired tokens end open streams: what a revocation is, and the sweep.

A stream attached with a bearer token or a login session carries, in its subscription's
details, who it is for (``auth``, ``userId``) and the token's versions (``userVersion``,
``sessionVersion``; docs/protocol.md, "Revocation"). Two paths end the streams a
revocation makes invalid, each with one ``stream_error`` frame, code ``token_revoked``
(so the client fetches a new token and resumes with its cursor):

- **the news**: :meth:`Backend.revoke` with a :class:`Revocation` (made where the version
  was bumped: the admin, a signal, ``manage.py revoke_tokens``), here and, for a
  multi-process backend, relayed to every process;
- **the sweep** (:class:`RevocationSweep`): while this process has credentialed
  subscribers, every ``SWEEP_INTERVAL_S`` it reads the current versions of their users and
  sessions (two queries, whatever the number of streams) and ends the stale ones. It
  catches what no message told this process (a revocation made in another process with
  the memory backend, a lost pub/sub message, a direct database change).

Concurrency: on the server's event loop (EB-11); the sweep's queries run in a worker
thread, one call per tick; the sweep task exists only while there is something to watch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final

from channels.db import database_sync_to_async

from sessions import token_versions
from sessions.bus import Frame, Subscription, synthetic_frame

__all__ = [
    "SWEEP_INTERVAL_S",
    "Revocation",
    "RevocationSweep",
    "expired_frame",
    "revoked_frame",
    "stream_details",
]

logger = logging.getLogger("qwenweb.backend")

SWEEP_INTERVAL_S: Final = 0.5
"""How often open credentialed streams are checked against the database (seconds)."""


def revoked_frame() -> Frame:
    """The terminal frame of a stream whose token was revoked (or whose user is gone)."""
    return synthetic_frame(
        "stream_error",
        {"error": "the token was revoked; get a new one", "code": "token_revoked"},
    )


def expired_frame() -> Frame:
    """The terminal frame of a stream whose token expired (sent at the expiry time)."""
    return synthetic_frame(
        "stream_error",
        {"error": "the token expired; get a new one", "code": "token_expired"},
    )


def stream_details(
    *,
    auth: str,
    user_id: int | None,
    user_version: int | None,
    session_version: int | None,
    via_staff: bool = False,
) -> dict[str, Any]:
    """The credential part of a subscription's details (the transport adds who/where).

    ``via_staff``: a login stream on a session the user does not own, which only the
    user's staff rights allow; it ends when those rights go (the sweep, a demotion).
    """
    details = {
        "auth": auth,
        "userId": user_id,
        "userVersion": user_version,
        "sessionVersion": session_version,
    }
    if via_staff:
        details["viaStaff"] = True
    return details


@dataclass(frozen=True, slots=True)
class Revocation:
    """What became invalid.

    ``user_id`` with ``user_version``: the user's tokens below that version; with
    ``user_inactive``: everything of the user (tokens and login streams: deactivated or
    deleted); with ``user_demoted``: also the user's login streams opened on staff rights
    (``viaStaff``). ``session_id`` with ``session_version``: the session's tokens below it.
    """

    user_id: int | None = None
    user_version: int | None = None
    session_id: str | None = None
    session_version: int | None = None
    user_inactive: bool = False
    user_demoted: bool = False

    def ends(self, session_id: str, details: Mapping[str, Any] | None) -> bool:
        """Whether a subscription of ``session_id`` with ``details`` must end. Never raises."""
        if not details or "auth" not in details:
            return False
        uid = details.get("userId")
        if self.user_id is not None and uid == self.user_id:
            if self.user_inactive or (self.user_demoted and details.get("viaStaff")):
                return True
            version = details.get("userVersion")
            if (
                details["auth"] == "token"
                and version is not None
                and self.user_version is not None
                and version < self.user_version
            ):
                return True
        return (
            self.session_id == session_id
            and self.session_version is not None
            and details["auth"] == "token"
            and (details.get("sessionVersion") or 0) < self.session_version
        )

    def message(self) -> dict[str, Any]:
        """This revocation as a control message body (``{"op": "revoke", ...}``)."""
        return {"op": "revoke", **asdict(self)}

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> Revocation | None:
        """The revocation of a control message, or None if it is malformed. Never raises."""
        user_id, user_version = message.get("user_id"), message.get("user_version")
        session_id, session_version = message.get("session_id"), message.get("session_version")
        if not all(v is None or isinstance(v, int) for v in (user_id, user_version)):
            return None
        if not (session_id is None or isinstance(session_id, str)):
            return None
        if not (session_version is None or isinstance(session_version, int)):
            return None
        return cls(
            user_id,
            user_version,
            session_id,
            session_version,
            bool(message.get("user_inactive")),
            bool(message.get("user_demoted")),
        )


Subscriptions = Callable[[], Iterable[tuple[str, Subscription]]]
Disconnect = Callable[[str, Subscription, str, Frame], object]


class RevocationSweep:
    """Checks this process's credentialed subscribers against the database, periodically.

    Args:
        subscriptions: yields ``(session id, subscription)`` for every local subscriber.
        disconnect: ends one subscription with a terminal frame (the backend's).

    :meth:`wake` starts the task if it is not running; it ends by itself when no
    credentialed subscriber is left, and :meth:`stop` cancels it.
    """

    def __init__(self, subscriptions: Subscriptions, disconnect: Disconnect) -> None:
        self._subscriptions = subscriptions
        self._disconnect = disconnect
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """Make sure the sweep runs (on the loop). Never raises, never awaits."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        """Cancel the sweep (idempotent)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def _watched(self) -> list[tuple[str, Subscription, Mapping[str, Any]]]:
        watched = []
        for session_id, subscription in self._subscriptions():
            details = subscription.details
            if details and details.get("auth") in ("token", "login"):
                watched.append((session_id, subscription, details))
        return watched

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            watched = self._watched()
            if not watched:
                return
            try:
                await self.sweep_once(watched)
            except Exception as exc:  # a database that is down: try again next tick
                logger.warning("revocation_sweep_failed error=%s", f"{type(exc).__name__}: {exc}")

    async def sweep_once(
        self, watched: list[tuple[str, Subscription, Mapping[str, Any]]] | None = None
    ) -> int:
        """Read the versions once and end every stale subscription; return how many."""
        watched = self._watched() if watched is None else watched
        if not watched:
            return 0
        user_ids = {int(d["userId"]) for _, _, d in watched if d.get("userId") is not None}
        session_ids = {sid for sid, _, d in watched if d["auth"] == "token"}
        read_since = token_versions.generation()
        users, sessions = await database_sync_to_async(_read)(user_ids, session_ids)
        token_versions.remember(users, sessions, read_since=read_since)
        ended = 0
        for session_id, subscription, details in watched:
            uid = details.get("userId")
            user = users.get(int(uid)) if uid is not None else None
            if details["auth"] == "login":  # gone, inactive, or no longer staff if it took that
                stale = user is not None and (
                    not user.active or (bool(details.get("viaStaff")) and not user.staff)
                )
            else:
                stale = token_versions.is_stale(
                    user_id=uid,
                    user_version=details.get("userVersion"),
                    session_version=details.get("sessionVersion"),
                    user=user,
                    session_token_version=sessions.get(session_id),
                )
            if stale:
                self._disconnect(session_id, subscription, "token_revoked", revoked_frame())
                ended += 1
        if ended:
            logger.info("streams_ended reason=token_revoked source=sweep count=%d", ended)
        return ended


def _read(
    user_ids: set[int], session_ids: set[str]
) -> tuple[dict[int, token_versions.UserState], dict[str, int | None]]:
    return token_versions.read_users_sync(user_ids), token_versions.read_sessions_sync(session_ids)
