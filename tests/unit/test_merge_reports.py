"""``merge_reports``: the processes' reports summed into one ``BusStats`` per session."""

from __future__ import annotations

from typing import Any

from sessions.backends.reports import merge_reports


def figures(**overrides: Any) -> dict[str, Any]:
    """One session's figures in a process report (as ``get_backend()._make_report`` writes them)."""
    base: dict[str, Any] = {
        "published": 10,
        "slow_client_warnings": 0,
        "evictions": {},
        "resyncs": {},
        "replayed_frames": 0,
        "subscriber_count": 1,
        "peak_subscribers": 1,
        "ring_length": 10,
        "ring_size": 100,
        "earliest_id": 1,
        "last_event_id": 10,
        "epoch": "e1",
        "closed": False,
    }
    return {**base, **overrides}


def report(process: str, **sessions: dict[str, Any]) -> dict[str, Any]:
    return {"process": process, "at": 0.0, "sessions": sessions}


def test_merge_sums_subscribers_warnings_and_evictions_over_processes() -> None:
    merged = merge_reports(
        [
            report("a", s1=figures(subscriber_count=2, slow_client_warnings=1,
                                   evictions={"queue_overflow": 1}, peak_subscribers=3)),
            report("b", s1=figures(subscriber_count=3, slow_client_warnings=2,
                                   evictions={"queue_overflow": 1, "queue_bytes_overflow": 4},
                                   resyncs={"ring_evicted": 5}, replayed_frames=7)),
        ]
    )  # fmt: skip
    s1 = merged["s1"]
    assert (s1.subscriber_count, s1.slow_client_warnings, s1.peak_subscribers) == (5, 3, 4)
    assert dict(s1.evictions) == {"queue_overflow": 2, "queue_bytes_overflow": 4}
    assert (dict(s1.resyncs), s1.replayed_frames) == ({"ring_evicted": 5}, 7)


def test_merge_takes_the_ring_and_cursor_of_the_process_that_saw_most() -> None:
    behind = figures(published=8, last_event_id=8, ring_length=8, epoch="e1")
    ahead = figures(published=12, last_event_id=12, ring_length=12, earliest_id=2, epoch="e1")
    s1 = merge_reports([report("a", s1=behind), report("b", s1=ahead)])["s1"]
    assert (s1.published, s1.last_event_id, s1.ring_length, s1.earliest_id) == (12, 12, 12, 2)


def test_merge_keeps_sessions_loaded_in_one_process_only_and_filters_by_id() -> None:
    reports = [report("a", s1=figures(subscriber_count=2)), report("b", s2=figures())]
    assert {sid: s.subscriber_count for sid, s in merge_reports(reports).items()} == {
        "s1": 2,
        "s2": 1,
    }
    assert list(merge_reports(reports, ["s2"])) == ["s2"]


def test_merge_of_a_dead_process_is_gone_with_its_report() -> None:
    alive, dead = report("a", s1=figures(subscriber_count=1)), report("b", s1=figures())
    assert merge_reports([alive, dead])["s1"].subscriber_count == 2
    assert merge_reports([alive])["s1"].subscriber_count == 1  # its key expired: not read


def test_merge_does_not_change_the_reports() -> None:
    a = report("a", s1=figures(evictions={"queue_overflow": 1}))
    merge_reports([a, report("b", s1=figures(evictions={"queue_overflow": 1}))])
    assert a["sessions"]["s1"]["evictions"] == {"queue_overflow": 1}
