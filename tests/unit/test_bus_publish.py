"""Publishing and the envelope (EB-2, "Frames"): ``EventBus.publish`` and
``sessions.bus.frame``.

Written from the contract (``docs/protocol.md``) as ``tests/unit/bus_support.py`` says.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from sessions.bus import EventBus
from tests.unit.bus_support import assert_one_line, drain, ev, pub, size, take, wire

pytestmark = pytest.mark.asyncio


# -- EB-2 and "Frames": publish and the envelope ------------------------------------------


async def test_publish_stamps_v_and_integer_millisecond_server_timestamp():  # EB-2
    bus = EventBus(3)
    before = time.time_ns() // 1_000_000
    frame = pub(bus, {"type": "t", "data": 1, "v": 7})
    after = time.time_ns() // 1_000_000
    assert frame["v"] == 1
    stamp = frame["_meta"]["serverTimestamp"]
    assert type(stamp) is int
    assert before <= stamp <= after


@pytest.mark.parametrize("stamp", [0, 123, -5, 1.5, 1e300])
async def test_publish_keeps_callers_finite_server_timestamp(stamp):  # EB-2, "Frames"
    frame = pub(EventBus(3), {"type": "t", "_meta": {"serverTimestamp": stamp, "k": "v"}})
    assert frame["_meta"] == {"serverTimestamp": stamp, "k": "v"}
    assert wire(frame)["_meta"]["serverTimestamp"] == stamp


@pytest.mark.parametrize("stamp", [math.nan, math.inf, -math.inf, True, False, "1", None, [1]])
async def test_publish_replaces_non_finite_or_non_number_server_timestamp(stamp):  # EB-2
    before = time.time_ns() // 1_000_000
    frame = pub(EventBus(3), {"type": "t", "_meta": {"serverTimestamp": stamp}})
    replaced = frame["_meta"]["serverTimestamp"]
    assert type(replaced) is int
    assert replaced >= before


async def test_publish_with_huge_int_server_timestamp_still_publishes():  # EB-2
    # A finite number too large for a float must not make publish drop the event.
    bus = EventBus(3)
    frame = pub(bus, {"type": "t", "data": 1, "_meta": {"serverTimestamp": 10**400}})
    assert frame is not None
    assert frame.id == 1
    assert bus.last_event_id == 1


async def test_publish_adds_meta_when_caller_gives_none_or_a_non_mapping():  # EB-2
    bus = EventBus(3)
    for meta in (None, "x", 5):
        frame = pub(bus, {"type": "t", "_meta": meta})
        assert type(frame["_meta"]["serverTimestamp"]) is int


async def test_envelope_keys_are_in_contract_order():  # "Frames"
    frame = pub(
        EventBus(3),
        {"originatorClientId": "c-1", "_meta": {}, "data": {"a": 1}, "type": "t", "id": 99},
    )
    assert list(frame) == ["id", "v", "type", "data", "_meta", "originatorClientId"]
    assert (frame["id"], frame["originatorClientId"], frame["data"]) == (1, "c-1", {"a": 1})


async def test_envelope_leaves_out_absent_keys():  # "Frames"
    frame = pub(EventBus(3), {"type": "t"})
    assert list(frame) == ["id", "v", "type", "_meta"]
    assert list(wire(frame)) == ["id", "v", "type", "_meta"]


async def test_frame_is_a_read_only_mapping():  # "Frames"
    frame = pub(EventBus(3), ev())
    assert isinstance(frame, Mapping)
    with pytest.raises(TypeError):
        frame["type"] = "other"  # type: ignore[index]


async def test_frame_json_is_compact_utf8_and_nbytes_is_its_length():  # "Frames"
    data = {"text": "héllo ✓ 日本", "list": [1, 2]}
    frame = pub(EventBus(3), {"type": "t", "data": data, "originatorClientId": "c"})
    expected = json.dumps(dict(frame), separators=(",", ":"), ensure_ascii=False).encode()
    assert frame.json == expected
    assert "日本".encode() in frame.json
    assert b"\\u" not in frame.json
    assert frame.nbytes == len(frame.json) == size(1, data) + len(',"originatorClientId":"c"')


async def test_frame_json_serializes_any_json_number_in_data():  # "Frames" ("any JSON value")
    frame = pub(EventBus(3), {"type": "t", "data": 2**64})
    expected = json.dumps(dict(frame), separators=(",", ":"), ensure_ascii=False).encode()
    assert frame.json == expected
    assert frame.nbytes == len(expected)


async def test_each_event_is_serialized_once_and_shared():  # "Frames"
    bus = EventBus(3)
    first, second = bus.subscribe(), bus.subscribe()
    published = bus.publish(ev())
    (a,), (b,) = await take(first, 1), await take(second, 1)
    assert a is b is published is bus.ring_snapshot()[-1]
    assert a.json is b.json is bus.ring_snapshot()[-1].json


async def test_publish_on_closed_bus_returns_none_and_consumes_no_id():  # EB-2
    bus = EventBus(3)
    bus.publish(ev())
    bus.close()
    assert bus.publish(ev()) is None
    assert (bus.last_event_id, bus.stats().published, bus.stats().ring_length) == (1, 1, 1)


@pytest.mark.parametrize(
    "event",
    [
        {"data": 1},
        {"type": ""},
        {"type": 5},
        {"type": None},
        {"type": b"t"},
        {"type": "a\rb"},
        {"type": "a\nb"},
        {"type": "a\0b"},
    ],
)
async def test_publish_with_unframable_type_returns_none_with_one_log_line(event, bus_log):  # EB-2
    bus = EventBus(3)
    assert bus.publish(event) is None
    assert_one_line(bus_log)
    assert bus.last_event_id == 0
    assert bus.stats().published == 0
    assert pub(bus, ev())["id"] == 1


@pytest.mark.parametrize("event", [None, "t", 5, [("type", "t")], object()])
async def test_publish_with_non_mapping_returns_none(event):  # EB-2
    bus = EventBus(3)
    assert bus.publish(event) is None
    assert bus.last_event_id == 0


async def test_publish_never_raises_even_when_the_mapping_does():  # EB-2
    class Exploding(Mapping[str, Any]):
        def __getitem__(self, key: str) -> Any:
            raise RuntimeError("boom")

        def __iter__(self) -> Iterator[str]:
            return iter(["type"])

        def __len__(self) -> int:
            return 1

    assert EventBus(3).publish(Exploding()) is None


@pytest.mark.parametrize("data", [object(), {1, 2}])
async def test_publish_with_unserializable_data_delivers_zero_byte_frame(data, bus_log):  # EB-2
    bus = EventBus(3)
    sub = bus.subscribe(max_queued=2)
    frame = pub(bus, {"type": "t", "data": data})
    assert frame is not None
    assert frame.nbytes == 0
    assert frame["data"] is data
    assert_one_line(bus_log)
    assert (bus.stats().published, sub.statistics().live_count) == (1, 1)
    assert await take(sub, 1) == [frame]


async def test_unserializable_frames_count_toward_max_queued():  # EB-2, EB-3
    bus = EventBus(3)
    sub = bus.subscribe(max_queued=2)
    for _ in range(3):
        bus.publish({"type": "t", "data": object()})
    assert bus.subscriber_count == 0
    assert (await drain(sub))[-1]["data"]["reason"] == "queue_overflow"
