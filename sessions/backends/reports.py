"""Process reports: a process's live figures as JSON, and their sums over processes;
one subscriber's row for operators (:func:`subscriber_row`).

A multi-process backend writes each process's report to its shared store with a time to
live; operators see the sums over the live processes (:func:`merge_reports`). Pure
functions; nothing here does I/O.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from sessions.bus import BusStats, EventBus, Subscription

__all__ = [
    "make_report",
    "merge_reports",
    "stats_to_json",
    "subscriber_lag",
    "subscriber_row",
]


def subscriber_row(
    process: str, bus: EventBus, subscription: Subscription, bytes_per_second: int = 0
) -> dict[str, Any]:
    """One row of ``Backend.list_subscribers`` for a ``subscription`` attached to ``bus``.

    Shape: ``{"id", "process", "user", "clientId", "address", "transport", "since"
    (epoch s), "lastEventId" (None before any event), "lag" (events behind the head; a
    forked epoch's gap counts none), "queuedFrames", "queuedBytes", "bytesPerSecond"}``;
    ``user``, ``clientId``, ``address`` and ``transport`` (``sse``/``ws``) come from the
    details the transport attached (``""`` when none; ``transport`` ``sse``);
    ``bytesPerSecond`` is the caller's sample (:class:`~sessions.backends.rates.ByteRates`).
    Never raises, never touches more than the queue's counters.
    """
    queue = subscription.statistics()
    details: Mapping[str, Any] = subscription.details or {}
    return {
        "id": subscription.label,
        "process": process,
        "user": str(details.get("user", "")),
        "clientId": str(details.get("clientId", "")),
        "address": str(details.get("address", "")),
        "transport": str(details.get("transport", "sse")),
        "since": subscription.since,
        "lastEventId": subscription.last_event_id,
        "lag": subscriber_lag(bus, subscription),
        "queuedFrames": queue.live_count + queue.forced_count,
        "queuedBytes": queue.live_bytes,
        "bytesPerSecond": bytes_per_second,
    }


def subscriber_lag(bus: EventBus, subscription: Subscription) -> int:
    """Events ``subscription`` is behind the head of ``bus`` (>= 0): those after the last
    it was sent (or all the bus holds, before any), less a forked epoch's gap. Never
    raises."""
    last_sent = subscription.last_event_id
    head = bus.last_event_id
    behind_from = last_sent if last_sent is not None else bus.start_id - 1
    lag = head - behind_from
    if bus.gap is not None and behind_from <= bus.gap[0] < head:
        lag -= bus.gap[1] - bus.gap[0] - 1
    return max(0, lag)


def stats_to_json(stats: BusStats) -> dict[str, Any]:
    """Return one session's :class:`BusStats` as the JSON object a report holds."""
    return {
        "published": stats.published,
        "slow_client_warnings": stats.slow_client_warnings,
        "evictions": dict(stats.evictions),
        "resyncs": dict(stats.resyncs),
        "replayed_frames": stats.replayed_frames,
        "subscriber_count": stats.subscriber_count,
        "peak_subscribers": stats.peak_subscribers,
        "ring_length": stats.ring_length,
        "ring_size": stats.ring_size,
        "earliest_id": stats.earliest_id,
        "last_event_id": stats.last_event_id,
        "epoch": stats.epoch,
        "closed": stats.closed,
    }


def make_report(
    stats: Mapping[str, BusStats], subscribers: Mapping[str, Sequence[Mapping[str, Any]]]
) -> dict[str, Any]:
    """Return a process report: ``{"at": <epoch s>, "sessions": {id: figures},
    "subscribers": {id: [subscriber rows]}}`` (rows as ``Backend.list_subscribers``)."""
    return {
        "at": time.time(),
        "sessions": {sid: stats_to_json(s) for sid, s in stats.items()},
        "subscribers": {sid: list(rows) for sid, rows in subscribers.items() if rows},
    }


def merge_reports(
    reports: Sequence[Mapping[str, Any]], session_ids: Iterable[str] | None = None
) -> dict[str, BusStats]:
    """Sum the processes' reports into one :class:`BusStats` per session (operators).

    Subscriber counts, warnings, evictions, resyncs and replayed frames are sums over the
    processes; ``peak_subscribers`` is the sum of the processes' peaks (an upper bound);
    ``published``, ``last_event_id`` and the ring figures come from the process that has
    seen the most events. Never raises on a well-formed report.
    """
    wanted = None if session_ids is None else set(session_ids)
    merged: dict[str, dict[str, Any]] = {}
    for report in reports:
        for session_id, figures in (report.get("sessions") or {}).items():
            if wanted is not None and session_id not in wanted:
                continue
            into = merged.get(session_id)
            if into is None:
                merged[session_id] = {
                    **figures,
                    "evictions": dict(figures["evictions"]),
                    "resyncs": dict(figures["resyncs"]),
                }
                continue
            for name in ("slow_client_warnings", "replayed_frames", "subscriber_count"):
                into[name] += figures[name]
            into["peak_subscribers"] += figures["peak_subscribers"]
            for name in ("evictions", "resyncs"):
                for reason, count in figures[name].items():
                    into[name][reason] = into[name].get(reason, 0) + count
            if figures["last_event_id"] > into["last_event_id"]:
                for name in ("published", "last_event_id", "ring_length", "earliest_id", "epoch"):
                    into[name] = figures[name]
            into["closed"] = into["closed"] or figures["closed"]
    return {
        session_id: BusStats(
            **{
                **figures,
                "evictions": MappingProxyType(figures["evictions"]),
                "resyncs": MappingProxyType(figures["resyncs"]),
            }
        )
        for session_id, figures in merged.items()
    }
