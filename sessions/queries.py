"""Database reads for async code: one call through ``database_sync_to_async`` each.

Concurrency model
    Django's async ORM (``aget``, ``afirst``, ``request.auser()`` ...) runs each query with
    ``sync_to_async(thread_sensitive=True)`` and leaves the connection it opens there.
    Outside a request's ``ThreadSensitiveContext`` (the stream route, which Channels serves
    in front of Django, and background tasks) that thread is asgiref's one process-wide
    worker, where the connection stays open until something else closes it there; inside
    Django's handler it stays open until the request ends, which for a streaming response
    (``GET /ops/events/``) is the life of the stream. PostgreSQL counts every such
    connection, and refuses to drop a database while one is open.

    These helpers run the query through ``channels.db.database_sync_to_async`` instead,
    which calls ``close_old_connections()`` in the worker thread before and after: with
    ``CONN_MAX_AGE`` 0 (the default, see ``qwenweb.settings``) no connection outlives the
    call. Async code in ``sessions`` uses them, or its own sync function wrapped the same
    way, never the async ORM.
"""

from __future__ import annotations

from channels.db import database_sync_to_async
from django.contrib.auth import get_user
from django.contrib.auth.models import AnonymousUser, User
from django.http import HttpRequest

from sessions.models import AgentSession

__all__ = ["request_user", "session_row"]


async def request_user(request: HttpRequest) -> User | AnonymousUser:
    """Return the user of the request's login session, or ``AnonymousUser``.

    ``request.auser()`` without holding a connection: the session row and the user row are
    read in one worker-thread call. Sets ``request.user`` to the result, so later reads of
    it need no query. Raises ``django.db.DatabaseError`` when the database fails.
    """
    user: User | AnonymousUser = await database_sync_to_async(_request_user_sync)(request)
    return user


def _request_user_sync(request: HttpRequest) -> User | AnonymousUser:
    user = get_user(request)
    request.user = user
    return user


async def session_row(session_id: str) -> AgentSession | None:
    """Return the ``AgentSession`` row of ``session_id`` (normalized), or None if there is none.

    One query in a worker thread. Raises ``django.db.DatabaseError`` when the database fails.
    """
    row: AgentSession | None = await database_sync_to_async(_session_row_sync)(session_id)
    return row


def _session_row_sync(session_id: str) -> AgentSession | None:
    return AgentSession.objects.filter(pk=session_id).first()
