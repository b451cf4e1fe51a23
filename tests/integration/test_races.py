"""Subscribing with a cursor while events are being published (EB-6, EB-7, EB-18).

A publisher task publishes at about 1,000 events/s (one event, then ``asyncio.sleep(0.001)``:
that pause is the publishing rate being simulated, not a wait for anything). Meanwhile a
subscriber joins with a cursor. Whatever the interleaving, it must see every id from
cursor + 1 through the last exactly once, strictly increasing, with the replay/live
boundary (``replay_complete``) in between and invisible in the ids. 50 repetitions, with
the cursor at varying distances behind the head, on the bus directly and through the ASGI
route.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from sessions.auth import issue_token
from sessions.backends import get_backend
from sessions.bus import EventBus, Frame, Subscription
from tests.integration.conftest import WAIT_S, live_bus, load, publish

REPETITIONS = 50
EVENTS_PER_REPETITION = 30
PUBLISH_PAUSE_S = 0.001  # ~1,000 events/s: the cause being simulated
JOIN_AFTER = (1, 5, 12, 20)
"""The subscriber joins after this many events of the repetition were published."""
CURSOR_LAG = (0, 1, 2, 7, 25)
"""How far behind the head (at join time) the cursor is: 0 = nothing to replay."""


class _PacedPublisher:
    """Publish ``count`` events at about 1,000/s; ``published(k)`` is set after the k-th."""

    def __init__(self, publish_one: Callable[[int], Any], count: int) -> None:
        self._publish_one = publish_one
        self._count = count
        self._done_count = 0
        self._reached: dict[int, asyncio.Event] = {}

    def published(self, k: int) -> asyncio.Event:
        return self._reached.setdefault(k, asyncio.Event())

    async def run(self) -> None:
        for n in range(self._count):
            published = self._publish_one(n)
            if inspect.isawaitable(published):  # get_backend().publish (either backend)
                await published
            self._done_count += 1
            if self._done_count in self._reached:
                self._reached[self._done_count].set()
            await asyncio.sleep(PUBLISH_PAUSE_S)


def _check_ids(frames: list[dict[str, Any]], cursor: int, last: int) -> bool:
    """Every id from cursor + 1 through ``last`` exactly once, in order, around one boundary.

    Returns whether both sides of the boundary had events (the race really happened).
    """
    ids = [f["id"] for f in frames if f.get("id") is not None]
    assert ids == list(range(cursor + 1, last + 1)), (cursor, last, ids)
    types = [f["type"] for f in frames]
    assert types.count("replay_complete") == 1, types
    assert "state_resync_required" not in types  # the ring keeps everything here
    boundary = types.index("replay_complete")
    replayed = frames[boundary]["data"]["replayedCount"]
    assert ids[:replayed] == [f["id"] for f in frames[:boundary]]
    return 0 < replayed < len(ids)


def _plan(rep: int) -> tuple[int, int]:
    return JOIN_AFTER[rep % len(JOIN_AFTER)], CURSOR_LAG[rep % len(CURSOR_LAG)]


# -- the bus (EB-6, EB-7) ------------------------------------------------------------------


async def _read_through(subscription: Subscription, last: int) -> list[Frame]:
    """Consume ``subscription`` (concurrently with the publisher) through id ``last``."""
    frames: list[Frame] = []
    async with asyncio.timeout(WAIT_S):
        async for frame in subscription:
            frames.append(frame)
            if frame.id == last:
                break
    return frames


@pytest.mark.asyncio
async def test_bus_subscribe_with_cursor_during_publishing_sees_every_id_once_in_order():
    # EB-6: registered synchronously; EB-7: replay (cursor, head], replay_complete, live.
    bus = EventBus(ring_size=8000)
    for n in range(40):
        bus.publish({"type": "seed", "data": n})
    crossed = 0
    for rep in range(REPETITIONS):
        join_after, lag = _plan(rep)
        last = bus.last_event_id + EVENTS_PER_REPETITION
        publisher = _PacedPublisher(
            lambda n: bus.publish({"type": "race", "data": n}), EVENTS_PER_REPETITION
        )
        task = asyncio.create_task(publisher.run())
        async with asyncio.timeout(WAIT_S):
            await publisher.published(join_after).wait()
        cursor = bus.last_event_id - lag
        subscription = bus.subscribe(last_event_id=cursor)
        frames = await _read_through(subscription, last)
        async with asyncio.timeout(WAIT_S):
            await task
        subscription.abort()
        assert bus.last_event_id == last
        crossed += _check_ids([dict(f) for f in frames], cursor, last)
    assert bus.subscriber_count == 0
    assert crossed >= REPETITIONS // 2, crossed  # most joins fell between two publishes


# -- the route (EB-7, EB-18) ---------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.timeout(30)
async def test_stream_with_cursor_during_publishing_sees_every_id_once_in_order(
    make_session, stream_of
):
    # EB-7 through the route: the replay is queued before any live frame, so the stream
    # never skips or repeats an id across the replay/live boundary (EB-18: one id line each).
    session_id = await make_session()
    assert (await publish(session_id, {"type": "seed"})).status == 200
    live = get_backend().registry.get(session_id)
    assert live is not None
    bus = live_bus(session_id)
    token = issue_token(session_id, ["read"])
    crossed = 0
    for rep in range(REPETITIONS):
        join_after, lag = _plan(rep)
        last = bus.last_event_id + EVENTS_PER_REPETITION
        publisher = _PacedPublisher(
            lambda n: get_backend().publish(live, {"type": "race", "data": n}),
            EVENTS_PER_REPETITION,
        )
        task = asyncio.create_task(publisher.run())
        async with asyncio.timeout(WAIT_S):
            await publisher.published(join_after).wait()
        cursor = max(0, bus.last_event_id - lag)
        stream = await stream_of(session_id, token, headers={"last-event-id": str(cursor)})
        assert stream.status == 200
        await stream.read_until(lambda s, last=last: any(f.get("id") == last for f in s.frames))
        async with asyncio.timeout(WAIT_S):
            await task
        assert bus.last_event_id == last
        crossed += _check_ids(stream.frames, cursor, last)
        ids_in_lines = [
            int(line[4:]) for block in stream.blocks() for line in block if line.startswith("id: ")
        ]
        assert ids_in_lines == list(range(cursor + 1, last + 1))
        await stream.disconnect()
    assert bus.subscriber_count == 0
    assert crossed >= REPETITIONS // 2, crossed
    assert (await load(session_id)).json()["lastEventId"] == last
