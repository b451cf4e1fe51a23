"""Tests for sessions.wire.framing's FrameEncoder and synthetic frames (EB-2, EB-18).

Each test cites the rule it checks. Caches are tiny (2 entries) so eviction is three
frames away.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sessions.bus import EventBus, Frame, synthetic_frame
from sessions.wire import (
    FrameEncoder,
    ServerSentEvent,
    SSEParser,
    encode_frame,
    encode_synthetic,
    synthetic_payload,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
TS = 1_700_000_000_000


def event(bus: EventBus, data: Any = "x") -> Frame:
    frame = bus.publish({"type": "t", "data": data, "_meta": {"serverTimestamp": TS}})
    assert frame is not None
    return frame


def parse(wire: bytes) -> list[ServerSentEvent]:
    events: list[ServerSentEvent] = []
    parser = SSEParser(events.append)
    parser.feed_bytes(wire)
    return events


def data_line(wire: bytes) -> bytes:
    (line,) = [line for line in wire.split(b"\n") if line.startswith(b"data: ")]
    return line.removeprefix(b"data: ")


# -- real events: framed once, cached ---------------------------------------------------


def test_event_is_framed_with_id_type_and_the_frames_json():  # EB-18
    frame = event(EventBus(3))
    assert frame.json is not None
    assert FrameEncoder().event(frame) == b"id: 1\nevent: t\ndata: " + frame.json + b"\n\n"


def test_cache_hit_returns_the_same_bytes_object():  # EB-18: framed once per event
    encoder, frame = FrameEncoder(), event(EventBus(3))
    first = encoder.event(frame)
    assert encoder.event(frame) is first
    assert encoder.encode(frame) is first
    assert len(encoder) == 1


def test_cache_of_two_evicts_the_oldest_on_the_third_frame():  # EB-18, bounded memory
    bus, encoder = EventBus(3), FrameEncoder(cache_size=2)
    one, two, three = event(bus), event(bus), event(bus)
    wire_one, wire_two = encoder.event(one), encoder.event(two)
    encoder.event(three)
    assert len(encoder) == 2
    assert encoder.event(two) is wire_two
    again = encoder.event(one)
    assert again == wire_one
    assert again is not wire_one


def test_cache_drops_the_oldest_events_beyond_its_byte_budget():  # EB-21: memory bounded
    bus = EventBus(3)
    one, two = event(bus, "a" * 100), event(bus, "b" * 100)
    per_event = len(FrameEncoder().event(one)) + one.nbytes
    encoder = FrameEncoder(max_cache_bytes=per_event + 10)
    encoder.event(one)
    encoder.event(two)
    assert len(encoder) == 1  # the budget holds one event: the newest
    assert encoder.event(two) is encoder.event(two)


def test_newest_event_is_cached_even_when_larger_than_the_budget():  # EB-18
    encoder, frame = FrameEncoder(max_cache_bytes=1), event(EventBus(3), "x" * 100)
    assert encoder.event(frame) is encoder.event(frame)
    assert len(encoder) == 1


def test_cache_hit_requires_the_same_frame_not_just_its_id():  # EB-18
    bus, encoder = EventBus(3), FrameEncoder()
    frame, other = event(bus, "a"), event(bus, "b")
    assert frame.json is not None
    encoder._cache[id(frame)] = (other, b"bytes of another frame")
    assert encoder.event(frame) == encode_frame(event_type="t", data_json=frame.json, event_id=1)


def test_unserializable_event_gets_null_data_and_a_data_error_uncached():  # EB-2
    encoder, frame = FrameEncoder(), event(EventBus(3), {1, 2})
    assert frame.json is None
    wire = encoder.event(frame)
    (sse,) = parse(wire)
    assert (sse.last_event_id, sse.type) == ("1", "t")
    envelope = json.loads(sse.data)
    assert envelope["data"] is None
    assert envelope["_meta"] == {"serverTimestamp": TS, "dataError": "not JSON-serializable"}
    assert len(encoder) == 0


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_cache_size_and_byte_budget_must_be_positive_ints(bad):
    with pytest.raises(ValueError, match="cache_size"):
        FrameEncoder(cache_size=bad)
    with pytest.raises(ValueError, match="max_cache_bytes"):
        FrameEncoder(max_cache_bytes=bad)


# -- synthetic frames: stamped when written, never cached --------------------------------


def test_synthetic_payload_is_exactly_the_data_line():  # EB-18
    wire, data_json = FrameEncoder().synthetic(synthetic_frame("replay_complete", {"n": 0}))
    assert data_line(wire) == data_json
    assert wire == b"event: replay_complete\ndata: " + data_json + b"\n\n"


def test_synthetic_frame_has_no_id_and_is_stamped_now():  # EB-18, SC-9
    before = time.time_ns() // 1_000_000
    wire, data_json = synthetic_payload(synthetic_frame("x", 1))
    after = time.time_ns() // 1_000_000
    assert not wire.startswith(b"id:")
    envelope = json.loads(data_json)
    assert envelope == {"v": 1, "type": "x", "data": 1, "_meta": envelope["_meta"]}
    assert before <= envelope["_meta"]["serverTimestamp"] <= after


def test_encode_dispatches_synthetic_frames_and_does_not_cache_them():  # EB-18
    encoder, frame = FrameEncoder(), synthetic_frame("x", 1)
    (sse,) = parse(encoder.encode(frame))
    assert (sse.type, sse.last_event_id) == ("x", "")
    assert json.loads(sse.data)["data"] == 1
    assert len(encoder) == 0


def test_encode_synthetic_is_the_wire_half_of_the_payload():  # EB-18
    wire = encode_synthetic(synthetic_frame("x", 1))
    assert wire.startswith(b"event: x\ndata: ")
    assert json.loads(data_line(wire))["type"] == "x"


def test_event_refuses_a_synthetic_frame():  # EB-18: synthetic frames carry no id
    with pytest.raises(ValueError, match="synthetic"):
        FrameEncoder().event(synthetic_frame("x", 1))


# -- layout -------------------------------------------------------------------------------


def test_import_wire_in_fresh_interpreter_loads_no_django_or_redis():  # style "Layout"
    code = (
        "import sys, sessions.wire; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'redis')))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, timeout=20, check=False
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().strip() == "[]"
