"""sessions/backends/closed_history.py: how long a closed session's history is kept."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from sessions.backends.closed_history import ClosedHistories, closed_bus, history_kept
from sessions.bus import EventBus, Frame


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_closed_history_is_kept_until_the_retention_passes() -> None:
    clock = Clock()
    kept: ClosedHistories[str] = ClosedHistories(60.0, clock=clock)
    kept.keep("s1", "history")
    clock.now += 59.9
    assert kept.get("s1") == "history"
    clock.now += 0.1
    assert kept.get("s1") is None
    assert len(kept) == 0


def test_prune_drops_only_what_is_past_the_retention() -> None:
    clock = Clock()
    kept: ClosedHistories[str] = ClosedHistories(10.0, clock=clock)
    kept.keep("old", "a")
    clock.now += 5
    kept.keep("new", "b")
    clock.now += 5
    assert kept.prune() == 1
    assert (kept.get("old"), kept.get("new")) == (None, "b")


def test_past_the_count_the_oldest_closed_goes_first() -> None:
    kept: ClosedHistories[int] = ClosedHistories(60.0, max_kept=2, clock=Clock())
    for n in range(3):
        kept.keep(f"s{n}", n)
    assert [kept.get(f"s{n}") for n in range(3)] == [None, 1, 2]


def test_no_retention_keeps_nothing() -> None:
    kept: ClosedHistories[int] = ClosedHistories(0.0, clock=Clock())
    kept.keep("s1", 1)
    assert kept.get("s1") is None


def test_history_kept_compares_the_close_time_with_the_retention() -> None:
    now = timezone.now()
    assert history_kept(now - timedelta(seconds=10), 60.0)
    assert not history_kept(now - timedelta(seconds=61), 60.0)
    assert not history_kept(None, 60.0)
    assert not history_kept(now, 0.0)


def test_closed_bus_holds_the_contiguous_frames_and_is_closed() -> None:
    frames = [Frame.from_json(n, "note", b'{"id":%d}' % n) for n in (5, 6, 8)]
    bus = closed_bus(EventBus(ring_size=10, start_id=5), frames)
    assert [f.id for f in bus.ring_snapshot()] == [5, 6]
    assert bus.closed
