"""The per-connection observers (``sessions.hooks.ConnectionObserver``) told once per ``send``:
what the pump hands them, the fan-out to several listeners, and how the records and the
operator feed read a ``send`` of several frames (warnings and evictions among events).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from django.utils import timezone

from sessions.bus import EventBus, Frame, synthetic_frame
from sessions.hooks import ConnectionInfo, ConnectionObserver, Hooks, Listener
from sessions.ops.feed import OperatorFeed
from sessions.ops.records import ConnectionRecord, Recorder
from sessions.transport.pump import pump_frames

pytestmark = pytest.mark.asyncio

WARNING = synthetic_frame(
    "slow_client_warning",
    {"queueSize": 12, "maxQueued": 16, "lastEventId": 40, "threshold": "frames"},
)
EVICTED = synthetic_frame("client_evicted", {"reason": "queue_overflow", "droppedAfter": 57})
NOTE = Frame({"id": 1, "v": 1, "type": "note", "data": {}}, b'{"id":1,"v":1,"type":"note"}')


def info() -> ConnectionInfo:
    return ConnectionInfo(
        uuid.uuid4(), "s-1", "token", None, "tester", "127.0.0.1", "ua", "tab-1", 16, None
    )


class Recording(ConnectionObserver):
    """Keeps every ``frames_written`` call (copies: the caller may reuse its lists)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[Frame], list[bytes], list[bytes], int]] = []
        self.other_bytes = 0

    def frames_written(
        self,
        frames: Sequence[Frame],
        wires: Sequence[bytes],
        payloads: Sequence[bytes],
        nbytes: int,
    ) -> None:
        self.calls.append((list(frames), list(wires), list(payloads), nbytes))

    def bytes_written(self, nbytes: int) -> None:
        self.other_bytes += nbytes


def one_send(*frames: Frame) -> tuple[list[bytes], list[bytes], int]:
    """Wires and payloads of ``frames`` written by one ``send``, as the route writes them."""
    payloads = [json.dumps({**dict(f), "_meta": {"serverTimestamp": 1}}).encode() for f in frames]
    wires = [
        b"event: " + f.type.encode() + b"\ndata: " + p + b"\n\n"
        for f, p in zip(frames, payloads, strict=True)
    ]
    return wires, payloads, sum(len(w) for w in wires)


async def test_the_pump_tells_its_observer_once_per_send_with_each_frame_in_order():
    bus = EventBus(8)
    sub = bus.subscribe()
    bodies: list[bytes] = []

    async def send(message: Any) -> None:
        bodies.append(message["body"])

    observer = Recording()
    for n in range(3):  # queued before the pump starts: one send
        bus.publish({"type": "t", "data": n})
    pump = asyncio.create_task(pump_frames(sub, send, 60, observer))
    for _ in range(3):
        await asyncio.sleep(0)
    bus.publish({"type": "t", "data": 3})  # handed to the waiting pump: a send of its own
    for _ in range(3):
        await asyncio.sleep(0)
    bus.close()
    async with asyncio.timeout(5):
        await pump
    ids = [[frame.id for frame in call[0]] for call in observer.calls]
    assert ids[:2] == [[1, 2, 3], [4]]
    assert len(observer.calls) == len(bodies)  # one call per send, none per frame
    for (frames, wires, payloads, nbytes), body in zip(observer.calls, bodies, strict=True):
        assert len(frames) == len(wires) == len(payloads)
        assert b"".join(wires) == body
        assert nbytes == len(body)
        for frame, wire, payload in zip(frames, wires, payloads, strict=True):
            assert b"data: " + payload + b"\n" in wire
            assert json.loads(payload).get("id") == frame.id
    assert sum(call[3] for call in observer.calls) + observer.other_bytes == sub.bytes_sent


async def test_several_listeners_each_get_the_whole_send():
    class Giving(Listener):
        def __init__(self) -> None:
            self.observer = Recording()

        def connection_opened(self, info: ConnectionInfo) -> ConnectionObserver:
            return self.observer

    hooks, first, second = Hooks(), Giving(), Giving()
    hooks.connect(first)
    hooks.connect(second)
    fanout = hooks.connection_opened(info())
    wires, payloads, nbytes = one_send(NOTE, WARNING)
    fanout.frames_written((NOTE, WARNING), wires, payloads, nbytes)
    expected = [([NOTE, WARNING], wires, payloads, nbytes)]
    assert first.observer.calls == expected
    assert second.observer.calls == expected


async def test_records_keep_each_incident_of_one_send_with_its_own_payload():
    recorder = Recorder(flush_interval_s=3600, batch_size=1000)  # never flushed here
    record = ConnectionRecord(info(), opened_at=timezone.now(), recorder=recorder)
    recorder.opened(record)
    frames = (NOTE, WARNING, NOTE, EVICTED)
    wires, payloads, nbytes = one_send(*frames)
    record.frames_written(frames, wires, payloads, nbytes)
    assert (record.frames_sent, record.bytes_sent) == (4, nbytes)
    incidents = recorder._incidents
    assert [row["kind"] for row in incidents] == ["slow_client_warning", "client_evicted"]
    assert [row["payload"] for row in incidents] == [payloads[1].decode(), payloads[3].decode()]
    assert [row["event_id"] for row in incidents] == [40, 57]
    assert (record.end_detail, record.end_payload) == ("queue_overflow", payloads[3].decode())
    assert record.evictions_written == 1


async def test_the_feed_notes_each_incident_of_one_send_and_counts_every_frame():
    class Noting(OperatorFeed):
        def __init__(self) -> None:
            super().__init__()
            self.items: list[tuple[str, dict[str, Any]]] = []

        def note(self, kind: str, session_id: str, **fields: Any) -> None:
            self.items.append((kind, fields))

    feed = Noting()
    observer = feed.connection_opened(info())
    frames = (NOTE, WARNING, NOTE, EVICTED)
    wires, payloads, nbytes = one_send(*frames)
    observer.frames_written(frames, wires, payloads, nbytes)
    observer.closed("client_evicted")
    kinds = [kind for kind, _ in feed.items]
    assert kinds == [
        "subscriber_joined",
        "slow_client_warning",
        "client_evicted",
        "subscriber_left",
    ]
    assert feed.items[1][1]["lastEventId"] == 40
    assert feed.items[2][1]["droppedAfter"] == 57
    assert feed.items[3][1]["framesSent"] == 4
