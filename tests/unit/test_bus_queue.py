"""``sessions.bus.queue.Subscription``, the bounded per-subscriber queue: caps (EB-3),
``slow_client_warning`` (EB-4), eviction (EB-5), abort (EB-8), cancellation safety, its
cursor and end reason, the log lines that name it, ``next_frame``.

Written from the contract (``docs/protocol.md``) as ``tests/unit/bus_support.py`` says.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from sessions.bus import EventBus, Subscription
from tests.unit.bus_support import assert_one_line, drain, ev, label, pub, publish_n, size, take

pytestmark = pytest.mark.asyncio


# -- EB-3: the bounded queue ----------------------------------------------------------


async def test_publish_to_waiting_consumer_hands_frame_over_without_byte_sizing():  # EB-3
    bus = EventBus(3, max_queued_bytes=10)  # every frame is bigger than 10 bytes
    sub = bus.subscribe(max_queued=2)
    waiting = asyncio.create_task(anext(sub))
    await asyncio.sleep(0)  # one step: the task starts and blocks in __anext__
    first = bus.publish(ev())
    bus.publish(ev())  # an oversized frame into an empty queue: accepted
    assert bus.subscriber_count == 1
    async with asyncio.timeout(1):
        assert await waiting is first


async def test_publish_when_queue_full_evicts_subscriber():  # EB-3, EB-5
    bus = EventBus(3)
    sub = bus.subscribe(max_queued=2)
    publish_n(bus, 3)
    assert bus.subscriber_count == 0
    assert [label(f) for f in await drain(sub)] == [
        1,
        2,
        "slow_client_warning",
        "client_evicted",
    ]


async def test_oversized_frame_into_empty_queue_is_accepted_and_next_evicts():  # EB-3, EB-5
    bus = EventBus(3, max_queued_bytes=10)
    sub = bus.subscribe(max_queued=2)
    bus.publish(ev())
    assert bus.subscriber_count == 1
    bus.publish(ev("yy"))
    assert bus.subscriber_count == 0
    frames = await drain(sub)
    assert [label(f) for f in frames] == [1, "slow_client_warning", "client_evicted"]
    expected: dict[str, Any] = dict(
        reason="queue_bytes_overflow", droppedAfter=2, queueSize=1, maxQueued=2
    )
    expected |= dict(queuedBytes=size(1), maxQueuedBytes=10, eventBytes=size(2, "yy"))
    assert frames[-1]["data"] == expected


async def test_frames_filling_byte_cap_exactly_are_accepted_and_one_more_evicts():  # EB-3
    bus = EventBus(3, max_queued_bytes=2 * size(1))
    sub = bus.subscribe(max_queued=4)
    publish_n(bus, 2)
    assert bus.subscriber_count == 1
    assert sub.statistics().live_bytes == 2 * size(1)
    bus.publish(ev())
    assert (await drain(sub))[-1]["data"]["reason"] == "queue_bytes_overflow"


async def test_frame_cap_is_checked_before_byte_cap():  # EB-3
    bus = EventBus(3, max_queued_bytes=10)
    sub = bus.subscribe(max_queued=1)
    publish_n(bus, 2)  # the second frame breaks both caps
    assert (await drain(sub))[-1]["data"]["reason"] == "queue_overflow"


async def test_consumer_taking_live_frames_decrements_counts():  # EB-3
    bus = EventBus(3)
    sub = bus.subscribe(max_queued=2)
    publish_n(bus, 2)
    await take(sub, 2)
    assert (sub.statistics().live_count, sub.statistics().live_bytes) == (0, 0)
    publish_n(bus, 1)
    assert bus.subscriber_count == 1


async def test_forced_frames_bypass_caps_and_are_not_counted():  # EB-3, EB-7
    bus = EventBus(3, max_queued_bytes=10)
    publish_n(bus, 3)
    sub = bus.subscribe(last_event_id=0, max_queued=1)  # 3 replayed + replay_complete
    assert (sub.statistics().live_count, sub.statistics().live_bytes) == (0, 0)
    bus.publish(ev())  # one live frame: fits, although 4 forced frames are queued
    assert bus.subscriber_count == 1
    assert [label(f) for f in await take(sub, 5)] == [1, 2, 3, "replay_complete", 4]


async def test_each_queued_item_keeps_its_own_live_or_forced_tag():  # EB-3
    bus = EventBus(3)
    sub = bus.subscribe(max_queued=4)
    publish_n(bus, 4)  # queue: 1 2 3 warning 4
    assert [label(f) for f in await take(sub, 4)] == [1, 2, 3, "slow_client_warning"]
    assert sub.statistics().live_count == 1
    publish_n(bus, 3)  # 4 live frames: at the cap, not over it
    assert bus.subscriber_count == 1


# -- EB-4: slow_client_warning --------------------------------------------------------


async def test_warning_at_75_percent_of_frames_has_exact_payload(bus_log):  # EB-4
    bus = EventBus(3, max_queued_bytes=1000)
    sub = bus.subscribe(max_queued=4)
    publish_n(bus, 2)
    assert bus_log == []
    publish_n(bus, 1)
    assert_one_line(bus_log)
    data: dict[str, Any] = dict(queueSize=3, maxQueued=4, lastEventId=3, queuedBytes=3 * size(1))
    data |= dict(maxQueuedBytes=1000, threshold="frames")
    warning = (await take(sub, 4))[-1]
    assert dict(warning) == {"v": 1, "type": "slow_client_warning", "data": data}


async def test_warning_threshold_bytes():  # EB-4
    bus = EventBus(3, max_queued_bytes=size(1) + 1)
    sub = bus.subscribe(max_queued=4)
    publish_n(bus, 1)
    warning = (await take(sub, 2))[-1]
    assert warning["type"] == "slow_client_warning"
    assert (warning["data"]["threshold"], warning["data"]["queueSize"]) == ("bytes", 1)
    assert warning["data"]["queuedBytes"] == size(1)


def data_with_size_divisible_by_3() -> str:
    return next("x" * k for k in range(1, 4) if size(1, "x" * k) % 3 == 0)


async def test_warning_at_exactly_75_percent_of_bytes():  # EB-4
    data = data_with_size_divisible_by_3()
    bus = EventBus(3, max_queued_bytes=size(1, data) * 4 // 3)  # 75 % == one frame
    sub = bus.subscribe(max_queued=4)
    bus.publish(ev(data))
    warning = (await take(sub, 2))[-1]
    assert warning["data"]["threshold"] == "bytes"


async def test_warning_rearms_at_exactly_37_5_percent_of_bytes():  # EB-4
    data = data_with_size_divisible_by_3()
    bus = EventBus(3, max_queued_bytes=size(1, data) * 8 // 3)  # 37.5 % == one frame
    sub = bus.subscribe(max_queued=100)
    for _ in range(2):
        bus.publish(ev(data))  # 75 %: warns
    await take(sub, 3)
    for _ in range(2):
        bus.publish(ev(data))  # 37.5 %: re-armed; then 75 %: warns again
    assert bus.stats().slow_client_warnings == 2


async def test_warning_threshold_frames_and_bytes():  # EB-4
    bus = EventBus(3, max_queued_bytes=2 * size(1))
    sub = bus.subscribe(max_queued=2)
    publish_n(bus, 2)
    assert [label(f) for f in await take(sub, 3)] == [1, 2, "slow_client_warning"]
    assert bus.stats().slow_client_warnings == 1
    publish_n(bus, 1)
    assert (await take(sub, 1))[0]["id"] == 3  # still warned: no second warning


async def test_warning_carries_the_id_just_published():  # EB-4
    bus = EventBus(3, start_id=40)
    sub = bus.subscribe(max_queued=2)
    publish_n(bus, 2)
    assert (await take(sub, 3))[-1]["data"]["lastEventId"] == 41


async def test_warning_is_sent_once_per_episode():  # EB-4
    bus = EventBus(3)
    sub = bus.subscribe(max_queued=4)
    publish_n(bus, 3)
    await take(sub, 1)  # 2 live left
    publish_n(bus, 1)  # 3 live again, still the same episode
    assert [label(f) for f in await take(sub, 4)] == [2, 3, "slow_client_warning", 4]
    assert bus.stats().slow_client_warnings == 1


async def test_warning_rearms_only_when_bytes_also_fall_to_37_5_percent():  # EB-4
    medium = "y" * 450  # a frame between 37.5 % and 75 % of the byte cap
    bus = EventBus(3, max_queued_bytes=1000)
    assert 375 < size(4, medium) < 750
    assert size(4, medium) + 2 * size(5) <= 1000
    sub = bus.subscribe(max_queued=4)
    publish_n(bus, 3)
    await take(sub, 4)  # 1 2 3 warning: the queue is empty again
    bus.publish(ev(medium))  # 1 frame (<= 37.5 %) but bytes above 37.5 %: still armed off
    publish_n(bus, 2)  # 3 frames: would warn if re-armed
    assert [label(f) for f in await take(sub, 3)] == [4, 5, 6]
    assert bus.stats().slow_client_warnings == 1


async def test_warning_rearms_when_both_fall_and_warns_again_next_episode():  # EB-4
    bus = EventBus(3)
    sub = bus.subscribe(max_queued=4)
    publish_n(bus, 3)
    await take(sub, 4)
    publish_n(bus, 3)  # 1 frame after the push re-arms; 3 frames warn again
    frames = await take(sub, 4)
    assert [label(f) for f in frames] == [4, 5, 6, "slow_client_warning"]
    assert frames[-1]["data"]["lastEventId"] == 6
    assert bus.stats().slow_client_warnings == 2


async def test_warning_rearms_at_exactly_37_5_percent_of_frames():  # EB-4
    bus = EventBus(3)
    sub = bus.subscribe(max_queued=8)  # warn at 6, re-arm at <= 3
    publish_n(bus, 6)
    await take(sub, 4)  # 2 live left
    publish_n(bus, 1)  # 3 live: re-armed
    publish_n(bus, 3)  # 6 live: warns again
    assert bus.stats().slow_client_warnings == 2


async def test_warning_does_not_rearm_above_37_5_percent_of_frames():  # EB-4
    bus = EventBus(3)
    sub = bus.subscribe(max_queued=8)  # warn at 6, re-arm at <= 3
    publish_n(bus, 6)
    await take(sub, 3)  # 3 live left
    publish_n(bus, 1)  # 4 live: not re-armed
    publish_n(bus, 2)  # 6 live: same episode
    assert bus.stats().slow_client_warnings == 1


async def test_warning_mark_between_two_frame_counts_is_not_rounded_down():  # EB-4
    bus = EventBus(3)
    sub = bus.subscribe(max_queued=5)  # warns at 3.75 frames (the 4th), re-arms at <= 1.875
    publish_n(bus, 3)
    assert bus.stats().slow_client_warnings == 0
    publish_n(bus, 1)
    assert bus.stats().slow_client_warnings == 1
    await take(sub, 3)  # 1 live left (4), the warning queued behind it
    publish_n(bus, 1)  # 2 live: above 1.875, not re-armed
    publish_n(bus, 2)  # 4 live: the same episode
    assert bus.stats().slow_client_warnings == 1
    assert sub.statistics().warned


async def test_a_frame_handed_to_a_waiting_consumer_rearms_the_warning():  # EB-4
    bus = EventBus(3)
    sub = bus.subscribe(max_queued=4)
    publish_n(bus, 3)  # warns at 3 of 4
    await take(sub, 4)  # 1 2 3 warning: empty again, but nothing was pushed since
    assert sub.statistics().warned
    waiting = asyncio.create_task(anext(sub))
    await asyncio.sleep(0)  # one step: the consumer waits, so the next frame is handed over
    bus.publish(ev())
    assert not sub.statistics().warned  # 0 frames and 0 bytes: re-armed
    async with asyncio.timeout(1):
        assert label(await waiting) == 4


async def test_a_handed_over_frame_is_not_counted_and_moves_the_cursor():  # EB-3, EB-7
    bus = EventBus(3)
    sub = bus.subscribe(max_queued=4)
    waiting = asyncio.create_task(sub.next_frame(60))
    await asyncio.sleep(0)  # one step: the consumer waits
    bus.publish(ev())
    stats = sub.statistics()
    assert (stats.live_count, stats.live_bytes, stats.forced_count) == (0, 0, 1)
    bus.publish(ev())  # queued live behind it
    assert (sub.statistics().live_count, sub.statistics().forced_count) == (1, 1)
    async with asyncio.timeout(1):
        assert label(await waiting) == 1  # type: ignore[arg-type]
    assert sub.last_event_id == 1
    assert (sub.statistics().live_count, sub.statistics().forced_count) == (1, 0)


async def test_statistics_count_live_and_forced_items_of_a_mixed_queue():  # EB-3, EB-4
    bus = EventBus(3)
    publish_n(bus, 2)
    sub = bus.subscribe(last_event_id=0, max_queued=4)  # 1 2 replay_complete: forced
    publish_n(bus, 3)  # 3 4 5 live; the third warns (forced)
    stats = sub.statistics()
    assert (stats.live_count, stats.forced_count, stats.warned) == (3, 4, True)
    assert stats.live_bytes == size(3) + size(4) + size(5)
    assert [label(f) for f in await take(sub, 4)] == [1, 2, "replay_complete", 3]
    stats = sub.statistics()
    assert (stats.live_count, stats.forced_count, stats.live_bytes) == (2, 1, size(4) + size(5))
    assert sub.last_event_id == 3


# -- EB-5: eviction --------------------------------------------------------------------


async def test_eviction_frame_has_exact_payload(bus_log):  # EB-5
    bus = EventBus(3, max_queued_bytes=1000)
    sub = bus.subscribe(max_queued=2)
    publish_n(bus, 2)
    bus_log.clear()
    publish_n(bus, 1)
    assert_one_line(bus_log)
    data: dict[str, Any] = dict(reason="queue_overflow", droppedAfter=3, queueSize=2, maxQueued=2)
    data |= dict(queuedBytes=2 * size(1), maxQueuedBytes=1000)
    evicted = (await drain(sub))[-1]
    assert dict(evicted) == {"v": 1, "type": "client_evicted", "data": data}


async def test_evicted_subscriber_drains_queued_frames_then_terminal_frame_then_ends():  # EB-5
    bus = EventBus(3)
    sub = bus.subscribe(max_queued=2)
    publish_n(bus, 5)  # 3 evicts; 4 and 5 are no longer delivered
    frames = await take(sub, 4)
    assert [label(f) for f in frames] == [1, 2, "slow_client_warning", "client_evicted"]
    with pytest.raises(StopAsyncIteration):
        async with asyncio.timeout(1):
            await anext(sub)


async def test_on_evicted_is_told_once_after_client_evicted_is_queued():  # EB-5
    bus = EventBus(3)
    slow, other = bus.subscribe(max_queued=2), bus.subscribe(max_queued=10)
    told: list[str] = []
    slow.on_evicted = lambda: told.append(f"slow evicted={slow.evicted} ended={slow.ended}")
    other.on_evicted = lambda: told.append("other")
    publish_n(bus, 5)  # 3 evicts slow; 4 and 5 change nothing for it
    assert told == ["slow evicted=True ended=True"]
    bus.close()  # the bus closing is no eviction
    assert told == ["slow evicted=True ended=True"]
    assert [label(f) for f in await drain(slow)][-1] == "client_evicted"


async def test_evicted_subscriber_is_removed_at_once():  # EB-5
    bus = EventBus(3)
    bus.subscribe(max_queued=2)
    publish_n(bus, 3)
    assert bus.subscriber_count == 0
    assert dict(bus.stats().evictions) == {"queue_overflow": 1}


async def test_eviction_leaves_siblings_and_session_running():  # EB-5
    bus = EventBus(3)
    slow, fast = bus.subscribe(max_queued=2), bus.subscribe(max_queued=2)
    for expected in (1, 2, 3, 4):
        bus.publish(ev())
        assert [label(f) for f in await take(fast, 1)] == [expected]
    assert bus.subscriber_count == 1
    assert slow.evicted
    assert fast.statistics().live_count == 0


async def test_several_subscribers_evicted_by_one_publish_each_get_their_frame():  # EB-5
    bus = EventBus(3)
    subs = [bus.subscribe(max_queued=1), bus.subscribe(max_queued=1)]
    publish_n(bus, 2)
    assert bus.subscriber_count == 0
    for sub in subs:
        assert (await drain(sub))[-1]["data"]["droppedAfter"] == 2


async def test_evicted_client_can_reconnect_with_its_cursor():  # EB-5, EB-7
    bus = EventBus(3)
    bus.subscribe(max_queued=2)
    publish_n(bus, 3)
    again = bus.subscribe(last_event_id=2)
    assert [label(f) for f in await take(again, 2)] == [3, "replay_complete"]


# -- EB-8: abort ----------------------------------------------------------------------


async def test_abort_drops_buffered_frames_and_detaches_at_once():  # EB-8
    bus = EventBus(3)
    sub = bus.subscribe()
    publish_n(bus, 2)
    sub.abort()
    assert bus.subscriber_count == 0
    assert await drain(sub) == []


async def test_abort_is_idempotent_and_leaves_siblings_alone():  # EB-8
    bus = EventBus(3)
    sub, sibling = bus.subscribe(), bus.subscribe()
    sub.abort()
    sub.abort()
    assert bus.subscriber_count == 1
    frame = pub(bus, ev())
    assert await take(sibling, 1) == [frame]


async def test_abort_frees_a_subscriber_slot():  # EB-8, EB-6
    bus = EventBus(3, max_subscribers=1)
    bus.subscribe().abort()
    assert bus.subscribe() is not None
    assert bus.subscriber_count == 1


async def test_abort_ends_pending_iteration_in_another_task():  # EB-8
    bus = EventBus(3)
    sub = bus.subscribe()
    pending = asyncio.create_task(anext(sub))
    await asyncio.sleep(0)  # one step: the task starts and blocks in __anext__
    sub.abort()
    async with asyncio.timeout(1):
        with pytest.raises(StopAsyncIteration):
            await pending


async def test_leaving_async_with_aborts():  # EB-8
    bus = EventBus(3)

    async def use_and_fail() -> Subscription:
        async with bus.subscribe() as sub:
            publish_n(bus, 1)
            raise RuntimeError(sub)

    with pytest.raises(RuntimeError) as info:
        await use_and_fail()
    assert bus.subscriber_count == 0
    assert await drain(info.value.args[0]) == []


async def test_cancelling_consumer_task_aborts_its_subscription():  # EB-8
    bus = EventBus(3)

    async def consume() -> None:
        async with bus.subscribe() as sub:
            async for _ in sub:
                pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)  # one step: the task subscribes and blocks
    assert bus.subscriber_count == 1
    task.cancel()
    async with asyncio.timeout(1):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert bus.subscriber_count == 0


async def test_abort_after_eviction_keeps_remaining_frames():  # EB-8, EB-5
    bus = EventBus(3)
    sub = bus.subscribe(max_queued=2)
    publish_n(bus, 3)
    sub.abort()
    frames = await drain(sub)
    assert [label(f) for f in frames] == [1, 2, "slow_client_warning", "client_evicted"]


async def test_abort_after_close_keeps_remaining_frames():  # EB-8, EB-9
    bus = EventBus(3)
    sub = bus.subscribe()
    publish_n(bus, 2)
    bus.close()
    sub.abort()
    assert [label(f) for f in await drain(sub)] == [1, 2]


# -- cancellation safety (class docstring of Subscription; the route relies on it) -----------


async def test_cancelled_anext_under_timeout_loses_no_frame():  # EB-3, EB-8
    bus = EventBus(3)
    sub = bus.subscribe()
    # Scheduled before the timeout's own callback: the frame is handed over, then the
    # wait is cancelled before the consumer resumes.
    asyncio.get_running_loop().call_soon(bus.publish, ev())
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0):
            await anext(sub)
    assert [label(f) for f in await take(sub, 1)] == [1]
    assert bus.subscriber_count == 1


async def test_cancelled_anext_task_loses_no_frame():  # EB-3, EB-8
    bus = EventBus(3)
    sub = bus.subscribe()
    pending = asyncio.create_task(anext(sub))
    await asyncio.sleep(0)  # one step: the task starts and blocks in __anext__
    frame = pub(bus, ev())
    pending.cancel()
    async with asyncio.timeout(1):
        with pytest.raises(asyncio.CancelledError):
            await pending
    assert await take(sub, 1) == [frame]


async def test_publish_after_consumer_wait_was_cancelled_is_a_live_push():  # EB-3
    bus = EventBus(3)
    sub = bus.subscribe(max_queued=1)
    pending = asyncio.create_task(anext(sub))
    await asyncio.sleep(0)  # one step: the task starts and blocks in __anext__
    pending.cancel()  # nobody waits any more, although the task has not resumed yet
    publish_n(bus, 2)  # the first is queued live (1 of 1); the second overflows
    async with asyncio.timeout(1):
        with pytest.raises(asyncio.CancelledError):
            await pending
    assert bus.subscriber_count == 0
    assert [label(f) for f in await drain(sub)] == [1, "slow_client_warning", "client_evicted"]


# -- Subscription.last_event_id and since -------------------------------------------------


async def test_last_event_id_is_none_until_an_event_is_handed_out():  # EB-7
    bus = EventBus(3)
    sub = bus.subscribe()
    publish_n(bus, 2)  # queued, not yet handed out
    assert sub.last_event_id is None
    await take(sub, 1)
    assert sub.last_event_id == 1


async def test_last_event_id_skips_synthetic_frames():  # EB-7: synthetic frames carry no id
    bus = EventBus(3)
    publish_n(bus, 2)
    sub = bus.subscribe(last_event_id=0)  # replay 1, 2, then replay_complete
    assert [label(f) for f in await take(sub, 3)] == [1, 2, "replay_complete"]
    assert sub.last_event_id == 2


async def test_last_event_id_follows_next_nowait_and_next_frame():  # EB-3
    bus = EventBus(3)
    sub = bus.subscribe()
    publish_n(bus, 2)
    assert sub.next_nowait() is not None
    assert sub.last_event_id == 1
    async with asyncio.timeout(1):
        assert await sub.next_frame(60) is not None
    assert sub.last_event_id == 2


async def test_since_is_the_creation_time_in_epoch_seconds():  # operator data, no EB rule
    before = time.time()
    sub = EventBus(3).subscribe()
    assert before <= sub.since <= time.time()


# -- end_reason, and log lines that name the session and the subscriber (EB-5, EB-8, EB-9) --


async def test_end_reason_names_why_the_subscription_ended():  # EB-5, EB-8, EB-9
    bus = EventBus(3)
    attached, aborted, evicted, closed = (bus.subscribe(max_queued=n) for n in (9, 9, 1, 9))
    assert [s.end_reason for s in (attached, aborted, evicted, closed)] == [None] * 4
    aborted.abort()
    publish_n(bus, 2)  # the second live frame evicts max_queued=1
    bus.close()
    assert (aborted.end_reason, evicted.end_reason) == ("aborted", "evicted")
    assert (attached.end_reason, closed.end_reason) == ("closed", "closed")
    assert bus.subscribe().end_reason == "closed"


async def test_warning_and_eviction_log_lines_name_session_and_subscriber(bus_log):
    # EB-4, EB-5: one grep-able line each
    bus = EventBus(3, name="s-1", max_queued_bytes=1000)
    bus.subscribe(max_queued=2, label="sub-9")
    publish_n(bus, 3)
    warning, evicted = (r.getMessage() for r in bus_log)
    assert warning.startswith("slow_client_warning session=s-1 subscriber=sub-9 queueSize=2 ")
    assert evicted.startswith("client_evicted session=s-1 subscriber=sub-9 reason=queue_overflow ")
    assert "droppedAfter=3 " in evicted


async def test_bytes_eviction_log_line_has_the_event_size(bus_log):  # EB-5
    bus = EventBus(3, name="s", max_queued_bytes=size(1) + 1)
    bus.subscribe(max_queued=4, label="b")
    publish_n(bus, 2)
    assert bus_log[-1].getMessage().endswith(f"eventBytes={size(2)}")


async def test_resync_log_line_names_session_and_subscriber(bus_log):  # EB-7
    bus = EventBus(3, name="s-1")
    publish_n(bus, 1)
    bus.subscribe(last_event_id=9, label="sub-2")
    assert_one_line(bus_log)
    assert (
        bus_log[0]
        .getMessage()
        .startswith("state_resync_required session=s-1 subscriber=sub-2 reason=epoch_reset ")
    )


async def test_evict_from_outside_sends_terminal_frame_and_counts_reason():  # EB-5
    bus = EventBus(3)
    sub = bus.subscribe()
    bus.publish({"type": "t", "data": 1})
    assert bus.evict(sub, "writer_idle_timeout", idleS=1.5)
    frames = await drain(sub)
    assert [f["type"] for f in frames] == ["t", "client_evicted"]
    data = frames[-1]["data"]
    assert data["reason"] == "writer_idle_timeout"
    assert (data["droppedAfter"], data["idleS"]) == (2, 1.5)
    assert bus.subscriber_count == 0
    assert dict(bus.stats().evictions) == {"writer_idle_timeout": 1}


async def test_evict_of_a_detached_subscription_does_nothing():  # EB-5, EB-8
    bus = EventBus(3)
    sub = bus.subscribe()
    sub.abort()
    assert not bus.evict(sub, "writer_idle_timeout")
    assert dict(bus.stats().evictions) == {}


async def test_next_frame_returns_none_when_nothing_arrives_in_time():  # EB-6
    sub = EventBus(3).subscribe()
    async with asyncio.timeout(5):
        assert await sub.next_frame(0.01) is None


async def test_next_frame_returns_a_frame_published_while_waiting():  # EB-3 hand-over
    bus = EventBus(3)
    sub = bus.subscribe()
    waiting = asyncio.create_task(sub.next_frame(60))
    await asyncio.sleep(0)  # one step: the task starts waiting
    bus.publish({"type": "t", "data": 1})
    async with asyncio.timeout(5):
        frame = await waiting
    assert frame is not None
    assert frame["data"] == 1


async def test_next_frame_after_timeout_loses_nothing_and_counts_live():  # EB-3
    bus = EventBus(3)
    sub = bus.subscribe(max_queued=1)
    async with asyncio.timeout(5):
        assert await sub.next_frame(0.01) is None
    bus.publish({"type": "t", "data": 1})
    assert sub.statistics().live_count == 1  # not handed to the expired waiter
    async with asyncio.timeout(5):
        assert (await sub.next_frame(60))["data"] == 1  # type: ignore[index]


async def test_next_frame_raises_stop_when_ended_and_drained():  # EB-9
    bus = EventBus(3)
    sub = bus.subscribe()
    bus.publish({"type": "t"})
    bus.close()
    async with asyncio.timeout(5):
        assert await sub.next_frame(60) is not None
        with pytest.raises(StopAsyncIteration):
            await sub.next_frame(60)
