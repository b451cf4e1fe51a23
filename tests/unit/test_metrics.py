"""The metrics listener's per-frame path (sessions.ops.metrics): plain counts, sampling."""

from __future__ import annotations

import uuid

import pytest

from sessions.bus import EventBus, Frame, synthetic_frame
from sessions.hooks import ConnectionInfo, ConnectionObserver
from sessions.ops.metrics import LATENCY_SAMPLES_PER_FLUSH, MAX_LATENCY_SAMPLES, Metrics

pytestmark = pytest.mark.django_db


def info(resumed_from: int | None = None) -> ConnectionInfo:
    return ConnectionInfo(
        uuid.uuid4(), "s", "token", None, "t", "127.0.0.1", "", "", 256, resumed_from
    )


def written(meter: ConnectionObserver, *frames: Frame) -> None:
    """Tell ``meter`` that one ``send`` wrote ``frames`` (each as ``x``)."""
    meter.frames_written(frames, (b"x",) * len(frames), (b"{}",) * len(frames), len(frames))


def test_a_busy_interval_makes_the_next_one_time_a_sample_of_deliveries():
    listener = Metrics()
    meter = listener.connection_opened(info())
    frame = EventBus(name="s").publish({"type": "note"})
    assert frame is not None
    for _ in range(100 * LATENCY_SAMPLES_PER_FLUSH):
        written(meter, frame)
    listener.flush()
    for _ in range(100 * LATENCY_SAMPLES_PER_FLUSH):
        written(meter, frame)
    timed = len(listener._totals.latencies)
    assert LATENCY_SAMPLES_PER_FLUSH <= timed <= 2 * LATENCY_SAMPLES_PER_FLUSH
    meter.closed("client_disconnect")


def test_replayed_events_are_not_timed_until_replay_complete():
    listener = Metrics()
    meter = listener.connection_opened(info(resumed_from=3))
    frame = EventBus(name="s").publish({"type": "note"})
    assert frame is not None
    written(meter, frame)
    assert listener._totals.latencies == []
    written(meter, synthetic_frame("replay_complete", {}))
    written(meter, frame)
    assert len(listener._totals.latencies) == 1
    meter.closed("client_disconnect")


def test_stream_errors_are_counted_by_code():
    listener = Metrics()
    meter = listener.connection_opened(info())
    written(meter, synthetic_frame("stream_error", {"code": "backend_unavailable"}))
    written(meter, synthetic_frame("stream_error", {"error": "boom"}))
    assert listener._totals.stream_errors == {"backend_unavailable": 1, "internal": 1}
    assert listener._totals.backend_unavailable == 1
    meter.closed("stream_error")


def test_one_send_of_several_frames_counts_each_and_ends_the_replay_where_it_ends():
    listener = Metrics()
    meter = listener.connection_opened(info(resumed_from=3))
    frame = EventBus(name="s").publish({"type": "note"})
    assert frame is not None
    totals = listener._totals
    frames_before, bytes_before = totals.frames, totals.bytes
    written(meter, frame, frame, synthetic_frame("replay_complete", {}), frame)
    assert (totals.frames - frames_before, totals.bytes - bytes_before) == (4, 4)
    assert len(totals.latencies) == 1  # only the frame after replay_complete is live
    meter.closed("client_disconnect")


def test_a_burst_after_a_quiet_interval_times_a_bounded_sample_spread_over_it():
    listener = Metrics()
    meter = listener.connection_opened(info())
    listener.flush()  # a quiet interval: the next one times every delivery, at first
    frames = []
    for _ in range(100):
        frame = EventBus(name="s").publish({"type": "note"})
        assert frame is not None
        frames.append(frame)
    for _ in range(1000):  # 100,000 deliveries in one interval
        written(meter, *frames)
    latencies = listener._totals.latencies
    assert LATENCY_SAMPLES_PER_FLUSH // 2 <= len(latencies) < MAX_LATENCY_SAMPLES
    assert (listener._totals.mask + 1) * MAX_LATENCY_SAMPLES >= 100_000  # 1 in 2**k timed
    meter.closed("client_disconnect")
