"""No eviction without a slow reader: the overflow grace of a subscriber's queue (EB-3, EB-4).

A subscriber is warned, then evicted at ``maxQueued``, only once its queue has stayed past
75 % of a cap for ``overflow_grace_s`` while its consumer did not come back for frames.
Time is the module's clock (``sessions.bus.queue._now``), replaced here by one the test
moves, so nothing sleeps. Caps are tiny (``max_queued`` 4: the warning mark is 3 frames).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import sessions.bus.queue as queue_module
from sessions.bus import GRACE_BYTES_RATIO, EventBus, Frame, Subscription
from sessions.transport.pump import pump_frames

pytestmark = pytest.mark.asyncio

GRACE_S = 1.0


class Clock:
    """The queue's clock, moved by hand (monotonic seconds)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(queue_module, "_now", fake)
    return fake


def graced_bus(**options: Any) -> EventBus:
    return EventBus(16, overflow_grace_s=GRACE_S, **options)


def publish_n(bus: EventBus, n: int) -> None:
    for index in range(n):
        assert bus.publish({"type": "t", "data": index}) is not None


async def take_all(sub: Subscription) -> list[Frame]:
    """What a reader that keeps up gets: every frame queued now, coming back each time."""
    frames: list[Frame] = []
    async with asyncio.timeout(5):
        try:
            while (frame := await sub.next_frame(0)) is not None:
                frames.append(frame)
        except StopAsyncIteration:  # evicted: the terminal frame was the last
            pass
    return frames


def types(frames: list[Frame]) -> list[str]:
    return [frame.type for frame in frames]


async def test_burst_past_the_cap_released_at_once_neither_warns_nor_evicts(clock: Clock):
    # EB-3, EB-4: a mirror's catch-up (or a paused process) pushes 12 frames in one go.
    bus = graced_bus()
    sub = bus.subscribe(max_queued=4)
    publish_n(bus, 12)
    clock.now += 10 * GRACE_S  # however late the reader runs, it never had its chance
    frames = await take_all(sub)
    assert [frame.id for frame in frames] == list(range(1, 13))
    assert not sub.evicted
    assert bus.stats().slow_client_warnings == 0


async def test_frames_behind_a_send_that_returned_do_not_count(clock: Clock):
    bus = graced_bus()
    sub = bus.subscribe(max_queued=4)
    for _ in range(3):  # each round: a send that took most of the grace, then returned
        publish_n(bus, 10)
        clock.now += 0.9 * GRACE_S
        assert len(await take_all(sub)) == 10
    assert not sub.evicted
    assert bus.stats().slow_client_warnings == 0


async def test_consumer_away_past_the_grace_is_warned_then_evicted(clock: Clock):
    # EB-4, EB-5: the consumer took frame 1 and never came back (its send is blocked).
    bus = graced_bus()
    sub = bus.subscribe(max_queued=4)
    publish_n(bus, 1)
    assert (await sub.next_frame(0)) is not None
    publish_n(bus, 10)  # within the grace: queued past the cap
    clock.now += GRACE_S
    publish_n(bus, 1)
    assert sub.evicted
    assert bus.subscriber_count == 0
    frames = await take_all(sub)
    assert [frame.id for frame in frames[:-2]] == list(range(2, 12))
    assert types(frames[-2:]) == ["slow_client_warning", "client_evicted"]
    evicted = frames[-1]["data"]
    assert (evicted["reason"], evicted["droppedAfter"]) == ("queue_overflow", 12)
    assert frames[-2]["data"]["lastEventId"] == 11


async def test_burst_past_the_byte_cap_released_at_once_neither_warns_nor_evicts(clock: Clock):
    # EB-3: the byte cap waits for the grace too (a durable commit released at once).
    bus = graced_bus(max_queued_bytes=400)
    sub = bus.subscribe(max_queued=1000)
    publish_n(bus, 10)  # about 60 B each: past 400 B, within twice it
    clock.now += 10 * GRACE_S
    frames = await take_all(sub)
    assert [frame.id for frame in frames] == list(range(1, 11))
    assert not sub.evicted
    assert bus.stats().slow_client_warnings == 0


async def test_byte_cap_is_hard_at_its_ceiling_within_the_grace(clock: Clock):
    # Memory per subscriber stays bounded: GRACE_BYTES_RATIO × max_queued_bytes at most.
    bus = graced_bus(max_queued_bytes=400)
    sub = bus.subscribe(max_queued=1000)
    publish_n(bus, 20)  # about 60 B each: past the ceiling of 800 B
    assert sub.evicted
    frames = await take_all(sub)
    assert types(frames)[-2:] == ["slow_client_warning", "client_evicted"]
    evicted = frames[-1]["data"]
    assert evicted["reason"] == "queue_bytes_overflow"
    queued = sum(frame.nbytes for frame in frames if frame.id is not None)
    assert 400 < queued <= GRACE_BYTES_RATIO * 400
    assert evicted["queuedBytes"] == queued


async def test_consumer_away_past_the_grace_is_evicted_at_the_byte_cap(clock: Clock):
    bus = graced_bus(max_queued_bytes=400)
    sub = bus.subscribe(max_queued=1000)
    publish_n(bus, 1)
    assert (await sub.next_frame(0)) is not None
    publish_n(bus, 5)  # 75 % of 400 B passed: the episode starts
    clock.now += GRACE_S
    publish_n(bus, 3)  # past 400 B, the consumer away for the grace
    assert sub.evicted
    frames = await take_all(sub)
    assert types(frames)[-2:] == ["slow_client_warning", "client_evicted"]
    evicted = frames[-1]["data"]
    assert evicted["reason"] == "queue_bytes_overflow"
    assert evicted["queuedBytes"] <= 400


async def test_zero_grace_is_the_strict_cap(clock: Clock):
    bus = EventBus(16)
    sub = bus.subscribe(max_queued=4)
    publish_n(bus, 5)
    assert sub.evicted
    assert types(await take_all(sub))[-2:] == ["t", "client_evicted"]


async def test_pump_whose_send_is_blocked_is_evicted_and_one_that_returns_is_not(clock: Clock):
    # The same rule seen from the pump: it comes back for frames once `send` returned.
    bus = graced_bus()
    blocked, flowing = bus.subscribe(max_queued=4), bus.subscribe(max_queued=4)
    gate = asyncio.Event()
    written: list[bytes] = []

    async def stuck_send(message: Any) -> None:
        await gate.wait()

    async def quick_send(message: Any) -> None:
        written.append(message["body"])

    pumps = [
        asyncio.create_task(pump_frames(blocked, stuck_send, 60)),
        asyncio.create_task(pump_frames(flowing, quick_send, 60)),
    ]
    async with asyncio.timeout(5):
        for _ in range(3):
            publish_n(bus, 8)  # a burst of twice the cap, then the loop turns
            clock.now += GRACE_S
            await asyncio.sleep(0)  # one loop turn: each pump takes what is queued
            await asyncio.sleep(0)
    assert blocked.evicted
    assert not flowing.evicted
    assert b"slow_client_warning" not in b"".join(written)
    gate.set()
    async with asyncio.timeout(5):
        await pumps[0]
    pumps[1].cancel()
