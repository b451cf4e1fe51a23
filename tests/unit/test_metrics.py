"""The metrics listener's per-frame path (sessions.ops.metrics): plain counts, sampling."""

from __future__ import annotations

import uuid

import pytest

from sessions.bus import EventBus, synthetic_frame
from sessions.hooks import ConnectionInfo
from sessions.ops.metrics import LATENCY_SAMPLES_PER_FLUSH, Metrics

pytestmark = pytest.mark.django_db


def info(resumed_from: int | None = None) -> ConnectionInfo:
    return ConnectionInfo(
        uuid.uuid4(), "s", "token", None, "t", "127.0.0.1", "", "", 256, resumed_from
    )


def test_a_busy_interval_makes_the_next_one_time_a_sample_of_deliveries():
    listener = Metrics()
    meter = listener.connection_opened(info())
    frame = EventBus(name="s").publish({"type": "note"})
    assert frame is not None
    for _ in range(100 * LATENCY_SAMPLES_PER_FLUSH):
        meter.frame_written(frame, b"x", b"{}")
    listener.flush()
    for _ in range(100 * LATENCY_SAMPLES_PER_FLUSH):
        meter.frame_written(frame, b"x", b"{}")
    timed = len(listener._totals.latencies)
    assert LATENCY_SAMPLES_PER_FLUSH <= timed <= 2 * LATENCY_SAMPLES_PER_FLUSH
    meter.closed("client_disconnect")


def test_replayed_events_are_not_timed_until_replay_complete():
    listener = Metrics()
    meter = listener.connection_opened(info(resumed_from=3))
    frame = EventBus(name="s").publish({"type": "note"})
    assert frame is not None
    meter.frame_written(frame, b"x", b"{}")
    assert listener._totals.latencies == []
    meter.frame_written(synthetic_frame("replay_complete", {}), b"x", b"{}")
    meter.frame_written(frame, b"x", b"{}")
    assert len(listener._totals.latencies) == 1
    meter.closed("client_disconnect")


def test_stream_errors_are_counted_by_code():
    listener = Metrics()
    meter = listener.connection_opened(info())
    meter.frame_written(
        synthetic_frame("stream_error", {"code": "backend_unavailable"}), b"x", b"{}"
    )
    meter.frame_written(synthetic_frame("stream_error", {"error": "boom"}), b"x", b"{}")
    assert listener._totals.stream_errors == {"backend_unavailable": 1, "internal": 1}
    assert listener._totals.backend_unavailable == 1
    meter.closed("stream_error")
