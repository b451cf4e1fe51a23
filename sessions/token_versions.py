"""Token versions: what makes a signed token revoked, read from the database with a cache.

A token issued by this version of the server carries the user's id (``uid``), the user's
token version (``uv``) and the session's token version (``sv``) (``sessions.auth``). It is
*revoked* when its user no longer exists or is inactive, when the user's version
(:class:`~sessions.models.UserTokenVersion`, 0 without a row) is above ``uv``, or when
the session's ``token_version`` is above ``sv``. A token issued before (no ``uid``, no
``sv``) counts as session version 0 and has no user to check: it works until it expires,
or until its session's tokens are revoked (docs/protocol.md, "Revocation").

Reads go through a per-process cache whose entries are at most ``VERSION_CACHE_S`` (1 s)
old, so a revocation made in another process is seen within a second even when no
message reaches this one; a revocation made here (:mod:`sessions.token_revocation`) and a
message from another process (``Backend.revoke``) drop the entries at once.

Concurrency: the cache is a dict touched from the event loop and from worker threads;
each operation is one dict assignment or lookup (atomic under the GIL), and a stale read
is bounded by the cache age. The ``*_sync`` functions run in a worker thread
(``database_sync_to_async``), one or two queries each. Concurrent misses of one entry on
the event loop share one read (64 tabs opening at once cost one query, not 64); an
invalidation during that read starts a new one for later callers and keeps the old
read's answer out of the cache.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import F

from sessions.models import AgentSession, UserTokenVersion

__all__ = [
    "VERSION_CACHE_S",
    "UserState",
    "bump_session_version",
    "bump_user_version",
    "clear_cache",
    "current_versions",
    "generation",
    "invalidate",
    "is_stale",
    "read_sessions_sync",
    "read_users_sync",
    "remember",
    "versions_for_new_token_sync",
]

VERSION_CACHE_S: Final = 1.0
"""How old a cached version may be (seconds): the bound on a revocation's staleness."""
_QUERY_CHUNK: Final = 500


@dataclass(frozen=True, slots=True)
class UserState:
    """A user as token checks see it: ``active`` (False also when the user is gone), the
    token ``version``, and ``staff`` (the rights a login stream on another user's session
    was opened with)."""

    active: bool
    version: int
    staff: bool = False


_GONE: Final = UserState(False, 0)
# ("u", user id) -> (read at, UserState); ("s", session id) -> (read at, version or None)
_cache: dict[tuple[str, Any], tuple[float, Any]] = {}
# The same keys -> the read under way on the event loop, shared by concurrent misses.
_reading: dict[tuple[str, Any], asyncio.Task[Any]] = {}
# Invalidations so far: a read that began before one must not cache what it read.
# (``next`` on a count is atomic: invalidations may come from several threads.)
_invalidations = itertools.count(1)
_generation = 0


def generation() -> int:
    """How many invalidations this process has seen: read it before a read whose answer
    goes to :func:`remember`."""
    return _generation


def clear_cache() -> None:
    """Forget every cached version (tests; never needed in a server)."""
    global _generation
    _generation = next(_invalidations)
    _cache.clear()
    _reading.clear()


def invalidate(*, user_id: int | None = None, session_id: str | None = None) -> None:
    """Drop the cached entries of ``user_id`` and ``session_id`` (a revocation). Never raises."""
    global _generation
    _generation = next(_invalidations)
    if user_id is not None:
        _cache.pop(("u", user_id), None)
        _reading.pop(("u", user_id), None)
    if session_id is not None:
        _cache.pop(("s", session_id), None)
        _reading.pop(("s", session_id), None)


def remember(
    users: dict[int, UserState], sessions: dict[str, int | None], *, read_since: int
) -> None:
    """Cache freshly read versions (the backend's sweep reads them anyway).

    ``read_since`` is :func:`generation` from before the read began: when a revocation
    invalidated anything since, nothing is cached (the read may predate it, and a new
    stream's check would take the old version for up to the cache's age).
    """
    if read_since != _generation:
        return
    now = time.monotonic()
    for user_id, state in users.items():
        _cache[("u", user_id)] = (now, state)
    for session_id, version in sessions.items():
        _cache[("s", session_id)] = (now, version)


def read_users_sync(user_ids: Iterable[int]) -> dict[int, UserState]:
    """``{user id: UserState}`` for every id (missing users: inactive, version 0)."""
    wanted = sorted(set(user_ids))
    found: dict[int, UserState] = dict.fromkeys(wanted, _GONE)
    for start in range(0, len(wanted), _QUERY_CHUNK):
        rows = (
            get_user_model()
            .objects.filter(pk__in=wanted[start : start + _QUERY_CHUNK])
            .values_list("pk", "is_active", "qwenweb_token_version__version", "is_staff")
        )
        for pk, active, version, staff in rows:
            found[int(pk)] = UserState(bool(active), int(version or 0), bool(staff))
    return found


def read_sessions_sync(session_ids: Iterable[str]) -> dict[str, int | None]:
    """``{session id: token_version}`` for every id (None: no such session)."""
    wanted = sorted(set(session_ids))
    found: dict[str, int | None] = dict.fromkeys(wanted)
    for start in range(0, len(wanted), _QUERY_CHUNK):
        rows = AgentSession.objects.filter(pk__in=wanted[start : start + _QUERY_CHUNK])
        for pk, version in rows.values_list("pk", "token_version"):
            found[str(pk)] = int(version)
    return found


def _fresh(key: tuple[str, Any], now: float) -> tuple[bool, Any]:
    entry = _cache.get(key)
    if entry is None or now - entry[0] > VERSION_CACHE_S:
        return False, None
    return True, entry[1]


async def current_versions(
    user_id: int | None, session_id: str | None
) -> tuple[UserState | None, int | None]:
    """Return ``(the user's state, the session's token version)`` at most 1 s old.

    None for what was not asked (``user_id`` / ``session_id`` None) and for a session
    that does not exist. At most one query per kind on a cache miss. Raises
    ``django.db.DatabaseError`` when the database fails.
    """
    now = time.monotonic()
    user: UserState | None = None
    version: int | None = None
    if user_id is not None:
        hit, user = _fresh(("u", user_id), now)
        if not hit:
            uid = user_id
            user = await _read_once(("u", uid), lambda: read_users_sync([uid])[uid])
    if session_id is not None:
        hit, version = _fresh(("s", session_id), now)
        if not hit:
            sid = session_id
            version = await _read_once(("s", sid), lambda: read_sessions_sync([sid])[sid])
    return user, version


async def _read_once(key: tuple[str, Any], read: Callable[[], Any]) -> Any:
    """``read()`` in a worker thread, shared by every caller that misses ``key`` meanwhile.

    The answer is cached when the read ends, unless :func:`invalidate` dropped the key
    during it (a revocation: the answer may be older than it). A caller cancelled while
    waiting leaves the read running for the others. Raises what ``read`` raises.
    """
    loop = asyncio.get_running_loop()
    task = _reading.get(key)
    if task is None or task.get_loop() is not loop:
        task = loop.create_task(database_sync_to_async(read)())
        _reading[key] = task
        task.add_done_callback(lambda done: _read_done(key, done))
    return await asyncio.shield(task)


def _read_done(key: tuple[str, Any], task: asyncio.Task[Any]) -> None:
    if _reading.get(key) is not task:
        if not task.cancelled():
            task.exception()  # (retrieved: its callers, if any, got it)
        return
    del _reading[key]
    if task.cancelled():
        return
    if task.exception() is None:
        _cache[key] = (time.monotonic(), task.result())


def is_stale(
    *,
    user_id: int | None,
    user_version: int | None,
    session_version: int | None,
    user: UserState | None,
    session_token_version: int | None,
) -> bool:
    """Whether a token (its ``uid``, ``uv``, ``sv``) is revoked by the current state.

    ``user``: the state of ``user_id`` (None when the token names no user);
    ``session_token_version``: the session's current version (None: not checked, or no
    such session, whose 404 comes later). A token without ``sv`` counts as version 0.
    Never raises.
    """
    if (
        user_id is not None
        and user is not None
        and (not user.active or (user_version or 0) < user.version)
    ):
        return True
    return session_token_version is not None and (session_version or 0) < session_token_version


def bump_user_version(user_id: int) -> int:
    """Raise the user's token version by one (in the caller's transaction); return it."""
    with transaction.atomic():
        UserTokenVersion.objects.get_or_create(user_id=user_id)
        UserTokenVersion.objects.filter(pk=user_id).update(version=F("version") + 1)
        return int(UserTokenVersion.objects.values_list("version", flat=True).get(pk=user_id))


def bump_session_version(session_id: str) -> int | None:
    """Raise the session's token version by one; return it (None: no such session)."""
    with transaction.atomic():
        updated = AgentSession.objects.filter(pk=session_id).update(
            token_version=F("token_version") + 1
        )
        if not updated:
            return None
        return int(AgentSession.objects.values_list("token_version", flat=True).get(pk=session_id))


def versions_for_new_token_sync(user_id: int | None, session_id: str | None) -> tuple[int, int]:
    """``(user version, session version)`` to put in a token being issued now (uncached:
    a token issued right after a revocation must carry the new version)."""
    user_version = 0
    if user_id is not None:
        row = UserTokenVersion.objects.filter(pk=user_id).values_list("version", flat=True)
        user_version = int(row.first() or 0)
    session_version = 0
    if session_id is not None:
        row2 = AgentSession.objects.filter(pk=session_id).values_list("token_version", flat=True)
        session_version = int(row2.first() or 0)
    return user_version, session_version
