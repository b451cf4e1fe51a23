"""Redis with Sentinel: two server processes follow the primary through a failover.

Each test starts its own Sentinel group (:mod:`tests.support.redis_sentinel`: a primary,
replicas and three Sentinels on free 127.0.0.1 ports) and two ``python -m qwenweb.serve``
processes given only the Sentinels (``QWENWEB_REDIS_URL`` names a port where nothing
listens: its host and port must be ignored). The primary is killed with SIGKILL; the
processes must go on with the promoted replica without a restart: publishes answer 200
again, readers re-attach, ``/readyz`` is 200 again. The machine's shared Redis is never
touched; every wait is bounded.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.failover_load import post_note
from tests.support.redis_sentinel import FAILOVER_WAIT_S, SERVICE, SentinelGroup
from tests.support.server import (
    REPO,
    RawSSEClient,
    RemoteSession,
    ServerProcess,
    event_ids,
    free_port,
    request_json,
    server_env,
    start_redis_server,
    wait_for,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.own_backend,
    pytest.mark.asyncio,
    pytest.mark.timeout(180),  # a Sentinel group's set-up and failover, on a loaded machine
]

PREFIX = "qwtest-sentinel"


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelGroup]:
    group = SentinelGroup(tmp_path / "redis", replicas=1)
    try:
        yield group.start()
    finally:
        group.stop()


@pytest.fixture
def servers(
    e2e_database: Path, sentinels: SentinelGroup, tmp_path: Path
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    started: list[ServerProcess] = []
    # Nothing listens there: with Sentinels set, the URL's host and port are ignored.
    unused_url = f"redis://127.0.0.1:{free_port()}/0"
    try:
        for name in ("a", "b"):
            started.append(
                start_redis_server(
                    e2e_database,
                    unused_url,
                    PREFIX,
                    tmp_path / f"{name}.log",
                    QWENWEB_REDIS_SENTINELS=sentinels.sentinel_hosts,
                    QWENWEB_REDIS_SENTINEL_SERVICE=SERVICE,
                )
            )
        yield started[0], started[1]
    finally:
        for server in started:
            server.stop()


def _publish_until_accepted(server: ServerProcess, session: RemoteSession, key: str) -> int:
    """Retry one publish (same Idempotency-Key) until 200; only 503s meanwhile. Its id."""
    deadline = time.monotonic() + FAILOVER_WAIT_S
    while True:
        status, body, _ = post_note(server, session, key)
        if status == 200:
            return int(body["id"])
        assert status == 503, body
        assert time.monotonic() < deadline, f"still 503 after the failover: {body}"
        time.sleep(0.1)


def _link_changes(server: ServerProcess) -> dict[str, float]:
    """``qwenweb_backend_link_changes_total`` by event, from the server's ``/metrics``."""
    with urllib.request.urlopen(f"{server.base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    found = re.findall(r'^qwenweb_backend_link_changes_total\{event="(\w+)"\} (\S+)$', text, re.M)
    return {event: float(value) for event, value in found}


def _ready(server: ServerProcess) -> int:
    return request_json("GET", f"{server.base_url}/readyz")[0]


async def _stream(server: ServerProcess, session: RemoteSession, cursor: int) -> RawSSEClient:
    headers = [
        ("Accept", "text/event-stream"),
        ("Authorization", f"Bearer {session.read_token}"),
        ("Last-Event-ID", str(cursor)),
    ]
    return await RawSSEClient(server.port, session.events_path, headers).connect(timeout_s=30)


async def test_processes_follow_the_primary_through_a_failover_without_restart(
    sentinels: SentinelGroup, servers: tuple[ServerProcess, ServerProcess]
) -> None:
    a, b = servers
    session = RemoteSession.create(a.base_url)
    before = [_publish_until_accepted(a if n % 2 else b, session, f"k{n}") for n in range(4)]
    assert before == [1, 2, 3, 4]
    with sentinels.primary().client() as primary:  # the replica holds them all before the kill
        assert int(primary.execute_command("WAIT", 1, 10_000)) == 1
    pids = (a.process.pid, b.process.pid)  # type: ignore[union-attr]

    killed = sentinels.kill_primary()
    for server in (a, b):  # readiness tells the truth: no primary, not ready
        assert wait_for(lambda server=server: _ready(server) == 503, FAILOVER_WAIT_S)
    sentinels.wait_failover(killed.port)
    after = [_publish_until_accepted(s, session, f"k{4 + n}") for n, s in enumerate((a, b, a))]

    assert after == [5, 6, 7]
    for server in (a, b):  # each reader re-attached: it delivers everything, in order
        client = await _stream(server, session, 0)
        try:
            events = await client.read_until(lambda ev: 7 in event_ids(ev), timeout_s=30)
            assert event_ids(events) == [1, 2, 3, 4, 5, 6, 7], (client.status, server.log()[-3000:])
            assert all(e.type != "state_resync_required" for e in events)
        finally:
            client.close()
        assert _ready(server) == 200
    assert (a.process.pid, b.process.pid) == pids  # type: ignore[union-attr]
    for server in (a, b):  # each counted one failover (the reader reads from the new primary)
        assert wait_for(lambda server=server: _link_changes(server)["failover"] >= 1, 10)
        assert _link_changes(server)["lost"] >= 1

    sentinels.restart(killed)  # rejoins as a replica of the new primary
    sentinels.wait_ready()
    assert _publish_until_accepted(b, session, "k7") == 8


async def test_the_control_channel_follows_the_primary_through_a_failover(
    sentinels: SentinelGroup,
    servers: tuple[ServerProcess, ServerProcess],
    e2e_database: Path,
) -> None:
    # A revocation from a command process (a one-shot client through the Sentinels)
    # reaches both servers' control listeners, which re-subscribed on the new primary.
    a, b = servers
    session = RemoteSession.create(a.base_url)
    assert _publish_until_accepted(a, session, "k0") == 1
    killed = sentinels.kill_primary()
    sentinels.wait_failover(killed.port)
    assert _publish_until_accepted(b, session, "k1") == 2
    streams = [await _stream(server, session, 2) for server in (a, b)]
    try:
        env = {
            "QWENWEB_BACKEND": "redis",
            "QWENWEB_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
            "QWENWEB_REDIS_SENTINELS": sentinels.sentinel_hosts,
            "QWENWEB_REDIS_SENTINEL_SERVICE": SERVICE,
            "QWENWEB_REDIS_KEY_PREFIX": PREFIX,
        }
        channel = f"{PREFIX}:control"

        def both_listening() -> bool:
            with sentinels.primary().client() as primary:
                return int(primary.pubsub_numsub(channel)[0][1]) >= 2

        assert wait_for(both_listening, FAILOVER_WAIT_S, 0.2)  # re-subscribed on the new one
        done = subprocess.run(
            [sys.executable, "manage.py", "revoke_tokens", "--session", session.id],
            cwd=REPO, env=server_env(e2e_database, **env), check=True, timeout=60,
            capture_output=True,
        )  # fmt: skip
        for stream in streams:
            events = await stream.read_until(
                lambda ev: any(e.type == "stream_error" for e in ev), timeout_s=10
            )
            error = json.loads(next(e.data for e in events if e.type == "stream_error"))
            assert error["data"]["code"] == "token_revoked"
    finally:
        for stream in streams:
            stream.close()
    assert b"revocation_relayed processes=2" in done.stderr + done.stdout, done.stderr
