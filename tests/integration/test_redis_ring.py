"""The Redis stream trimmed by count, bytes and age in the publish script (issue 17).

docs/protocol.md, "Ring limits": the script keeps a byte count in the meta hash; a stream
written before it existed (no ``bytes``, entries without ``t``) keeps working. On the
machine's Redis under a private key prefix.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from sessions.bus.ring import FRAME_OVERHEAD_BYTES
from tests.integration.conftest import Stream, publish
from tests.support import backend

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def _publish_blobs(session_id: str, count: int, size: int) -> list[int]:
    ids = []
    for _ in range(count):
        response = await publish(session_id, {"type": "blob", "data": "x" * size})
        assert response.status == 200, response.body
        ids.append(response.json()["id"])
    return ids


async def test_stream_is_trimmed_by_bytes_and_an_old_cursor_resyncs(
    redis_backend: str, make_session: Any, qwenweb_settings: Any, stream_of: Any
) -> None:
    qwenweb_settings(RING_MAX_BYTES=4 * (1100 + FRAME_OVERHEAD_BYTES))
    sid = await make_session()
    ids = await _publish_blobs(sid, 10, 1000)
    store = backend.as_redis().store()
    client: Any = store.client
    entries = await client.xrange(store.stream_key(sid))
    assert [int(e[0].split(b"-")[0]) for e in entries] == ids[-4:]
    held = int(await client.hget(store.meta_key(sid), "bytes"))
    assert held == sum(len(e[1][b"e"]) + FRAME_OVERHEAD_BYTES for e in entries)
    stream: Stream = await stream_of(sid, headers={"last-event-id": "1"})
    resync = await stream.read_until_type("state_resync_required")
    assert resync["data"]["reason"] == "ring_evicted"
    assert resync["data"]["earliestAvailableId"] == ids[-4]


async def test_stream_entries_older_than_the_age_limit_leave(
    redis_backend: str, make_session: Any, qwenweb_settings: Any
) -> None:
    qwenweb_settings(RING_MAX_AGE_S=60.0)
    sid = await make_session()
    [first] = await _publish_blobs(sid, 1, 10)
    store = backend.as_redis().store()
    client: Any = store.client
    key = store.stream_key(sid)
    # Make the first entry two minutes old, as if written then.
    old_ms = int(time.time() * 1000) - 120_000
    body = (await client.xrange(key))[0][1][b"e"]
    await client.delete(key)
    await client.xadd(key, {"e": body, "t": old_ms}, id=f"{first}-0")
    [second] = await _publish_blobs(sid, 1, 10)
    entries = await client.xrange(key)
    assert [int(e[0].split(b"-")[0]) for e in entries] == [second]


async def test_a_stream_written_before_byte_counts_keeps_working(
    redis_backend: str, make_session: Any, qwenweb_settings: Any
) -> None:
    """A rolling upgrade: the meta hash has no ``bytes`` and entries have no ``t`` (the
    old script's); the new script starts from Redis's estimate and trims by bytes."""
    qwenweb_settings(RING_MAX_BYTES=64 * 1024)
    sid = await make_session()
    await _publish_blobs(sid, 1, 10)  # the session's meta and epoch in Redis
    store = backend.as_redis().store()
    client: Any = store.client
    key, meta = store.stream_key(sid), store.meta_key(sid)
    last = int(await client.hget(meta, "last"))
    for event_id in range(last + 1, last + 11):  # ten old-style 10 KiB entries
        body = b'{"v":1,"type":"old","data":"' + b"y" * 10_000 + b'"}'
        await client.xadd(key, {"e": body}, id=f"{event_id}-0")
    await client.hset(meta, "last", last + 10)
    await client.hdel(meta, "bytes")
    backend.as_redis().registry.clear()  # a process that has not loaded it yet
    ids = await _publish_blobs(sid, 5, 10_000)
    assert ids == list(range(last + 11, last + 16))
    entries = await client.xrange(key)
    kept = [int(e[0].split(b"-")[0]) for e in entries]
    assert kept == list(range(kept[0], last + 16))  # contiguous, newest kept
    held = int(await client.hget(meta, "bytes"))
    assert held <= 64 * 1024
    assert sum(len(e[1][b"e"]) for e in entries) <= 64 * 1024
    assert len(entries) < 16
