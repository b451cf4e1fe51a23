"""The snapshot's ``lastEventId`` names only ids that were issued (issue 26, EB-1)."""

from __future__ import annotations

from dataclasses import dataclass

from sessions.backends.snapshot import snapshot_page
from sessions.bus import EventBus


@dataclass
class _Live:
    bus: EventBus
    session_id: str = "s1"
    title: str = "t"
    created_at: str = "2024-12-01T10:00:00+00:00"


def _head(bus: EventBus) -> dict[str, object]:
    return snapshot_page(_Live(bus), limit=10, max_bytes=1 << 20).head


def test_a_rebuilt_bus_that_issued_nothing_names_no_id() -> None:
    # A memory-only server after a restart starts above the reserved ids: 100000 was
    # reserved, never issued, and must not be reported.
    head = _head(EventBus(ring_size=10, start_id=100_001))
    assert head["lastEventId"] is None
    assert head["earliestAvailableId"] == 100_001  # resume from 100000 with the epoch


def test_the_first_event_of_the_new_sequence_is_named() -> None:
    bus = EventBus(ring_size=10, start_id=100_001)
    bus.publish({"type": "note", "data": 1})
    assert _head(bus)["lastEventId"] == 100_001


def test_a_new_session_still_reports_zero() -> None:
    assert _head(EventBus(ring_size=10))["lastEventId"] == 0
