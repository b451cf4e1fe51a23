"""Writer idle timeout through the route: a socket that takes nothing is evicted."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from qwenweb.asgi import application
from sessions.auth import issue_token
from sessions.backends import get_backend
from tests.integration.conftest import http_scope, publish

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def test_stream_whose_socket_takes_nothing_is_evicted_writer_idle_timeout(
    make_session, qwenweb_settings
):
    qwenweb_settings(WRITER_IDLE_TIMEOUT_S=0.2)
    session_id = await make_session()
    scope = http_scope(
        "GET",
        f"/session/{session_id}/events",
        {"authorization": f"Bearer {issue_token(session_id, ['read'])}"},
    )
    sent: list[Any] = []
    streaming = asyncio.Event()
    never = asyncio.Event()

    async def send(message: Any) -> None:
        sent.append(message)
        if len(sent) == 2:  # headers and the retry line went out: the stream is open
            streaming.set()
        if len(sent) >= 3:  # then the socket's buffers are full: nothing more is taken
            await never.wait()

    async def receive() -> Any:
        await never.wait()  # the client never disconnects: it just stops reading

    app = asyncio.create_task(application(scope, receive, send))
    async with asyncio.timeout(5):
        await streaming.wait()
        assert (await publish(session_id, {"type": "t", "data": 1})).status == 200
        await app  # the route gives up on the socket and returns
    stats = get_backend().registry.get(session_id).bus.stats()  # type: ignore[union-attr]
    assert dict(stats.evictions) == {"writer_idle_timeout": 1}
    assert stats.subscriber_count == 0
