"""The SSE route against a real daphne process, read with raw sockets (EB-18, EB-20, EB-22)."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.support.backend import memory_only, redis_only
from tests.support.server import (
    RemoteSession,
    ServerProcess,
    daphne_argv,
    event_ids,
    free_port,
    open_stream,
    server_env,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio, pytest.mark.transport_only]


async def test_frames_arrive_one_by_one_while_stream_is_open(daphne_server: ServerProcess) -> None:
    # EB-18: nothing is held until the stream ends.
    session = RemoteSession.create(daphne_server.base_url)
    client = await open_stream(daphne_server.port, session.events_path, session.read_token)
    assert client.status == 200
    assert client.body.startswith(b"retry: 3000\n\n") or client.body == b""
    for expected in (1, 2, 3):
        assert session.publish("note", {"n": expected}) == expected
        events = await client.read_events(expected, timeout_s=5)
        assert event_ids(events) == list(range(1, expected + 1))
    assert not client.ended
    client.close()


async def test_retry_is_first_bytes_before_any_event(daphne_server: ServerProcess) -> None:
    # EB-18: `retry: 3000` is written at once (daphne sends no headers before body bytes).
    session = RemoteSession.create(daphne_server.base_url)
    client = await open_stream(daphne_server.port, session.events_path, session.read_token)
    await client.read_until(lambda events: len(client.body) >= 13, timeout_s=5)
    assert bytes(client.body[:13]) == b"retry: 3000\n\n"
    assert client.response_headers["content-type"] == "text/event-stream"
    assert client.response_headers["x-event-epoch"] == session.load()["epoch"]
    client.close()


async def test_disconnect_removes_subscriber_within_one_second(
    daphne_server: ServerProcess,
) -> None:
    # EB-20
    session = RemoteSession.create(daphne_server.base_url)
    client = await open_stream(daphne_server.port, session.events_path, session.read_token)
    assert session.load()["subscriberCount"] == 1
    client.close()
    gone = await asyncio.to_thread(wait_for, lambda: session.load()["subscriberCount"] == 0, 1.0)
    assert gone, "subscriber still counted 1 s after the socket closed"


async def test_reconnect_with_last_event_id_resumes_without_gap_or_duplicate(
    daphne_server: ServerProcess,
) -> None:
    # EB-7 / EB-13: publish 100, read 40, drop, resume with Last-Event-ID: 40.
    session = RemoteSession.create(daphne_server.base_url)
    first = await open_stream(daphne_server.port, session.events_path, session.read_token)
    for n in range(100):
        session.publish("note", {"n": n})
    await first.read_events(40)
    assert event_ids(first.events[:40]) == list(range(1, 41))
    first.close()
    second = await open_stream(
        daphne_server.port, session.events_path, session.read_token, [("Last-Event-ID", "40")]
    )
    events = await second.read_until(lambda evs: any(e.type == "replay_complete" for e in evs))
    assert event_ids(events) == list(range(41, 101))
    assert events[-1].type == "replay_complete"
    assert json.loads(events[-1].data)["data"] == {"replayedCount": 60, "lastReplayedEventId": 100}
    session.publish("note", {"n": "live"})
    live = await second.read_events(len(events) + 1)
    assert event_ids(live)[-1] == 101
    assert event_ids(live).count(101) == 1
    second.close()


async def test_idle_heartbeat_comment_keeps_stream_alive(daphne_server: ServerProcess) -> None:
    # EB-18: `: heartbeat` while idle (the server runs with a 1 s interval here).
    session = RemoteSession.create(daphne_server.base_url)
    client = await open_stream(daphne_server.port, session.events_path, session.read_token)
    await client.read_until(lambda events: b": heartbeat\n\n" in client.body, timeout_s=5)
    assert b": heartbeat\n\n" in client.body
    assert client.events == []  # a comment never reaches the application (SC-4)
    client.close()


async def test_idle_streams_add_no_server_threads(daphne_server: ServerProcess) -> None:
    # EB-22: 200 idle streams, the server's thread count does not grow.
    session = RemoteSession.create(daphne_server.base_url)
    warm = [await open_stream(daphne_server.port, session.events_path, session.read_token)]
    before = daphne_server.thread_count()
    clients = []
    for _ in range(4):  # 4 sessions x 50 streams: under the 64-subscriber limit per session
        target = RemoteSession.create(daphne_server.base_url)
        for _ in range(50):
            clients.append(
                await open_stream(daphne_server.port, target.events_path, target.read_token)
            )
    assert all(c.status == 200 for c in clients)
    after = daphne_server.thread_count()
    for client in [*warm, *clients]:
        client.close()
    print(f"threads before={before} after={after}")
    assert after <= before, f"threads grew from {before} to {after} with 200 open streams"


@memory_only(
    "a restarted server starts a new id sequence; with Redis it outlives the process "
    "(test_restart_with_redis_resumes_the_old_cursor_exactly)"
)
async def test_restart_answers_old_cursor_with_resync_never_reused_ids(
    e2e_database, tmp_path
) -> None:
    # docs/protocol.md, "Ids and epochs" / EB-7: after a restart ids continue above every id
    # issued before.
    port = free_port()
    server = ServerProcess(daphne_argv(port), port, server_env(e2e_database), tmp_path / "d.log")
    server.start()
    try:
        session = RemoteSession.create(server.base_url)
        for n in range(5):
            session.publish("note", {"n": n})
        server.stop()
        server.start()
        new_id = session.publish("note", {"n": "after restart"})
        assert new_id > 5
        client = await open_stream(
            port, session.events_path, session.read_token, [("Last-Event-ID", "5")]
        )
        events = await client.read_until(lambda evs: any(e.type == "replay_complete" for e in evs))
        assert events[0].type == "state_resync_required"
        assert json.loads(events[0].data)["data"]["reason"] == "ring_evicted"
        assert event_ids(events) == [new_id]
        client.close()
    finally:
        server.stop()


@redis_only("the id sequence outlives the process there")
async def test_restart_with_redis_resumes_the_old_cursor_exactly(e2e_database, tmp_path) -> None:
    # The Redis backend: ids, epoch and the ring live in Redis; a restarted server serves them on.
    port = free_port()
    server = ServerProcess(daphne_argv(port), port, server_env(e2e_database), tmp_path / "d.log")
    server.start()
    try:
        session = RemoteSession.create(server.base_url)
        for n in range(5):
            session.publish("note", {"n": n})
        server.stop()
        server.start()
        assert session.publish("note", {"n": "after restart"}) == 6
        client = await open_stream(
            port, session.events_path, session.read_token, [("Last-Event-ID", "5")]
        )
        events = await client.read_until(lambda evs: any(e.type == "replay_complete" for e in evs))
        client.close()
        assert [e.type for e in events] == ["note", "replay_complete"]
        assert event_ids(events) == [6]
    finally:
        server.stop()
