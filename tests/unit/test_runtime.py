"""``sessions.runtime.ServerLoop``: adopting a sync view's request loop (asgiref's public API)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from asgiref.sync import sync_to_async

from sessions.hooks import Hooks
from sessions.runtime import ServerLoop


@pytest.mark.asyncio
async def test_a_sync_view_thread_adopts_the_loop_serving_its_request() -> None:
    server_loop = ServerLoop(Hooks())
    async with asyncio.timeout(5):
        # thread_sensitive=False: a worker thread of its own, as a sync view under ASGI.
        adopted = await sync_to_async(server_loop.adopt_request_loop, thread_sensitive=False)()
    assert adopted is asyncio.get_running_loop()
    assert server_loop.get() is adopted


def test_a_thread_outside_any_request_adopts_nothing() -> None:
    server_loop = ServerLoop(Hooks())
    result: list[asyncio.AbstractEventLoop | None] = []
    thread = threading.Thread(target=lambda: result.append(server_loop.adopt_request_loop()))
    thread.start()
    thread.join(5)
    assert result == [None]
    assert server_loop.get() is None


@pytest.mark.asyncio
async def test_the_loop_thread_itself_adopts_nothing() -> None:
    assert ServerLoop(Hooks()).adopt_request_loop() is None
