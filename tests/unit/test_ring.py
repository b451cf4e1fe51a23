"""The replay ring's limits (count, bytes, age), the process budget and lazy frames.

docs/protocol.md, "Ring limits"; issue 17.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from typing import Any

import orjson
import pytest

from sessions.backends.rates import TokenBucket
from sessions.bus import EventBus, Frame, Ring, RingBudget, held_bytes
from sessions.bus.ring import FRAME_OVERHEAD_BYTES


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def frame(event_id: int, size: int = 10) -> Frame:
    body = orjson.dumps({"id": event_id, "v": 1, "type": "t", "data": "x" * size})
    return Frame.from_json(event_id, "t", body)


def test_published_frame_keeps_only_its_bytes_and_parses_on_demand() -> None:
    bus = EventBus(10)
    data: list[dict[str, int]] = [{} for _ in range(1000)]
    published = bus.publish({"type": "objects", "data": data})
    assert published is not None
    assert published._fields is None  # the parsed data is not held
    assert published["data"] == data  # ... and still readable
    assert dict(published)["type"] == "objects"
    assert published.nbytes == len(published.json or b"")


def test_lazy_frame_keeps_integers_beyond_64_bits_exact() -> None:
    bus = EventBus(10)
    published = bus.publish({"type": "n", "data": 2**70})
    assert published is not None
    assert published["data"] == 2**70


def test_frame_overhead_covers_what_an_entry_costs_beyond_its_json() -> None:
    f = frame(1)
    assert f.json is not None
    measured = sys.getsizeof(f) + (sys.getsizeof(f.json) - len(f.json)) + 24 + 8
    assert measured <= FRAME_OVERHEAD_BYTES


async def _until_replay_complete(sub: Any) -> list[Frame]:
    """The subscription's frames up to and including ``replay_complete`` (bounded: 2 s)."""
    frames = []
    async with asyncio.timeout(2):
        async for item in sub:
            frames.append(item)
            if item.type == "replay_complete":
                break
    return frames


def test_ring_drops_oldest_past_the_count() -> None:
    ring = Ring(3, 10**9)
    for i in range(1, 6):
        ring.append(frame(i))
    assert [f.id for f in ring] == [3, 4, 5]


def test_ring_drops_oldest_past_the_bytes_but_keeps_the_newest() -> None:
    ring = Ring(100, 3 * held_bytes(frame(1, 1000)))
    for i in range(1, 6):
        ring.append(frame(i, 1000))
    assert [f.id for f in ring] == [3, 4, 5]
    assert ring.nbytes == 3 * held_bytes(frame(1, 1000))
    ring.append(frame(6, 10_000))  # larger than the limit alone: kept, alone
    assert [f.id for f in ring] == [6]


def test_ring_drops_events_older_than_the_age_limit() -> None:
    clock = Clock()
    ring = Ring(100, 10**9, 10.0, clock=clock)
    ring.append(frame(1))
    clock.now += 6
    ring.append(frame(2))
    clock.now += 5
    assert ring.expire() == 1
    assert [f.id for f in ring] == [2]


def test_frames_after_and_newest_slices() -> None:
    ring = Ring(100, 10**9)
    for i in range(5, 11):
        ring.append(frame(i))
    assert [f.id for f in ring.frames_after(7)] == [8, 9, 10]
    assert [f.id for f in ring.frames_after(0)] == [5, 6, 7, 8, 9, 10]
    assert list(ring.frames_after(10)) == []
    assert [f.id for f in ring.newest(2)] == [10, 9]
    assert [f.id for f in ring.newest(3, before=8)] == [7, 6, 5]
    assert [f.id for f in ring.newest(5, before=6)] == [5]


@pytest.mark.asyncio
async def test_bus_resync_after_byte_eviction_names_the_earliest_id() -> None:  # EB-7
    bus = EventBus(8000, ring_max_bytes=2 * held_bytes(frame(1, 1100)))
    for _ in range(5):
        bus.publish({"type": "t", "data": "x" * 1000})
    sub = bus.subscribe(last_event_id=1)
    frames = await _until_replay_complete(sub)
    assert frames[0]["data"] == {
        "reason": "ring_evicted",
        "lastDeliveredId": 1,
        "earliestAvailableId": 4,
    }
    assert [f.id for f in frames[1:-1]] == [4, 5]
    stats = bus.stats()
    assert stats.ring_length == 2
    assert stats.earliest_id == 4
    assert stats.ring_bytes == sum(held_bytes(f) for f in bus.ring_snapshot())


@pytest.mark.asyncio
async def test_bus_resync_after_age_expiry_emptied_the_ring() -> None:  # EB-7
    # Every event aged out: the cursor fell out of an empty ring, and the next id is the
    # earliest a client can get.
    clock = Clock()
    bus = EventBus(8000, ring_max_age_s=10.0)
    bus.ring._clock = clock
    for _ in range(3):
        bus.publish({"type": "t"})
    clock.now += 11
    sub = bus.subscribe(last_event_id=1)
    frames = await _until_replay_complete(sub)
    assert frames[0].type == "state_resync_required"
    assert frames[0]["data"]["reason"] == "ring_evicted"
    assert frames[0]["data"]["earliestAvailableId"] == 4
    assert frames[-1]["data"]["replayedCount"] == 0


def test_budget_evicts_the_oldest_events_across_rings(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    size = held_bytes(frame(1, 1000))
    budget = RingBudget(10 * size)
    a = Ring(100, 10**9, budget=budget, name="a", clock=clock)
    b = Ring(100, 10**9, budget=budget, name="b", clock=clock)
    for i in range(1, 6):
        a.append(frame(i, 1000))
        clock.now += 1
    for i in range(1, 6):
        b.append(frame(i, 1000))
        clock.now += 1
    assert budget.total_bytes == 10 * size
    assert budget.evicted_events == 0
    with caplog.at_level(logging.WARNING, "qwenweb.bus"):
        b.append(frame(6, 1000))  # 11 > 10: down to 9 (90 %), the oldest first: a's
    assert [f.id for f in a] == [3, 4, 5]
    assert [f.id for f in b] == [1, 2, 3, 4, 5, 6]
    assert budget.total_bytes == 9 * size
    assert (budget.evicted_events, budget.episodes) == (2, 1)
    lines = [r.getMessage() for r in caplog.records if "ring_budget_exceeded" in r.getMessage()]
    assert len(lines) == 1
    assert "evicted_events=2" in lines[0]


def test_a_dropped_ring_gives_its_bytes_back_to_the_budget() -> None:
    budget = RingBudget(10**9)
    ring = Ring(100, 10**9, budget=budget)
    ring.append(frame(1))
    assert budget.total_bytes == held_bytes(frame(1))
    del ring
    gc.collect()
    assert budget.total_bytes == 0


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(10.0, 20.0, clock=clock)
    for _ in range(20):
        assert bucket.wait_s(1) == 0
        bucket.take(1)
    assert bucket.wait_s(1) == pytest.approx(0.1)
    clock.now += 0.5
    assert bucket.wait_s(5) == 0
    assert bucket.wait_s(100) == pytest.approx(1.5)  # capped at the burst: never refused for good
