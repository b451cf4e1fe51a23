"""Issue 17: a publisher cannot grow a server's memory past the ring limits (real servers).

Each test starts its own ``python -m qwenweb.serve`` process with the default settings,
publishes over HTTP, and reads the server's resident memory (``/proc/<pid>/status``
``VmRSS``). The bounds are the issue's Done-when lines: 300 events of 1 MiB of string
data grow RSS by at most 160 MiB, and a resume from id 1 then starts with
``state_resync_required``; 50 events of 256 KiB whose ``data`` is a list of empty objects
grow it by at most 80 MiB. Both backends (Redis under a private key prefix). And a
second memory-backend process on the same database does not serve a session the first
one holds.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from sessions.auth import issue_token
from tests.support.backend import redis_url
from tests.support.server import (
    RemoteSession,
    ServerProcess,
    free_port,
    open_stream,
    redis_cluster,
    request_json,
    serve_argv,
    server_env,
)

MIB = 1024 * 1024


def _redis_answers() -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(redis_url(), socket_connect_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


# The events of 256 KiB of "{}" hold about 175,000 JSON values each: above the default
# PUBLISH_MAX_VALUES (100,000), and 50 of them pass the values quotas many times over.
# This module measures what such events cost in memory, so it lifts those limits.
_MANY_VALUES: Final = {
    "QWENWEB_PUBLISH_MAX_VALUES": "200000",
    "QWENWEB_PUBLISH_VALUES_PER_S": "1000000000",
    "QWENWEB_PUBLISH_USER_VALUES_PER_S": "1000000000",
}


@pytest.fixture
def memory_server(e2e_database: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    port = free_port()
    env = server_env(e2e_database, QWENWEB_BACKEND="memory", **_MANY_VALUES)
    server = ServerProcess(serve_argv(port), port, env, tmp_path / "serve.log").start()
    yield server
    server.stop()


@pytest.fixture
def redis_server(e2e_database: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    if not _redis_answers():
        pytest.skip(f"no Redis answers at {redis_url()} (the Redis case needs one)")
    with redis_cluster(e2e_database, tmp_path, redis_url=redis_url(), **_MANY_VALUES) as cluster:
        yield cluster("serve")


@pytest.fixture(params=["memory", "redis"])
def server(request: pytest.FixtureRequest) -> ServerProcess:
    found: ServerProcess = request.getfixturevalue(f"{request.param}_server")
    return found


class Publisher:
    """Publishes over one kept-alive HTTP connection (a 429 waits its Retry-After)."""

    def __init__(self, session: RemoteSession, port: int) -> None:
        self.session = session
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def publish(self, body: bytes, deadline: float) -> int:
        while True:
            self.conn.request(
                "POST",
                self.session.events_path,
                body,
                {
                    "Content-Type": "application/json",
                    "Authorization": f"Bearer {self.session.publish_token}",
                },
            )
            response = self.conn.getresponse()
            answer = json.loads(response.read())
            if response.status == 429 and time.monotonic() < deadline:
                time.sleep(float(response.headers.get("Retry-After", "1")))
                continue
            assert response.status == 200, answer
            return int(answer["id"])

    def close(self) -> None:
        self.conn.close()


def _publish_many(server: ServerProcess, session: RemoteSession, body: bytes, n: int) -> int:
    publisher = Publisher(session, server.port)
    deadline = time.monotonic() + 60
    try:
        last = 0
        for _ in range(n):
            last = publisher.publish(body, deadline)
        return last
    finally:
        publisher.close()


def _warm_up(server: ServerProcess) -> RemoteSession:
    """A first session and a few publishes, so imports and caches are in the baseline."""
    warm = RemoteSession.create(server.base_url)
    _publish_many(server, warm, json.dumps({"type": "note", "data": "x" * 1000}).encode(), 20)
    return warm


def _settled_rss_kib(server: ServerProcess) -> int:
    """RSS once it stops moving (the last publish's buffers freed), at most ~2 s."""
    previous = server.rss_kib()
    for _ in range(20):
        time.sleep(0.1)
        current = server.rss_kib()
        if abs(current - previous) < 1024:
            return current
        previous = current
    return server.rss_kib()


async def _first_frame(server: ServerProcess, session: RemoteSession, cursor: int) -> Any:
    client = await open_stream(
        server.port, session.events_path, session.read_token, [("Last-Event-ID", str(cursor))]
    )
    try:
        events = await client.read_events(1)
    finally:
        client.close()
    return events[0]


def test_300_events_of_1_mib_grow_rss_by_at_most_160_mib_and_old_cursor_resyncs(
    server: ServerProcess,
) -> None:
    _warm_up(server)
    session = RemoteSession.create(server.base_url)
    before = _settled_rss_kib(server)
    body = json.dumps({"type": "blob", "data": "y" * MIB}).encode()
    last = _publish_many(server, session, body, 300)
    grown_mib = (_settled_rss_kib(server) - before) / 1024
    assert last >= 300
    assert grown_mib <= 160, f"RSS grew by {grown_mib:.0f} MiB"
    first = asyncio.run(_first_frame(server, session, 1))
    assert first.type == "state_resync_required", first
    data = json.loads(first.data)["data"]
    assert data["reason"] == "ring_evicted"
    assert data["earliestAvailableId"] > 2
    print(f"grown_mib={grown_mib:.1f} earliest={data['earliestAvailableId']}")


def test_50_events_of_256_kib_of_empty_objects_grow_rss_by_at_most_80_mib(
    server: ServerProcess,
) -> None:
    _warm_up(server)
    session = RemoteSession.create(server.base_url)
    before = _settled_rss_kib(server)
    data = "[" + ",".join(["{}"] * (256 * 1024 // 3)) + "]"
    body = b'{"type":"objects","data":' + data.encode() + b"}"
    assert len(body) >= 256 * 1024
    _publish_many(server, session, body, 50)
    grown_mib = (_settled_rss_kib(server) - before) / 1024
    assert grown_mib <= 80, f"RSS grew by {grown_mib:.0f} MiB"
    snapshot = session.load()
    # All kept: 12.5 MiB is within RING_MAX_BYTES (the snapshot itself answers a page).
    assert (snapshot["earliestAvailableId"], snapshot["lastEventId"]) == (1, 50)
    print(f"grown_mib={grown_mib:.1f}")


@pytest.mark.own_backend
def test_a_second_memory_process_on_the_database_does_not_serve_a_held_session(
    memory_server: ServerProcess, e2e_database: Path, tmp_path: Path
) -> None:
    session = RemoteSession.create(memory_server.base_url)
    assert session.publish("note", "first") >= 1  # the first process holds it now
    port = free_port()
    second = ServerProcess(
        serve_argv(port),
        port,
        server_env(e2e_database, QWENWEB_BACKEND="memory"),
        tmp_path / "second.log",
    ).start()
    try:
        url = f"{second.base_url}{session.events_path}"
        status, body = request_json("POST", url, {"type": "note"}, token=session.publish_token)
        assert status == 503, body
        assert body["code"] == "session_held_elsewhere"
        assert "Redis backend" in body["error"]
        status, body = request_json(
            "GET", f"{second.base_url}/session/{session.id}", token=session.read_token
        )
        assert (status, body["code"]) == (503, "session_held_elsewhere")
        # Its own sessions are served, and the first process still serves this one.
        other = RemoteSession.create(second.base_url)
        assert other.publish("note") >= 1
        assert session.publish("note", "second") >= 2
        token = issue_token(session.id, ["read"], "e2e")
        first_url = f"{memory_server.base_url}/session/{session.id}"
        assert request_json("GET", first_url, None, token)[0] == 200
    finally:
        second.stop()
