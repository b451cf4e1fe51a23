"""A forked epoch's bus (EB-23): its carried ids, one gap of ids
never issued in it, and cursors of its lineage (EB-1, EB-7)."""

from __future__ import annotations

import asyncio

import pytest

from sessions.bus import EventBus, Frame
from tests.unit.bus_support import ev, label, pub, publish_n

pytestmark = pytest.mark.asyncio


def forked(carried: int = 3, first_own: int = 101) -> EventBus:
    """Epoch ``e2``, forked from ``e1`` at ``carried`` (its ids 1 … carried), own ids from
    ``first_own``."""
    bus = EventBus(10, epoch="e2", gap=(carried, first_own), lineage={"e1": carried})
    publish_n(bus, carried)
    return bus


async def replay_of(bus: EventBus, cursor: int, epoch: str | None) -> list[Frame]:
    sub = bus.subscribe(last_event_id=cursor, epoch=epoch)
    frames: list[Frame] = []
    async with asyncio.timeout(1):
        while not frames or frames[-1].type != "replay_complete":
            frames.append(await anext(sub))
    sub.abort()
    return frames


async def test_ids_continue_past_the_gap_and_the_head_is_the_fork_id_until_then():
    bus = forked()
    assert (bus.last_event_id, bus.next_id) == (3, 101)
    assert pub(bus, ev()).id == 101
    assert (bus.last_event_id, bus.next_id) == (101, 102)


async def test_an_id_inside_the_gap_is_never_ingested():
    bus = forked()
    assert not bus.ingest(Frame.from_json(4, "t", b'{"id":4,"v":1,"type":"t"}'))
    assert bus.ingest(Frame.from_json(101, "t", b'{"id":101,"v":1,"type":"t"}'))


async def test_a_parent_cursor_at_or_below_the_fork_is_served_as_this_epochs():
    bus = forked()
    pub(bus, ev())
    for cursor in (0, 2, 3):
        frames = await replay_of(bus, cursor, "e1")
        assert [label(f) for f in frames] == [*range(cursor + 1, 4), 101, "replay_complete"]


async def test_a_parent_cursor_beyond_the_fork_is_an_epoch_mismatch():
    bus = forked()
    frames = await replay_of(bus, 4, "e1")
    assert frames[0]["data"]["detail"] == "epoch_mismatch"
    assert [label(f) for f in frames[1:]] == [1, 2, 3, "replay_complete"]


async def test_a_cursor_inside_the_gap_without_epoch_is_a_lost_tail():
    bus = forked()
    for cursor in (4, 100):
        frames = await replay_of(bus, cursor, None)
        assert frames[0]["data"]["reason"] == "epoch_reset"


async def test_a_cursor_at_the_fork_misses_nothing_when_the_ring_starts_after_the_gap():
    bus = EventBus(2, epoch="e2", gap=(3, 101), lineage={"e1": 3}, start_id=4)
    publish_n(bus, 2)  # 101, 102: the ring holds nothing before the gap
    for cursor, epoch in ((3, "e1"), (3, None), (100, "e2")):
        frames = await replay_of(bus, cursor, epoch)
        assert [label(f) for f in frames] == [101, 102, "replay_complete"]


async def test_a_cursor_before_an_evicted_fork_is_ring_evicted():
    bus = forked(carried=3)
    publish_n(bus, 9)  # a ring of 10: ids 3, 101 … 109
    frames = await replay_of(bus, 1, "e1")
    assert frames[0]["data"]["reason"] == "ring_evicted"
    assert [label(f) for f in frames[1:3]] == [3, 101]
