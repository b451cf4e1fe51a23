"""Several server processes sharing sessions through the machine's Redis.

Two ``python -m qwenweb.serve`` processes on 127.0.0.1 with ``QWENWEB_BACKEND=redis``, one
SQLite file and a key prefix of their own (so the shared Redis at 127.0.0.1:6379 is never
flushed or polluted: the prefix's keys are deleted at the end). Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sessions.wire import ServerSentEvent
from tests.support.server import (
    RemoteSession,
    ServerProcess,
    event_ids,
    get_json,
    open_stream,
    redis_cluster,
    request_json,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.own_backend, pytest.mark.asyncio]

PROCESS_TTL_S = 2.0


@dataclass
class Cluster:
    """Two server processes, ``a`` and ``b``, sharing one database and one Redis key prefix."""

    a: ServerProcess
    b: ServerProcess


@pytest.fixture
def cluster(e2e_database: Path, tmp_path: Path) -> Iterator[Cluster]:
    with redis_cluster(e2e_database, tmp_path, QWENWEB_PROCESS_TTL_S=str(PROCESS_TTL_S)) as start:
        yield Cluster(start("a"), start("b"))


def _json_events(events: list[ServerSentEvent]) -> list[dict[str, Any]]:
    return [json.loads(e.data) for e in events]


def _last_id_is(event_id: int) -> Any:
    """A ``read_until`` predicate: the last event read has ``event_id``."""
    return lambda events: bool(events) and json.loads(events[-1].data).get("id") == event_id


def _saw(event_type: str) -> Any:
    """A ``read_until`` predicate: an event of ``event_type`` was read."""
    return lambda events: any(e.type == event_type for e in events)


async def test_publish_on_a_reaches_subscribers_on_a_and_b_in_order(cluster: Cluster) -> None:
    """1,000 events published on A: readers on A and on B get ids 1..1000 exactly once."""
    session = RemoteSession.create(cluster.a.base_url)
    on_a = await open_stream(cluster.a.port, session.events_path, session.read_token)
    on_b = await open_stream(cluster.b.port, session.events_path, session.read_token)
    assert on_a.status == on_b.status == 200
    assert on_a.response_headers["x-event-epoch"] == on_b.response_headers["x-event-epoch"]
    ids = [session.publish("step", {"n": n}) for n in range(1000)]
    assert ids == list(range(1, 1001))
    got_a = await on_a.read_until(_last_id_is(1000), timeout_s=30)
    got_b = await on_b.read_until(_last_id_is(1000), timeout_s=30)
    assert event_ids(got_a) == list(range(1, 1001))
    assert event_ids(got_b) == list(range(1, 1001))
    assert [e["data"]["n"] for e in _json_events(got_b)] == list(range(1000))
    on_a.close()
    on_b.close()


async def test_resume_on_b_after_reading_40_on_a(cluster: Cluster) -> None:
    """Read 40 from A, reconnect to B with ``Last-Event-ID: 40``: 41.. onward, then live."""
    session = RemoteSession.create(cluster.a.base_url)
    on_a = await open_stream(cluster.a.port, session.events_path, session.read_token)
    for n in range(100):
        session.publish("step", {"n": n})
    first = await on_a.read_events(40)
    assert event_ids(first) == list(range(1, 41))
    epoch = on_a.response_headers["x-event-epoch"]
    on_a.close()
    on_b = await open_stream(
        cluster.b.port,
        session.events_path,
        session.read_token,
        [("Last-Event-ID", "40"), ("X-Event-Epoch", epoch)],
    )
    replay = list(await on_b.read_until(_saw("replay_complete")))
    assert event_ids(replay) == list(range(41, 101))
    assert json.loads(replay[-1].data)["data"] == {
        "replayedCount": 60,
        "lastReplayedEventId": 100,
    }
    assert session.publish("live") == 101
    live = (await on_b.read_events(len(replay) + 1))[len(replay) :]
    assert event_ids(live) == [101]
    on_b.close()


async def test_cursor_published_on_a_is_never_mistaken_on_b(cluster: Cluster) -> None:
    """A cursor B's mirror has not seen yet is waited for, not taken for another epoch."""
    session = RemoteSession.create(cluster.a.base_url)
    on_b_live = await open_stream(cluster.b.port, session.events_path, session.read_token)
    for _ in range(20):
        last = session.publish("burst")
        on_b = await open_stream(
            cluster.b.port, session.events_path, session.read_token, [("Last-Event-ID", str(last))]
        )
        frames = await on_b.read_until(_saw("replay_complete"))
        assert [e.type for e in frames] == ["replay_complete"], [e.data for e in frames]
        on_b.close()
    on_b_live.close()


async def test_ring_overflow_across_processes_gives_resync_on_b(cluster: Cluster) -> None:
    """Ring of 10: 30 events on A, a cursor at 5 on B -> ``state_resync_required``."""
    session = RemoteSession.create(cluster.a.base_url, ringSize=10)
    for _ in range(30):
        session.publish("step")
    on_b = await open_stream(
        cluster.b.port, session.events_path, session.read_token, [("Last-Event-ID", "5")]
    )
    frames = await on_b.read_until(_saw("replay_complete"))
    resync = json.loads(frames[0].data)
    assert resync["type"] == "state_resync_required"
    assert resync["data"] == {
        "reason": "ring_evicted",
        "lastDeliveredId": 5,
        "earliestAvailableId": 21,
    }
    assert event_ids(frames) == list(range(21, 31))
    on_b.close()


async def test_close_on_a_ends_streams_on_b(cluster: Cluster) -> None:
    """Closing on A: B's subscriber gets ``session_closed`` and its stream ends; B says 204."""
    session = RemoteSession.create(cluster.a.base_url)
    on_b = await open_stream(cluster.b.port, session.events_path, session.read_token)
    session.publish("step")
    status, body = request_json(
        "POST", f"{cluster.a.base_url}/session/{session.id}/close", {}, session.publish_token
    )
    assert status == 200, body
    frames = await on_b.read_to_end(timeout_s=10)
    assert [e.type for e in frames] == ["step", "session_closed"]
    on_b.close()
    again = await open_stream(cluster.b.port, session.events_path, session.read_token)
    again.close()
    assert again.status == 204
    status, body = request_json(
        "POST",
        f"{cluster.b.base_url}{session.events_path}",
        {"type": "late"},
        session.publish_token,
    )
    assert status == 409, body


def _cluster_subscribers(server: ServerProcess, session_id: str, token: str) -> int:
    return int(get_json(f"{server.base_url}/session/{session_id}", token)["subscriberCount"])


async def test_sigkill_of_a_leaves_b_alone_and_clients_resume_on_b(cluster: Cluster) -> None:
    """Kill A mid-stream: B's subscriber is unaffected, A's client resumes on B without
    loss, and the counts operators see drop A's subscribers within the TTL."""
    session = RemoteSession.create(cluster.b.base_url)
    on_a = await open_stream(cluster.a.port, session.events_path, session.read_token)
    on_b = await open_stream(cluster.b.port, session.events_path, session.read_token)
    for _ in range(50):
        session.publish("step")
    seen_a = await on_a.read_events(50)
    epoch = on_a.response_headers["x-event-epoch"]
    assert await asyncio.to_thread(
        wait_for, lambda: _cluster_subscribers(cluster.b, session.id, session.read_token) == 2, 10
    )
    cluster.a.kill()  # the main process and its worker
    # A's subscriber drops out of the sum within the TTL (plus one report interval).
    assert await asyncio.to_thread(
        wait_for,
        lambda: _cluster_subscribers(cluster.b, session.id, session.read_token) == 1,
        PROCESS_TTL_S * 3,
    )
    for _ in range(50):
        session.publish("step")
    resumed = await open_stream(
        cluster.b.port,
        session.events_path,
        session.read_token,
        [("Last-Event-ID", str(event_ids(seen_a)[-1])), ("X-Event-Epoch", epoch)],
    )
    replay = await resumed.read_until(_saw("replay_complete"))
    assert event_ids(seen_a) + event_ids(replay) == list(range(1, 101))
    got_b = await on_b.read_events(100)
    assert event_ids(got_b) == list(range(1, 101))
    assert await asyncio.to_thread(
        wait_for, lambda: _cluster_subscribers(cluster.b, session.id, session.read_token) == 2, 10
    )
    on_a.close()
    on_b.close()
    resumed.close()
