"""Subscribing (EB-6) and replay from a cursor (EB-7): ``EventBus.subscribe`` and
``sessions.bus.replay``.

Written from the contract (``docs/protocol.md``) as ``tests/unit/bus_support.py`` says.
"""

from __future__ import annotations

import pytest

from sessions.bus import EventBus, SubscriberLimitExceededError, Subscription
from tests.unit.bus_support import drain, ev, label, pub, publish_n, size, take

pytestmark = pytest.mark.asyncio


# -- EB-6: subscribe -------------------------------------------------------------------


async def test_subscribe_registers_synchronously():  # EB-6
    bus = EventBus(3)
    sub = bus.subscribe()
    assert bus.subscriber_count == 1
    frame = pub(bus, ev())
    assert await take(sub, 1) == [frame]


async def test_subscription_is_an_async_context_manager():  # EB-6
    bus = EventBus(3)
    async with bus.subscribe() as sub:
        assert isinstance(sub, Subscription)
        frame = pub(bus, ev())
        assert await take(sub, 1) == [frame]


async def test_subscribe_over_limit_raises_and_registers_nothing():  # EB-6
    bus = EventBus(3, max_subscribers=1)
    publish_n(bus, 3)
    bus.subscribe()
    with pytest.raises(SubscriberLimitExceededError) as info:
        bus.subscribe(last_event_id=0, epoch="other")
    assert info.value.limit == 1
    assert bus.subscriber_count == 1
    stats = bus.stats()
    assert (stats.replayed_frames, dict(stats.resyncs), stats.peak_subscribers) == (0, {}, 1)


async def test_subscribe_on_closed_bus_returns_exhausted_subscription_without_limit_check():
    # EB-6, EB-9
    bus = EventBus(3, max_subscribers=1)
    publish_n(bus, 2)
    bus.subscribe()
    bus.close()
    for sub in (bus.subscribe(), bus.subscribe(), bus.subscribe(last_event_id=0)):
        assert await drain(sub) == []
    assert bus.subscriber_count == 0


# -- EB-7: replay ---------------------------------------------------------------------


async def test_cursor_at_or_after_next_id_is_epoch_reset_and_replays_whole_ring():  # EB-7
    bus = EventBus(3)
    publish_n(bus, 2)
    for cursor in (3, 99):
        frames = await take(bus.subscribe(last_event_id=cursor), 4)
        assert dict(frames[0]) == {
            "v": 1,
            "type": "state_resync_required",
            "data": {"reason": "epoch_reset", "lastDeliveredId": cursor, "earliestAvailableId": 1},
        }
        assert [label(f) for f in frames[1:]] == [1, 2, "replay_complete"]
    assert dict(bus.stats().resyncs) == {"epoch_reset": 2}


async def test_epoch_reset_on_empty_ring_names_next_id_as_earliest():  # EB-7
    bus = EventBus(3, start_id=7)
    frames = await take(bus.subscribe(last_event_id=7), 2)
    assert frames[0]["data"] == {
        "reason": "epoch_reset",
        "lastDeliveredId": 7,
        "earliestAvailableId": 7,
    }
    assert dict(frames[1]) == {"v": 1, "type": "replay_complete", "data": {"replayedCount": 0}}


async def test_epoch_mismatch_is_epoch_reset_with_detail_and_replays_whole_ring():  # EB-7
    bus = EventBus(3)
    publish_n(bus, 5)
    frames = await take(bus.subscribe(last_event_id=4, epoch="an-older-bus"), 5)
    assert frames[0]["data"] == {
        "reason": "epoch_reset",
        "lastDeliveredId": 4,
        "earliestAvailableId": 3,
        "detail": "epoch_mismatch",
    }
    assert [label(f) for f in frames[1:]] == [3, 4, 5, "replay_complete"]
    assert frames[-1]["data"] == {"replayedCount": 3, "lastReplayedEventId": 5}


async def test_matching_epoch_replays_after_cursor_without_resync():  # EB-7
    bus = EventBus(3)
    publish_n(bus, 3)
    sub = bus.subscribe(last_event_id=1, epoch=bus.epoch)
    assert [label(f) for f in await take(sub, 3)] == [2, 3, "replay_complete"]
    assert dict(bus.stats().resyncs) == {}


async def test_cursor_before_ring_start_is_ring_evicted_then_surviving_ring():  # EB-7
    bus = EventBus(3)
    publish_n(bus, 5)  # ring: 3 4 5
    frames = await take(bus.subscribe(last_event_id=1), 5)
    assert dict(frames[0]) == {
        "v": 1,
        "type": "state_resync_required",
        "data": {"reason": "ring_evicted", "lastDeliveredId": 1, "earliestAvailableId": 3},
    }
    assert [label(f) for f in frames[1:]] == [3, 4, 5, "replay_complete"]
    assert dict(bus.stats().resyncs) == {"ring_evicted": 1}


async def test_cursor_just_before_ring_start_is_not_a_gap():  # EB-7
    bus = EventBus(3)
    publish_n(bus, 5)  # ring: 3 4 5
    frames = await take(bus.subscribe(last_event_id=2), 4)
    assert [label(f) for f in frames] == [3, 4, 5, "replay_complete"]
    assert frames[-1]["data"] == {"replayedCount": 3, "lastReplayedEventId": 5}


async def test_empty_ring_with_gap_after_start_id_is_ring_evicted():  # EB-7
    bus = EventBus(3, start_id=10)  # ids up to 9 were issued by an earlier bus
    frames = await take(bus.subscribe(last_event_id=5), 2)
    assert frames[0]["data"] == {
        "reason": "ring_evicted",
        "lastDeliveredId": 5,
        "earliestAvailableId": 10,
    }
    assert frames[1]["data"] == {"replayedCount": 0}


async def test_empty_ring_cursor_at_last_issued_id_is_not_a_gap():  # EB-7
    bus = EventBus(3, start_id=10)
    frames = await take(bus.subscribe(last_event_id=9), 1)
    assert dict(frames[0]) == {"v": 1, "type": "replay_complete", "data": {"replayedCount": 0}}
    assert dict(bus.stats().resyncs) == {}


async def test_cursor_zero_on_new_bus_gets_only_replay_complete():  # EB-7, "Resuming"
    bus = EventBus(3)
    sub = bus.subscribe(last_event_id=0)
    frames = await take(sub, 1)
    assert dict(frames[0]) == {"v": 1, "type": "replay_complete", "data": {"replayedCount": 0}}
    assert sub.statistics().forced_count == 0  # nothing else was queued


async def test_cursor_zero_replays_whole_ring():  # EB-7
    bus = EventBus(3)
    publish_n(bus, 2)
    frames = await take(bus.subscribe(last_event_id=0), 3)
    assert [label(f) for f in frames] == [1, 2, "replay_complete"]
    assert bus.stats().replayed_frames == 2


async def test_cursor_at_last_event_id_replays_nothing():  # EB-7
    bus = EventBus(3)
    publish_n(bus, 2)
    frames = await take(bus.subscribe(last_event_id=2), 1)
    assert frames[0]["data"] == {"replayedCount": 0}


async def test_replay_is_queued_before_subscribe_returns_then_live_frames():  # EB-7
    bus = EventBus(3)
    publish_n(bus, 3)
    sub = bus.subscribe(last_event_id=1)
    assert sub.statistics().forced_count == 3
    publish_n(bus, 1)
    assert [label(f) for f in await take(sub, 4)] == [2, 3, "replay_complete", 4]


async def test_without_cursor_stream_is_live_only():  # EB-7
    bus = EventBus(3)
    publish_n(bus, 3)
    sub = bus.subscribe()
    publish_n(bus, 1)
    assert [label(f) for f in await take(sub, 1)] == [4]
    assert sub.statistics().forced_count == 0
    assert bus.stats().replayed_frames == 0


async def test_resumed_subscriber_is_not_evicted_for_its_replay_backlog():  # EB-7, EB-3
    bus = EventBus(3, max_queued_bytes=size(1))
    publish_n(bus, 5)
    sub = bus.subscribe(last_event_id=0, max_queued=1)  # ring_evicted: 5 forced frames
    publish_n(bus, 1)
    assert bus.subscriber_count == 1
    assert [label(f) for f in await take(sub, 6)][1:] == [3, 4, 5, "replay_complete", 6]


async def test_synthetic_frames_have_no_id_and_carry_v():  # "Frames", EB-4, EB-5, EB-7
    bus = EventBus(3)
    publish_n(bus, 2)
    replay = await take(bus.subscribe(last_event_id=9), 4)
    sub = bus.subscribe(max_queued=1)
    publish_n(bus, 2)
    for frame in [replay[0], replay[-1], *(await drain(sub))[1:]]:
        assert "id" not in frame
        assert frame["v"] == 1
        assert frame.id is None
