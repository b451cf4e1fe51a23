"""The Redis backend in one process, against the machine's Redis.

These tests select the backend themselves (whatever the run's backend) under a key prefix
of their own, deleted at the end; data loss is simulated by deleting one session's keys,
never by flushing the shared Redis (``tests/e2e/test_redis_faults.py`` flushes a private
one). The route is driven through the ASGI application, as in ``test_stream_*.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from sessions.backends import get_backend
from sessions.backends.redis import MIRROR_IDLE_UNLOAD_S
from sessions.backends.redis_store import RedisStore
from sessions.backends.reports import merge_reports
from sessions.conf import get_config
from tests.integration.conftest import OpenStream, Stream, load, publish, publish_many
from tests.support import backend

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

StreamOf = Callable[..., Awaitable[Stream]]
READER_LAG_S = 0.1
CLOSE_WAIT_S = 2.0


async def _forget_session_in_redis(session_id: str) -> None:
    """Simulate Redis losing one session's data (its meta hash and stream)."""
    store = backend.as_redis().store()
    await store.client.delete(store.meta_key(session_id), store.stream_key(session_id))


async def test_ids_start_at_1_and_reach_a_subscriber_through_the_reader(
    redis_backend: str, make_session: Any, stream_of: StreamOf
) -> None:
    """Ids come from Redis (1, 2, 3 …) and the event reaches the local subscriber via the
    reader task and the mirror, not directly from the publisher."""
    session_id = await make_session()
    stream = await stream_of(session_id)
    assert await publish_many(session_id, 3) == [1, 2, 3]
    await stream.read_until(lambda s: len(s.frames) >= 3)
    assert [f["id"] for f in stream.frames] == [1, 2, 3]
    store = backend.as_redis().store()
    assert await store.client.xlen(store.stream_key(session_id)) == 3
    live = get_backend().registry.get(session_id)
    assert live is not None
    assert stream.headers["x-event-epoch"] == live.bus.epoch


async def test_lost_session_data_starts_a_new_epoch_above_the_reserved_mark(
    redis_backend: str, make_session: Any, stream_of: StreamOf
) -> None:
    """Redis lost the session (EB-7): an old cursor + epoch gets ``epoch_reset``;
    new ids continue above the database's reserved mark, never reusing an old id."""
    session_id = await make_session()
    first = await stream_of(session_id)
    await publish_many(session_id, 5)
    await first.read_until(lambda s: len(s.frames) >= 5)
    old_epoch = first.headers["x-event-epoch"]
    await _forget_session_in_redis(session_id)
    cursor = {"Last-Event-ID": "5", "X-Event-Epoch": old_epoch}
    resumed = await stream_of(session_id, headers=cursor)
    resync = await resumed.read_until_type("state_resync_required")
    assert resync["data"]["reason"] == "epoch_reset"
    assert resync["data"]["detail"] == "epoch_mismatch"
    assert resumed.headers["x-event-epoch"] != old_epoch
    # The old mirror was dropped: its subscriber was told to reconnect.
    ended = await first.read_until_type("stream_error")
    assert ended["data"]["code"] == "server_disconnect"
    response = await publish(session_id, {"type": "after"})
    new_id = response.json()["id"]
    assert new_id > get_config().id_reservation_block  # above every id issued before
    assert response.json()["epoch"] == resumed.headers["x-event-epoch"]
    await resumed.read_until(lambda s: any(f.get("id") == new_id for f in s.frames))


async def test_gap_in_the_stream_drops_the_mirror_and_its_subscribers_reconnect(
    redis_backend: str, make_session: Any, stream_of: StreamOf
) -> None:
    """A mirror that sees an id jump (it fell behind a trimmed ring, or a new epoch) ends
    its subscribers with ``stream_error`` instead of delivering with a hole."""
    session_id = await make_session()
    stream = await stream_of(session_id)
    await publish_many(session_id, 2)
    await stream.read_until(lambda s: len(s.frames) >= 2)
    store = backend.as_redis().store()
    await store.client.hincrby(store.meta_key(session_id), "last", 10)  # ids 3..12 vanish
    await publish(session_id, {"type": "after-gap"})
    ended = await stream.read_until_type("stream_error")
    assert ended["data"] == {
        "error": "disconnected by the server",
        "code": "server_disconnect",
        "reason": "mirror_gap",
    }
    await stream.read_to_end()
    again = await stream_of(session_id, headers={"Last-Event-ID": "2"})
    resync = await again.read_until_type("replay_complete")
    assert again.frames[0]["type"] == "state_resync_required"
    assert resync["data"]["lastReplayedEventId"] == 13


async def test_idle_mirror_is_unloaded_and_reloaded_on_next_use(
    redis_backend: str, make_session: Any, stream_of: StreamOf, open_stream: OpenStream
) -> None:
    """A mirror without subscribers is unloaded after ``MIRROR_IDLE_UNLOAD_S``: the reader
    stops reading its stream; the next stream reloads it from Redis and replays exactly."""
    session_id = await make_session()
    await publish_many(session_id, 4)
    now = 1_000.0
    assert backend.as_redis().unload_idle_mirrors(now) == 0  # idle from now on
    assert backend.as_redis().unload_idle_mirrors(now + MIRROR_IDLE_UNLOAD_S - 1) == 0
    assert backend.as_redis().unload_idle_mirrors(now + MIRROR_IDLE_UNLOAD_S) == 1
    assert get_backend().registry.get(session_id) is None
    stream = await stream_of(session_id, headers={"Last-Event-ID": "1"})
    await stream.read_until_type("replay_complete")
    assert [f.get("id") for f in stream.frames] == [2, 3, 4, None]
    await publish(session_id, {"type": "live"})
    await stream.read_until(lambda s: s.frames[-1].get("id") == 5)


async def test_a_subscribed_mirror_is_never_unloaded(
    redis_backend: str, make_session: Any, stream_of: StreamOf
) -> None:
    session_id = await make_session()
    await stream_of(session_id)
    await publish_many(session_id, 1)
    assert backend.as_redis().unload_idle_mirrors(0.0) == 0
    assert backend.as_redis().unload_idle_mirrors(1e9) == 0
    assert get_backend().registry.get(session_id) is not None


async def test_merge_reports_sums_processes() -> None:
    """Operator figures under Redis: sums over the processes' reports."""

    def figures(subscribers: int, last: int, warnings: int) -> dict[str, Any]:
        return {
            "published": last,
            "slow_client_warnings": warnings,
            "evictions": {"queue_overflow": warnings},
            "resyncs": {},
            "replayed_frames": 0,
            "subscriber_count": subscribers,
            "peak_subscribers": subscribers,
            "ring_length": last,
            "ring_size": 8000,
            "earliest_id": 1,
            "last_event_id": last,
            "epoch": "e",
            "closed": False,
        }

    merged = merge_reports(
        [
            {"sessions": {"s1": figures(2, 10, 1), "s2": figures(1, 3, 0)}},
            {"sessions": {"s1": figures(3, 12, 2)}},
        ]
    )
    assert merged["s1"].subscriber_count == 5
    assert merged["s1"].slow_client_warnings == 3
    assert dict(merged["s1"].evictions) == {"queue_overflow": 3}
    assert merged["s1"].last_event_id == 12
    assert merged["s2"].subscriber_count == 1
    assert merge_reports([], ["s1"]) == {}


async def _roll_back(session_id: str, to_id: int, down_from: int) -> None:
    """Simulate Redis restored from an older snapshot: ids above ``to_id`` forgotten."""
    store = backend.as_redis().store()
    await store.client.hset(store.meta_key(session_id), "last", to_id)
    await store.client.xdel(
        store.stream_key(session_id), *[f"{n}-0" for n in range(to_id + 1, down_from + 1)]
    )


async def test_redis_back_in_time_never_reissues_an_id_on_publish(
    redis_backend: str, make_session: Any, stream_of: StreamOf
) -> None:
    """Redis came back with older data than it gave out (an RDB restore): the next publish
    must not hand out ids 4, 5 again in the same epoch; a new epoch starts above the mark
    and a client at cursor 5 resyncs (EB-7) instead of silently missing events."""
    session_id = await make_session()
    reader = await stream_of(session_id)
    assert await publish_many(session_id, 5) == [1, 2, 3, 4, 5]
    await reader.read_until(lambda s: len(s.frames) >= 5)
    old_epoch = reader.headers["x-event-epoch"]
    await _roll_back(session_id, 3, 5)
    response = await publish(session_id, {"type": "after-restore"})
    assert response.status == 200, response.body
    assert response.json()["id"] > get_config().id_reservation_block
    assert response.json()["epoch"] != old_epoch
    cursor = {"Last-Event-ID": "5", "X-Event-Epoch": old_epoch}
    resumed = await stream_of(session_id, headers=cursor)
    resync = await resumed.read_until_type("state_resync_required")
    assert resync["data"]["reason"] == "epoch_reset"


async def test_redis_back_in_time_is_seen_by_a_subscriber_without_a_publish(
    redis_backend: str, make_session: Any, stream_of: StreamOf
) -> None:
    """The same restore noticed when a client reconnects first (nothing published since):
    this process's mirror had seen id 5, Redis says 3 -> a new epoch, the cursor resyncs."""
    session_id = await make_session()
    reader = await stream_of(session_id)
    await publish_many(session_id, 5)
    await reader.read_until(lambda s: len(s.frames) >= 5)
    old_epoch = reader.headers["x-event-epoch"]
    await _roll_back(session_id, 3, 5)
    cursor = {"Last-Event-ID": "5", "X-Event-Epoch": old_epoch}
    resumed = await stream_of(session_id, headers=cursor)
    resync = await resumed.read_until_type("state_resync_required")
    assert resync["data"]["reason"] == "epoch_reset"
    assert resumed.headers["x-event-epoch"] != old_epoch
    response = await publish(session_id, {"type": "next"})
    assert response.json()["id"] > get_config().id_reservation_block


async def test_ids_issued_while_the_head_is_read_are_not_redis_going_back_in_time(
    redis_backend: str, make_session: Any, stream_of: StreamOf, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish that completes while a subscriber's head read is in flight makes this
    process know an id above that head: not a restore, so no new epoch, no resync."""
    session_id = await make_session()
    await publish_many(session_id, 1)
    store = backend.as_redis().store()
    read_head = store.head

    async def head_then_publish(sid: str) -> Any:
        head = await read_head(sid)
        monkeypatch.setattr(store, "head", read_head)
        assert (await publish(sid, {"type": "during"})).json()["id"] == 2
        return head

    monkeypatch.setattr(store, "head", head_then_publish)
    stream = await stream_of(session_id, headers={"Last-Event-ID": "1"})
    await stream.read_until_type("replay_complete")
    assert [f["type"] for f in stream.frames] == ["during", "replay_complete"]
    assert (await publish(session_id, {"type": "next"})).json()["id"] == 3


async def test_load_after_a_publish_includes_it_even_when_the_reader_is_slow(
    redis_backend: str, make_session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read your writes (docs/protocol.md, GET /session/<id>): the snapshot waits for the
    mirror to reach the last id Redis issued; here the reader hands each entry over 0.1 s
    late (the simulated cause)."""
    shared = backend.as_redis()
    deliver = shared._on_entries
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(
        shared, "_on_entries", lambda *entry: loop.call_later(READER_LAG_S, deliver, *entry)
    )
    session_id = await make_session()
    assert (await publish(session_id, {"type": "mine"})).json()["id"] == 1
    snapshot = (await load(session_id)).json()
    assert (snapshot["lastEventId"], [e["type"] for e in snapshot["events"]]) == (1, ["mine"])


async def test_closing_the_store_ends_even_when_a_read_swallows_the_cancellation(
    redis_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py can swallow a task's cancellation (a reply it had just read comes back
    instead): closing the store must end its reader anyway, never wait forever."""
    entered, swallowed = asyncio.Event(), asyncio.Event()

    async def read_swallowing_one_cancel(*_: Any) -> None:
        entered.set()
        try:
            await asyncio.Event().wait()  # a blocking read
        except asyncio.CancelledError:
            if swallowed.is_set():
                raise
            swallowed.set()  # the read returns as if it had not been cancelled

    monkeypatch.setattr(RedisStore, "_read_once", read_swallowing_one_cancel)
    backend.as_redis().store()
    async with asyncio.timeout(CLOSE_WAIT_S):
        await entered.wait()
    async with asyncio.timeout(CLOSE_WAIT_S):
        await get_backend().aclose()
    assert swallowed.is_set()
