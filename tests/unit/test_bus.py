"""Unit tests for the session event bus, written from the contract (EB-1 ... EB-11).

Source: ``docs/protocol.md``: its rule index, "Frames" (the envelope) and "Errors and limits"
(the constants); comments name those sections in quotes. Each test cites the rule it checks.
Caps are tiny (ring 3, max_queued 2 or 4, byte caps of a few hundred bytes) so that every
edge is two or three publishes away. Every wait is bounded by ``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import sessions.bus.eventbus as eventbus_module
from sessions.bus import (
    DEFAULT_MAX_QUEUED,
    DEFAULT_MAX_QUEUED_BYTES,
    DEFAULT_MAX_SUBSCRIBERS,
    DEFAULT_RING_SIZE,
    EVENT_SCHEMA_VERSION,
    MAX_EVENT_RING_SIZE,
    WARN_RESET_RATIO,
    WARN_THRESHOLD_RATIO,
    EventBus,
    Frame,
    SubscriberLimitExceededError,
    Subscription,
    synthetic_frame,
)

pytestmark = pytest.mark.asyncio

REPO_ROOT = Path(__file__).resolve().parents[2]
TS = 1_700_000_000_000  # a caller-supplied serverTimestamp keeps frame sizes predictable
EPOCH_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


# -- helpers --------------------------------------------------------------------------


def ev(data: Any = "x", type_: str = "t") -> dict[str, Any]:
    """An event whose frame size is known in advance (see ``size``)."""
    return {"type": type_, "data": data, "_meta": {"serverTimestamp": TS}}


def size(event_id: int, data: Any = "x", type_: str = "t") -> int:
    """UTF-8 length of the compact JSON of ``ev(data, type_)`` published as ``event_id``."""
    envelope = {"id": event_id, "v": 1, "type": type_, "data": data}
    envelope["_meta"] = {"serverTimestamp": TS}
    return len(json.dumps(envelope, separators=(",", ":"), ensure_ascii=False).encode())


def label(frame: Mapping[str, Any]) -> int | str:
    """An event's id, or a synthetic frame's type: enough to compare streams in one line."""
    return frame["id"] if "id" in frame else frame["type"]


async def take(sub: Subscription, n: int) -> list[Frame]:
    async with asyncio.timeout(1):
        return [await anext(sub) for _ in range(n)]


async def drain(sub: Subscription) -> list[Frame]:
    """Every remaining frame; fails (TimeoutError) if the iterator does not end."""
    async with asyncio.timeout(1):
        return [frame async for frame in sub]


def pub(bus: EventBus, event: Any) -> Frame:
    """Publish and return the frame, failing the test if publish refused it."""
    frame = bus.publish(event)
    assert frame is not None, "publish returned None"
    return frame


def wire(frame: Frame) -> Any:
    """The frame's serialized bytes, parsed back."""
    assert frame.json is not None
    return json.loads(frame.json)


def publish_n(bus: EventBus, n: int) -> None:
    for _ in range(n):
        assert bus.publish(ev()) is not None


class _Collect(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def bus_log() -> Iterator[list[logging.LogRecord]]:
    """Records of the bus logger (attached directly: settings may stop propagation)."""
    records: list[logging.LogRecord] = []
    handler = _Collect(records)
    logger = logging.getLogger(eventbus_module.logger.name)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield records
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def assert_one_line(records: list[logging.LogRecord]) -> None:
    assert len(records) == 1, [r.getMessage() for r in records]
    text = logging.Formatter().format(records[0])
    assert "\n" not in text, text


# -- "Errors and limits": constants ---------------------------------------------------


async def test_constants_have_contract_values():  # "Errors and limits"
    assert EVENT_SCHEMA_VERSION == 1
    assert (DEFAULT_RING_SIZE, MAX_EVENT_RING_SIZE) == (8000, 1_000_000)
    assert (DEFAULT_MAX_QUEUED, DEFAULT_MAX_QUEUED_BYTES) == (256, 2 * 1024 * 1024)
    assert DEFAULT_MAX_SUBSCRIBERS == 64
    assert (WARN_THRESHOLD_RATIO, WARN_RESET_RATIO) == (0.75, 0.375)


# -- EB-1: constructor ----------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, 2**53, True, 1.5, "1024", None])
async def test_constructor_with_bad_max_queued_bytes_raises_type_error(bad):  # EB-1
    with pytest.raises(TypeError):
        EventBus(3, max_queued_bytes=bad)


async def test_constructor_accepts_max_queued_bytes_at_both_bounds():  # EB-1
    assert EventBus(3, max_queued_bytes=1).publish(ev()) is not None
    assert EventBus(3, max_queued_bytes=2**53 - 1).publish(ev()) is not None


@pytest.mark.parametrize("bad", [0, -1, 1_000_001])
async def test_constructor_with_ring_size_out_of_range_raises_value_error_naming_range(
    bad,
):  # EB-1
    with pytest.raises(ValueError, match=r"1_000_000|1000000|1,000,000") as info:
        EventBus(bad)
    assert "ring_size" in str(info.value)


async def test_constructor_accepts_ring_size_at_both_bounds():  # EB-1
    for ring_size in (1, MAX_EVENT_RING_SIZE):
        bus = EventBus(ring_size)
        publish_n(bus, 2)
        assert bus.stats().ring_length == min(2, ring_size)


async def test_default_ring_keeps_8000_events():  # EB-1, "Errors and limits"
    bus = EventBus()
    publish_n(bus, 8001)
    assert (bus.stats().ring_length, bus.stats().earliest_id) == (8000, 2)


async def test_default_max_subscribers_is_64():  # EB-1, EB-6
    bus = EventBus()
    subs = [bus.subscribe() for _ in range(64)]
    with pytest.raises(SubscriberLimitExceededError) as info:
        bus.subscribe()
    assert (info.value.limit, bus.subscriber_count, len(subs)) == (64, 64, 64)


async def test_default_caps_are_256_frames_and_2_mib():  # EB-1, EB-6, "Errors and limits"
    bus = EventBus()
    sub = bus.subscribe()
    publish_n(bus, 192)  # 75 % of 256
    warning = (await take(sub, 193))[-1]
    assert warning["type"] == "slow_client_warning"
    assert (warning["data"]["maxQueued"], warning["data"]["maxQueuedBytes"]) == (256, 2 << 20)


async def test_ids_start_at_start_id_and_increase_by_one():  # EB-1, EB-2
    bus = EventBus(3, start_id=10)
    assert bus.last_event_id == 9
    assert [pub(bus, ev())["id"] for _ in range(3)] == [10, 11, 12]
    assert bus.last_event_id == 12


async def test_ids_start_at_1_by_default():  # EB-2, "Frames"
    bus = EventBus(3)
    assert [pub(bus, ev())["id"] for _ in range(2)] == [1, 2]
    assert bus.last_event_id == 2


async def test_ring_of_one_million_is_accepted_and_ring_drops_oldest():  # EB-2 (O(1) ring)
    assert EventBus(MAX_EVENT_RING_SIZE).stats().ring_length == 0
    bus = EventBus(3)
    publish_n(bus, 5)
    assert [frame.id for frame in bus.ring_snapshot()] == [3, 4, 5]


async def test_import_bus_in_fresh_interpreter_loads_no_django():  # EB-1, style "Layout"
    code = "import sys, sessions.bus; print(sorted(m for m in sys.modules if m[:6] == 'django'))"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(20):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip() == "[]"


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


# -- EB-9: close ----------------------------------------------------------------------


async def test_close_drains_queued_frames_then_ends_iteration():  # EB-9
    bus = EventBus(3)
    sub = bus.subscribe()
    publish_n(bus, 2)
    bus.close()
    assert (bus.closed, bus.subscriber_count) == (True, 0)
    assert [label(f) for f in await drain(sub)] == [1, 2]


async def test_close_ends_pending_iteration_in_another_task():  # EB-9
    bus = EventBus(3)
    sub = bus.subscribe()
    pending = asyncio.create_task(drain(sub))
    await asyncio.sleep(0)  # one step: the task starts and blocks in __anext__
    bus.close()
    async with asyncio.timeout(1):
        assert await pending == []


async def test_close_is_idempotent():  # EB-9
    bus = EventBus(3)
    sub = bus.subscribe()
    publish_n(bus, 1)
    bus.close()
    bus.close()
    assert bus.closed
    assert [label(f) for f in await drain(sub)] == [1]
    assert bus.publish(ev()) is None
    assert await drain(bus.subscribe()) == []


# -- EB-10: read-only state and stats --------------------------------------------------


async def test_last_event_id_is_start_id_minus_one_before_any_publish():  # EB-10
    bus = EventBus(3, start_id=5)
    assert bus.last_event_id == 4
    assert bus.stats().last_event_id == 4
    publish_n(bus, 1)
    assert bus.last_event_id == 5


@pytest.mark.parametrize("name", ["last_event_id", "subscriber_count", "closed", "epoch"])
async def test_bus_state_is_read_only(name):  # EB-10
    bus = EventBus(3)
    before = getattr(bus, name)
    with pytest.raises(AttributeError):
        setattr(bus, name, "changed")
    assert getattr(bus, name) == before


async def test_epoch_is_a_token_per_bus_instance():  # EB-10
    first, second = EventBus(3), EventBus(3)
    assert EPOCH_RE.fullmatch(first.epoch)
    assert EPOCH_RE.fullmatch(second.epoch)
    assert first.epoch != second.epoch
    publish_n(first, 2)
    assert first.stats().epoch == first.epoch


async def test_stats_on_new_bus():  # EB-10
    stats = EventBus(3, start_id=10).stats()
    assert (stats.published, stats.ring_length, stats.earliest_id) == (0, 0, None)
    assert (stats.last_event_id, stats.subscriber_count, stats.peak_subscribers) == (9, 0, 0)
    assert (stats.slow_client_warnings, stats.replayed_frames) == (0, 0)
    assert not any(stats.evictions.values())
    assert not any(stats.resyncs.values())


async def test_stats_count_per_reason_and_peak():  # EB-10
    bus = EventBus(3, max_queued_bytes=10)
    frames_sub, bytes_sub = bus.subscribe(max_queued=1), bus.subscribe(max_queued=5)
    publish_n(bus, 5)  # 2 evicts both; ring: 3 4 5
    bus.subscribe(last_event_id=1).abort()  # ring_evicted, replays 3
    bus.subscribe(last_event_id=9).abort()  # epoch_reset, replays 3
    stats = bus.stats()
    assert dict(stats.evictions) == {"queue_overflow": 1, "queue_bytes_overflow": 1}
    assert dict(stats.resyncs) == {"ring_evicted": 1, "epoch_reset": 1}
    assert (stats.published, stats.replayed_frames, stats.slow_client_warnings) == (5, 6, 2)
    assert (stats.peak_subscribers, stats.subscriber_count) == (2, 0)
    assert (stats.ring_length, stats.earliest_id, stats.last_event_id) == (3, 3, 5)
    assert frames_sub.evicted
    assert bytes_sub.evicted


async def test_stats_is_a_snapshot_and_touches_no_queue():  # EB-10
    bus = EventBus(3)
    sub = bus.subscribe()
    publish_n(bus, 2)
    before = bus.stats()
    publish_n(bus, 1)
    assert (before.published, before.last_event_id, before.subscriber_count) == (2, 2, 1)
    assert [label(f) for f in await take(sub, 3)] == [1, 2, 3]


# -- EB-11: concurrency model ----------------------------------------------------------


async def test_module_docstring_states_the_concurrency_model():  # EB-11
    doc = eventbus_module.__doc__ or ""
    assert "not thread-safe" in doc
    assert "call_soon_threadsafe" in doc
    assert "async_to_sync" in doc


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


# -- disconnect_all: EB-9 semantics without closing the bus -------------------------------


async def test_disconnect_all_drains_queued_frames_then_terminal_frame_then_ends():  # EB-9
    bus = EventBus(3)
    sub = bus.subscribe()
    publish_n(bus, 2)
    assert bus.disconnect_all("operator") == 1
    frames = await drain(sub)
    assert [label(f) for f in frames] == [1, 2, "stream_error"]
    data = {"error": "disconnected by the server", "code": "server_disconnect"}
    assert dict(frames[-1]) == {
        "v": 1,
        "type": "stream_error",
        "data": data | {"reason": "operator"},
    }
    assert sub.end_reason == "disconnected"


async def test_disconnect_all_detaches_every_subscriber_at_once_and_keeps_the_bus_open():
    # EB-9 (drain, empty subscriber set) but publish and subscribe go on (EB-2, EB-6)
    bus = EventBus(3)
    first, second = bus.subscribe(), bus.subscribe()
    assert bus.disconnect_all("x") == 2
    assert (bus.subscriber_count, bus.closed) == (0, False)
    later = bus.subscribe()
    publish_n(bus, 1)
    assert [label(f) for f in await take(later, 1)] == [1]
    assert [label(f) for f in await drain(first)] == ["stream_error"]
    assert [label(f) for f in await drain(second)] == ["stream_error"]


async def test_disconnect_all_ends_pending_iteration_in_another_task():  # EB-9
    bus = EventBus(3)
    sub = bus.subscribe()
    pending = asyncio.create_task(drain(sub))
    await asyncio.sleep(0)  # one step: the task starts and blocks in __anext__
    bus.disconnect_all("x")
    async with asyncio.timeout(1):
        assert [label(f) for f in await pending] == ["stream_error"]


async def test_disconnect_all_logs_one_line_naming_session_and_count(bus_log):
    bus = EventBus(3, name="s-1")
    bus.subscribe()
    bus.disconnect_all("operator")
    assert_one_line(bus_log)
    assert bus_log[0].getMessage() == (
        "subscribers_disconnected session=s-1 count=1 reason=operator"
    )


async def test_disconnect_all_without_subscribers_returns_zero_and_logs_nothing(bus_log):
    bus = EventBus(3)
    assert bus.disconnect_all("x") == 0
    bus.close()
    assert bus.disconnect_all("x") == 0
    assert bus_log == []


async def test_abort_after_disconnect_keeps_remaining_frames():  # EB-8
    bus = EventBus(3)
    sub = bus.subscribe()
    publish_n(bus, 1)
    bus.disconnect_all("x")
    sub.abort()
    assert [label(f) for f in await drain(sub)] == [1, "stream_error"]
    assert sub.end_reason == "disconnected"


# -- disconnect: one subscriber, EB-9 semantics ---------------------------------------------


async def test_disconnect_drains_queued_frames_then_terminal_frame_then_ends():  # EB-9
    bus = EventBus(3)
    sub = bus.subscribe()
    publish_n(bus, 2)
    assert bus.disconnect(sub, "operator") is True
    frames = await drain(sub)
    assert [label(f) for f in frames] == [1, 2, "stream_error"]
    assert frames[-1]["data"]["reason"] == "operator"
    assert frames[-1]["data"]["code"] == "server_disconnect"
    assert sub.end_reason == "disconnected"


async def test_disconnect_detaches_only_that_subscriber_and_keeps_the_bus_open():  # EB-9
    bus = EventBus(3)
    gone, sibling = bus.subscribe(), bus.subscribe()
    bus.disconnect(gone, "x")
    assert (bus.subscriber_count, bus.closed) == (1, False)
    publish_n(bus, 1)
    assert [label(f) for f in await take(sibling, 1)] == [1]
    assert [label(f) for f in await drain(gone)] == ["stream_error"]


async def test_disconnect_with_frame_writes_that_terminal_frame():  # EB-9
    bus = EventBus(3)
    sub = bus.subscribe()
    terminal = synthetic_frame("stream_error", {"code": "backend_unavailable"})
    bus.disconnect(sub, "redis", frame=terminal)
    assert await drain(sub) == [terminal]


async def test_disconnect_ends_pending_iteration_in_another_task():  # EB-9
    bus = EventBus(3)
    sub = bus.subscribe()
    pending = asyncio.create_task(drain(sub))
    await asyncio.sleep(0)  # one step: the task starts and blocks in __anext__
    bus.disconnect(sub, "x")
    async with asyncio.timeout(1):
        assert [label(f) for f in await pending] == ["stream_error"]


async def test_disconnect_of_a_subscription_not_attached_returns_false(bus_log):  # EB-8, EB-9
    bus, other = EventBus(3), EventBus(3)
    aborted, foreign = bus.subscribe(), other.subscribe()
    aborted.abort()
    assert bus.disconnect(aborted, "x") is False
    assert bus.disconnect(foreign, "x") is False
    assert other.subscriber_count == 1
    closed = bus.subscribe()
    bus.close()
    assert bus.disconnect(closed, "x") is False
    assert closed.end_reason == "closed"
    assert bus_log == []


async def test_disconnect_logs_one_line_naming_session_subscriber_and_reason(bus_log):
    bus = EventBus(3, name="s-1")
    bus.disconnect(bus.subscribe(label="c-1"), "operator")
    assert_one_line(bus_log)
    assert bus_log[0].getMessage() == (
        "subscriber_disconnected session=s-1 subscriber=c-1 reason=operator"
    )


# -- subscriptions(): the attached subscribers ------------------------------------------------


async def test_subscriptions_lists_attached_subscribers_in_attach_order():  # EB-6, EB-8
    bus = EventBus(3)
    first, second, third = bus.subscribe(), bus.subscribe(), bus.subscribe()
    assert bus.subscriptions() == (first, second, third)
    second.abort()
    assert bus.subscriptions() == (first, third)


async def test_subscriptions_leave_out_evicted_and_disconnected_and_closed():  # EB-5, EB-9
    bus = EventBus(3)
    evicted, disconnected, kept = (bus.subscribe(max_queued=n) for n in (1, 9, 9))
    publish_n(bus, 2)  # the second live frame overflows max_queued=1
    bus.disconnect(disconnected, "x")
    assert evicted.evicted
    assert bus.subscriptions() == (kept,)
    bus.close()
    assert bus.subscriptions() == ()


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
