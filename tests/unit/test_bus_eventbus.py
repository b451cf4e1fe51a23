"""``sessions.bus.eventbus.EventBus``: its constructor and limits (EB-1), closing (EB-9),
read-only state and stats (EB-10), the concurrency model (EB-11), ending subscribers
without closing (``disconnect_all``, ``disconnect``) and listing them (``subscriptions``).

Written from the contract (``docs/protocol.md``) as ``tests/unit/bus_support.py`` says.
"""

from __future__ import annotations

import asyncio
import sys

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
    SubscriberLimitExceededError,
    synthetic_frame,
)
from tests.unit.bus_support import (
    EPOCH_RE,
    REPO_ROOT,
    assert_one_line,
    drain,
    ev,
    label,
    pub,
    publish_n,
    take,
)

pytestmark = pytest.mark.asyncio


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
