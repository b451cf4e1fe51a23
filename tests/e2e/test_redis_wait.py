"""``REDIS_WAIT_REPLICAS``: a publish is acknowledged only once replicas have it.

A private primary without replicas and one ``qwenweb.serve`` process asking for one
replica: the publish cannot be confirmed, so it answers 503 ``outcome_unknown`` with
``Retry-After``. Once a replica has joined, the same request retried with its
``Idempotency-Key`` answers its first result (the same id), and the event exists once.

After the replica linked up a publish is still not promised a 200 at once: its ``WAIT``
(200 ms here) can pass before the replica's acknowledgement on a loaded machine, and the
answer is again 503 ``outcome_unknown``. The contract is the client's: retry with the
same key after ``Retry-After`` until confirmed (protocol.md, "Idempotent publish"). So
each keyed post after the link is retried as a client would, honoring ``Retry-After``,
for at most ``CONFIRM_WITHIN_S``; whatever the number of tries, each event is stored once
with its first id.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    # Private Redis servers and a server process on a loaded machine; each keyed post is
    # retried for at most CONFIRM_WITHIN_S.
    pytest.mark.timeout(150),
]

PREFIX = "qwtest-wait"
LINK_WAIT_S = 30.0
#: How long a keyed post is retried (after each answer's ``Retry-After``) until confirmed.
CONFIRM_WITHIN_S = 30.0


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


def _post_until_confirmed(
    server: ServerProcess, session: RemoteSession, key: str
) -> tuple[int, Any, list[tuple[int, str]]]:
    """POST the note ``key`` with its ``Idempotency-Key`` again after every 503 or lost
    connection, pausing its ``Retry-After`` (a client's retry), for at most
    ``CONFIRM_WITHIN_S``. Return the last status and body, and every refusal's
    ``(status, code)``."""
    refusals: list[tuple[int, str]] = []
    deadline = time.monotonic() + CONFIRM_WITHIN_S
    while True:
        status, body, headers = post_note(server, session, key)
        if status not in (503, 0) or time.monotonic() >= deadline:
            return status, body, refusals
        refusals.append((status, str(body.get("code", ""))))
        retry_after = float(headers.get("retry-after", "1"))
        time.sleep(min(retry_after, max(0.0, deadline - time.monotonic())))


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
        first = _post_until_confirmed(waiting_server, session, "k1")
        second = _post_until_confirmed(waiting_server, session, "k2")
    finally:
        replica.stop()

    assert (first[0], first[1].get("id")) == (200, 1), first
    assert (second[0], second[1].get("id")) == (200, 2), second
    # (the primary never went away: its only 503 is "not confirmed yet")
    refused = {code for status, code in first[2] + second[2] if status == 503}
    assert refused <= {"outcome_unknown"}, (first, second)
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
