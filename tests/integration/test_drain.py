"""The graceful drain (sessions.ops.lifecycle.drain) seen from the stream route."""

from __future__ import annotations

import asyncio
import re

import pytest

from sessions.ops import lifecycle
from sessions.process_state import process_state
from sessions.transport.admission import DRAIN_RETRY_MS
from tests.integration.conftest import publish

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def retry_values(body: bytes) -> list[int]:
    return [int(value) for value in re.findall(rb"^retry: (\d+)$", body, re.MULTILINE)]


async def test_drain_ends_every_stream_with_server_draining_and_a_jittered_retry(
    make_session, stream_of
):
    # EB-16 (stream_error + retry, the stream ends), EB-18; SC-11 keeps that retry
    sid = await make_session()
    streams = [await stream_of(sid) for _ in range(4)]
    await publish(sid, {"type": "note"})
    async with asyncio.timeout(5):
        ended = await lifecycle.drain(0.2)
    assert ended == 4
    low, high = DRAIN_RETRY_MS
    for stream in streams:
        await stream.read_to_end()
        assert stream.types == ["note", "stream_error"]  # what was queued first
        data = stream.frames[-1]["data"]
        assert data["code"] == "server_draining"
        first, last = retry_values(stream.body)
        assert first == 3000
        assert last == data["retryAfterMs"]
        assert low <= last <= high


async def test_drain_spreads_the_ends_over_the_window(make_session, stream_of):
    sid = await make_session()
    streams = [await stream_of(sid) for _ in range(5)]
    ends: list[float] = []
    loop = asyncio.get_running_loop()

    async def watch(stream):
        await stream.read_to_end()
        ends.append(loop.time())

    watchers = [asyncio.ensure_future(watch(stream)) for stream in streams]
    start = loop.time()
    async with asyncio.timeout(5):
        await lifecycle.drain(0.5)
        await asyncio.gather(*watchers)
    # one end in each fifth of the window: the first within 0.1 s, the last after 0.4 s
    ends.sort()
    assert ends[-1] - start >= 0.4
    assert ends[-1] - ends[0] >= 0.2


async def test_a_new_stream_while_draining_gets_server_draining_and_retry(make_session, stream_of):
    # EB-16 (stream_error + retry, the stream ends), EB-18; SC-11 keeps that retry
    sid = await make_session()
    process_state.draining = True
    stream = await stream_of(sid)
    await stream.read_to_end()
    assert stream.status == 200
    assert stream.types == ["stream_error"]
    data = stream.frames[0]["data"]
    assert data["code"] == "server_draining"
    assert retry_values(stream.body) == [data["retryAfterMs"]]
    assert stream.body.startswith(b"retry: ")  # in the frame's own block, before `event:`


async def test_drain_without_streams_returns_at_once():
    async with asyncio.timeout(1):
        assert await lifecycle.drain(30.0) == 0
    assert process_state.draining
