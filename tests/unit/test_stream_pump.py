"""The stream's pump: writer idle timeout, heartbeats through the same path."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sessions.bus import EventBus
from sessions.transport.pump import WriterIdleTimeoutError, pump_frames
from sessions.wire import FrameEncoder

pytestmark = pytest.mark.asyncio


def stuck_after(count: int) -> tuple[list[Any], Any]:
    """A ``send`` that accepts ``count`` messages, then never returns (a full socket)."""
    sent: list[Any] = []
    never = asyncio.Event()

    async def send(message: Any) -> None:
        if len(sent) >= count:
            await never.wait()
        sent.append(message)

    return sent, send


async def test_frames_pending_on_a_stuck_socket_raise_writer_idle_timeout():
    bus = EventBus(8)
    sub = bus.subscribe()
    sent, send = stuck_after(1)
    bus.publish({"type": "t", "data": 1})
    pump = asyncio.create_task(pump_frames(sub, send, 60, writer_idle_timeout_s=0.05))
    await asyncio.sleep(0)  # one step: the pump writes frame 1
    bus.publish({"type": "t", "data": 2})
    async with asyncio.timeout(5):
        with pytest.raises(WriterIdleTimeoutError):
            await pump
    assert len(sent) == 1


async def test_heartbeat_on_a_half_open_connection_raises_writer_idle_timeout():
    # Heartbeats go through the same path, so an idle stream to a dead peer is found too.
    sub = EventBus(8).subscribe()
    _, send = stuck_after(0)
    async with asyncio.timeout(5):
        with pytest.raises(WriterIdleTimeoutError, match=r"no byte for 0\.05 s"):
            await pump_frames(sub, send, 0.01, writer_idle_timeout_s=0.05)


async def test_without_idle_timeout_a_slow_send_is_waited_for():
    bus = EventBus(8)
    sub = bus.subscribe()
    release = asyncio.Event()
    sent: list[Any] = []

    async def slow_send(message: Any) -> None:
        await release.wait()
        sent.append(message)

    bus.publish({"type": "t", "data": 1})
    pump = asyncio.create_task(pump_frames(sub, slow_send, 60))
    await asyncio.sleep(0)  # one step: the pump is inside send
    release.set()
    bus.close()
    async with asyncio.timeout(5):
        await pump
    assert b"event: t" in sent[0]["body"]


async def test_bytes_sent_counts_every_body_byte_the_pump_wrote_once_send_returned():
    # Operators' bytes per second (GET /session/<id>/subscribers) start from this counter.
    bus = EventBus(8)
    sub = bus.subscribe()
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    for n in range(3):
        bus.publish({"type": "t", "data": n})
    bus.close()
    async with asyncio.timeout(5):
        await pump_frames(sub, send, 60)
    assert sub.bytes_sent == sum(len(m["body"]) for m in sent) > 0


async def test_bytes_sent_does_not_count_a_send_that_never_returned():
    bus = EventBus(8)
    sub = bus.subscribe()
    _, send = stuck_after(0)
    bus.publish({"type": "t", "data": 1})
    async with asyncio.timeout(5):
        with pytest.raises(WriterIdleTimeoutError):
            await pump_frames(sub, send, 60, writer_idle_timeout_s=0.05)
    assert sub.bytes_sent == 0


async def test_streams_sharing_an_empty_encoder_frame_each_event_once():
    # EB-18: an event fanned out to many subscribers is framed once. (Regression: an
    # empty FrameEncoder is falsy, and `encoder or FrameEncoder()` gave each stream its own.)
    bus = EventBus(8)
    subs = [bus.subscribe(), bus.subscribe()]
    encoder = FrameEncoder()
    bodies: list[list[bytes]] = [[], []]

    def collect(index: int) -> Any:
        async def send(message: Any) -> None:
            bodies[index].append(message["body"])

        return send

    pumps = [
        asyncio.create_task(pump_frames(sub, collect(i), 60, encoder=encoder))
        for i, sub in enumerate(subs)
    ]
    bus.publish({"type": "t", "data": 1})
    bus.close()
    async with asyncio.timeout(5):
        await asyncio.gather(*pumps)
    assert len(encoder) == 1
    assert bodies[0][0] is bodies[1][0]  # one bytes object, shared


async def test_idle_timeout_never_fires_while_the_pump_waits_for_frames():
    # The writer idle timeout times a pending send, not a quiet session.
    bus = EventBus(8)
    sub = bus.subscribe()
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    pump = asyncio.create_task(pump_frames(sub, send, 60, writer_idle_timeout_s=0.02))
    async with asyncio.timeout(5):
        await asyncio.sleep(0.1)  # five idle timeouts with nothing to send
        bus.publish({"type": "t", "data": 1})
        bus.close()
        await pump  # returns: no WriterIdleTimeoutError
    assert len(sent) == 1


async def test_pump_cancelled_from_outside_while_sending_stays_cancelled():
    bus = EventBus(8)
    sub = bus.subscribe()
    _, send = stuck_after(0)
    bus.publish({"type": "t", "data": 1})
    pump = asyncio.create_task(pump_frames(sub, send, 60, writer_idle_timeout_s=30))
    await asyncio.sleep(0)  # one step: the pump is inside send
    pump.cancel()
    async with asyncio.timeout(5):
        with pytest.raises(asyncio.CancelledError):
            await pump
