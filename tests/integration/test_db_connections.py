"""No database connection stays open while a stream is open.

Django's async ORM leaves the connection it opens in an asgiref thread: the process-wide
one outside a request, the request's own inside Django's handler, where a streaming
response keeps it for its whole life. The application reads through
``database_sync_to_async`` instead (``sessions.queries``), which closes it after each call.
These tests open streams through the real ASGI application and, while they are open, look
for connections used outside the test's own thread and not closed since: in Django's
connection objects (every backend) and, on PostgreSQL, in ``pg_stat_activity`` too.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from tests.integration.conftest import WAIT_S, login_cookie, publish_many

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

_POLL_S = 0.02
"""Between two looks at ``pg_stat_activity``: a closed connection's server process exits
a moment after its client closed it, and there is nothing to wait on for that."""


@dataclass
class ConnectionWatch:
    """What :func:`connection_watch` sees: ``used`` maps each Django connection used during
    the test outside the test's thread, and not closed since, to its thread's name; ``own``
    is the test thread's connection (pytest-django's, set up outside the loop)."""

    used: dict[int, str]
    own: BaseDatabaseWrapper

    async def assert_none_held(self) -> None:
        """Fail if a connection used elsewhere is open: in Django, then in PostgreSQL."""
        assert self.used == {}, f"connections left open in threads {self.used}"
        assert await self.stray_backends() == []

    async def stray_backends(self) -> list[tuple[int, str, str]]:
        """PostgreSQL: ``(pid, state, last query)`` of the test database's other connections.

        "Other" is neither :attr:`own` nor this probe. Waits at most ``WAIT_S`` for the
        server processes of closed connections to exit; [] on other backends.
        """
        if self.own.vendor != "postgresql":
            return []
        import psycopg

        own_pid = self.own.connection.info.backend_pid if self.own.connection is not None else 0
        settings = self.own.settings_dict
        params = {key.lower(): settings[key] for key in ("HOST", "PORT", "USER", "PASSWORD")}
        query = (
            "SELECT pid, state, query FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid() AND pid <> %s ORDER BY pid"
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        async with await psycopg.AsyncConnection.connect(
            dbname="postgres", autocommit=True, **{k: v for k, v in params.items() if v}
        ) as probe:
            while True:
                cursor = await probe.execute(query, (settings["NAME"], own_pid))
                rows = [
                    (pid, state or "", text or "") for pid, state, text in await cursor.fetchall()
                ]
                if not rows or loop.time() >= deadline:
                    return rows
                await asyncio.sleep(_POLL_S)


@pytest.fixture
def connection_watch(monkeypatch: pytest.MonkeyPatch) -> ConnectionWatch:
    """Track the Django connections the test uses outside its own thread (every backend).

    A connection counts from its first query on until ``close()``, even where the backend
    keeps it open (SQLite's in-memory test database). A sync fixture: ``own`` is the
    thread's sync connection, which async code of that thread does not see.
    """
    watch = ConnectionWatch(used={}, own=connections["default"])
    wrapper_class = type(watch.own)
    ensure_connection, close = wrapper_class.ensure_connection, wrapper_class.close
    test_thread = threading.current_thread()

    def tracked_ensure_connection(self: Any) -> None:
        ensure_connection(self)
        if threading.current_thread() is not test_thread:
            watch.used[id(self)] = threading.current_thread().name

    def tracked_close(self: Any) -> None:
        watch.used.pop(id(self), None)
        close(self)

    monkeypatch.setattr(wrapper_class, "ensure_connection", tracked_ensure_connection)
    monkeypatch.setattr(wrapper_class, "close", tracked_close)
    return watch


async def test_token_stream_holds_no_connection_while_open(
    make_session, stream_of, connection_watch
):
    """The stream's checks read the session row; then no connection is held."""
    sid = await make_session()
    stream = await stream_of(sid)
    await publish_many(sid, 2)
    await stream.read_until(lambda s: len(s.events) == 2)
    await connection_watch.assert_none_held()
    assert not stream.done


async def test_login_stream_holds_no_connection_while_open(
    make_session, make_user, open_stream, connection_watch
):
    """The login session and the user are read; then no connection is held."""
    owner = await make_user("owner")
    sid = await make_session(owner=owner)
    cookie = await login_cookie(owner)
    stream = await open_stream(f"/session/{sid}/events", {"cookie": cookie})
    assert stream.status == 200
    await publish_many(sid, 1)
    await stream.read_until(lambda s: len(s.events) == 1)
    await connection_watch.assert_none_held()


async def test_operator_feed_holds_no_connection_while_open(
    make_user, open_stream, connection_watch
):
    """Django's handler would keep what the view opened until the stream ends."""
    cookie = await login_cookie(await make_user("root", is_staff=True))
    stream = await open_stream("/ops/events/", {"cookie": cookie})
    assert stream.status == 200
    await stream.read_until(lambda s: "stream-open" in s.types)
    await connection_watch.assert_none_held()
