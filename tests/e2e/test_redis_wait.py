"""``REDIS_WAIT_REPLICAS``: a publish is acknowledged only once replicas have it.

A private primary without replicas and one ``qwenweb.serve`` process asking for one
replica: the publish cannot be confirmed, so it answers 503 ``outcome_unknown`` with
``Retry-After``. Once a replica has joined, the same request retried with its
``Idempotency-Key`` answers its first result (the same id), and the event exists once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.failover_load import post_note
from tests.support.redis_sentinel import RedisProcess
from tests.support.server import (
    RawSSEClient,
    RemoteSession,
    ServerProcess,
    event_ids,
    start_redis_server,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.own_backend,
    pytest.mark.asyncio,
    pytest.mark.timeout(120),  # private Redis servers and two server processes, loaded machine
]

PREFIX = "qwtest-wait"
LINK_WAIT_S = 30.0


@pytest.fixture
def primary(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess.data_server(tmp_path / "primary")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def waiting_server(
    e2e_database: Path, primary: RedisProcess, tmp_path: Path
) -> Iterator[ServerProcess]:
    server = start_redis_server(
        e2e_database,
        f"redis://127.0.0.1:{primary.port}/0",
        PREFIX,
        tmp_path / "a.log",
        QWENWEB_REDIS_WAIT_REPLICAS="1",
        QWENWEB_REDIS_WAIT_TIMEOUT_MS="200",
    )
    try:
        yield server
    finally:
        server.stop()


def _wait_for_link(replica: RedisProcess) -> None:
    deadline = time.monotonic() + LINK_WAIT_S
    while time.monotonic() < deadline:
        try:
            with replica.client() as client:
                link = client.info("replication").get("master_link_status")
            if link == "up":
                return
        except (redis.RedisError, OSError):
            pass
        time.sleep(0.05)
    raise AssertionError("the replica did not link up in time")


async def test_unreplicated_publish_is_outcome_unknown_and_a_keyed_retry_confirms_it(
    primary: RedisProcess, waiting_server: ServerProcess, tmp_path: Path
) -> None:
    session = RemoteSession.create(waiting_server.base_url)
    status, body, headers = post_note(waiting_server, session, "k1")
    assert (status, body["code"]) == (503, "outcome_unknown"), body
    assert headers["retry-after"].isdigit()
    assert "Idempotency-Key" in body["error"]

    replica = RedisProcess.data_server(tmp_path / "replica", replica_of=primary.port)
    replica.start()
    try:
        _wait_for_link(replica)
        first = post_note(waiting_server, session, "k1")
        second = post_note(waiting_server, session, "k2")
    finally:
        replica.stop()

    assert (first[0], first[1]["id"]) == (200, 1), first
    assert (second[0], second[1]["id"]) == (200, 2), second
    headers_in = [
        ("Accept", "text/event-stream"),
        ("Authorization", f"Bearer {session.read_token}"),
        ("Last-Event-ID", "0"),
    ]
    client = await RawSSEClient(waiting_server.port, session.events_path, headers_in).connect()
    try:
        events = await client.read_until(lambda ev: 2 in event_ids(ev), timeout_s=20)
    finally:
        client.close()
    assert event_ids(events) == [1, 2]
