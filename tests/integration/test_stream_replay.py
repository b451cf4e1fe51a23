"""``GET /session/<id>/events`` through the real ASGI application: replay from a cursor
(EB-7, ``sessions/bus/replay.py`` behind the route) and cursors after a restart.

Protocol: ``docs/protocol.md``, "The stream" and "Ids and epochs"; comments name its
sections in quotes.
"""

from __future__ import annotations

import pytest

from sessions.backends import get_backend
from tests.integration.conftest import (
    ids_of,
    load,
    publish,
    publish_many,
)
from tests.support.backend import memory_only, redis_only

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


# -- EB-7 through the route: replay ------------------------------------------------------


async def test_cursor_replays_exactly_the_missed_events_then_goes_live(make_session, stream_of):
    # EB-7
    sid = await make_session()
    await publish_many(sid, 5)
    stream = await stream_of(sid, headers={"last-event-id": "2"})
    complete = await stream.read_until_type("replay_complete")
    assert complete["data"] == {"replayedCount": 3, "lastReplayedEventId": 5}
    await publish(sid, {"type": "live"})
    await stream.read_until_type("live")
    assert stream.types == ["step"] * 3 + ["replay_complete", "live"]
    assert ids_of(stream.frames) == [3, 4, 5, 6]


async def test_cursor_zero_replays_the_whole_ring(make_session, stream_of):
    # EB-7
    sid = await make_session()
    await publish_many(sid, 3)
    stream = await stream_of(sid, headers={"last-event-id": "0"})
    complete = await stream.read_until_type("replay_complete")
    assert ids_of(stream.frames) == [1, 2, 3]
    assert "state_resync_required" not in stream.types
    assert complete["data"] == {"replayedCount": 3, "lastReplayedEventId": 3}


async def test_cursor_zero_on_empty_session_sends_replay_complete_with_zero(
    make_session, stream_of
):
    # EB-7, "Resuming" (cursor 0 on a session with no event yet)
    sid = await make_session()
    stream = await stream_of(sid, headers={"last-event-id": "0"})
    complete = await stream.read_until_type("replay_complete")
    assert stream.types == ["replay_complete"]
    assert complete["data"] == {"replayedCount": 0}


async def test_cursor_at_last_event_replays_nothing(make_session, stream_of):
    # EB-7
    sid = await make_session()
    await publish_many(sid, 3)
    stream = await stream_of(sid, headers={"last-event-id": "3"})
    complete = await stream.read_until_type("replay_complete")
    assert stream.types == ["replay_complete"]
    assert complete["data"] == {"replayedCount": 0}


async def test_cursor_behind_the_ring_gives_ring_evicted_then_the_survivors(
    make_session, stream_of
):
    # EB-7
    sid = await make_session(ring_size=3)
    await publish_many(sid, 6)
    stream = await stream_of(sid, headers={"last-event-id": "1"})
    await stream.read_until_type("replay_complete")
    assert stream.frames[0] == {
        "v": 1,
        "type": "state_resync_required",
        "data": {"reason": "ring_evicted", "lastDeliveredId": 1, "earliestAvailableId": 4},
        "_meta": stream.frames[0]["_meta"],
    }
    assert ids_of(stream.frames) == [4, 5, 6]
    assert stream.types[-1] == "replay_complete"


async def test_cursor_just_before_the_ring_is_not_a_gap(make_session, stream_of):
    # EB-7: N == ring[0].id - 1
    sid = await make_session(ring_size=3)
    await publish_many(sid, 6)
    stream = await stream_of(sid, headers={"last-event-id": "3"})
    await stream.read_until_type("replay_complete")
    assert "state_resync_required" not in stream.types
    assert ids_of(stream.frames) == [4, 5, 6]


async def test_cursor_at_or_above_next_id_gives_epoch_reset_and_whole_ring(make_session, stream_of):
    # EB-7
    sid = await make_session()
    await publish_many(sid, 2)
    stream = await stream_of(sid, headers={"last-event-id": "3"})
    await stream.read_until_type("replay_complete")
    assert stream.frames[0]["data"] == {
        "reason": "epoch_reset",
        "lastDeliveredId": 3,
        "earliestAvailableId": 1,
    }
    assert ids_of(stream.frames) == [1, 2]


# -- "Ids and epochs": a restarted server -------------------------------------------------

RESTART_STARTS_A_NEW_SEQUENCE = memory_only(
    "a restarted process starts a new id sequence; with Redis the sequence outlives the "
    "process (test_old_cursor_after_restart_resumes_exactly_with_redis; lost Redis data: "
    "test_redis_runtime.py)"
)


@RESTART_STARTS_A_NEW_SEQUENCE
async def test_old_cursor_after_restart_gets_resync_not_events_sharing_its_numbers(
    make_session, stream_of
):
    # "Ids and epochs", EB-1 start_id, EB-7
    sid = await make_session()
    await publish_many(sid, 3)
    get_backend().registry.clear()  # a new process: the bus is rebuilt from the row
    stream = await stream_of(sid, headers={"last-event-id": "3"})
    await stream.read_until_type("replay_complete")
    resync = stream.frames[0]
    assert resync["type"] == "state_resync_required"
    assert resync["data"]["reason"] in {"ring_evicted", "epoch_reset"}
    assert ids_of(stream.frames) == []


@RESTART_STARTS_A_NEW_SEQUENCE
async def test_ids_after_restart_continue_above_every_old_id(make_session, stream_of):
    # "Ids and epochs", EB-1 start_id
    sid = await make_session()
    old_ids = await publish_many(sid, 3)
    get_backend().registry.clear()
    stream = await stream_of(sid, headers={"last-event-id": str(old_ids[-1])})
    new_ids = await publish_many(sid, 2)
    await stream.read_until(lambda s: len(ids_of(s.frames)) == 2)
    assert new_ids[0] > old_ids[-1]
    assert new_ids[1] == new_ids[0] + 1
    assert ids_of(stream.frames) == new_ids
    assert stream.types[0] == "state_resync_required"


@RESTART_STARTS_A_NEW_SEQUENCE
async def test_old_cursor_after_restart_and_new_events_replays_only_new_events(
    make_session, stream_of
):
    # "Ids and epochs", EB-7: the new bus's events are replayed, never the old numbers
    sid = await make_session()
    await publish_many(sid, 3)
    get_backend().registry.clear()
    new_ids = await publish_many(sid, 3)
    stream = await stream_of(sid, headers={"last-event-id": "3"})
    await stream.read_until_type("replay_complete")
    assert stream.frames[0]["data"]["reason"] in {"ring_evicted", "epoch_reset"}
    assert ids_of(stream.frames) == new_ids
    assert min(new_ids) > 3


@RESTART_STARTS_A_NEW_SEQUENCE
async def test_old_epoch_after_restart_gives_epoch_mismatch(make_session, stream_of):
    # "Ids and epochs" (the epoch), EB-7
    sid = await make_session()
    await publish_many(sid, 3)
    old_epoch = (await load(sid)).json()["epoch"]
    get_backend().registry.clear()
    await publish_many(sid, 5)
    stream = await stream_of(sid, headers={"last-event-id": "3", "x-event-epoch": old_epoch})
    await stream.read_until_type("replay_complete")
    assert stream.frames[0]["data"]["detail"] == "epoch_mismatch"


@redis_only("the id sequence outlives the process there")
async def test_old_cursor_after_restart_resumes_exactly_with_redis(make_session, stream_of):
    # the Redis backend: ids, epoch and the ring live in Redis, not in the process
    sid = await make_session()
    await publish_many(sid, 3)
    epoch = (await load(sid)).json()["epoch"]
    get_backend().registry.clear()
    await get_backend().aclose()  # a new process: a new store and reader
    new_ids = await publish_many(sid, 2)
    stream = await stream_of(sid, headers={"last-event-id": "3", "x-event-epoch": epoch})
    await stream.read_until_type("replay_complete")
    assert "state_resync_required" not in stream.types
    assert ids_of(stream.frames) == new_ids == [4, 5]


async def test_ids_continue_above_the_renewed_reservation_after_restart(
    make_session, qwenweb_settings
):
    # "Ids and epochs": ids are reserved in blocks and renewed ahead of use
    qwenweb_settings(ID_RESERVATION_BLOCK=1000)  # the smallest block allowed
    sid = await make_session()
    old_ids = await publish_many(sid, 1200)  # past the first block: renewed at 500
    await get_backend().flush_all()  # what a graceful shutdown does
    get_backend().registry.clear()
    (new_id,) = await publish_many(sid, 1)
    assert new_id > old_ids[-1]
