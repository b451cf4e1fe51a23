"""A publish that timed out while Redis stalled, retried with its key, is stored once.

A private ``redis-server`` (never the machine's shared one) and ``python -m
qwenweb.serve`` with the Redis backend on it. SIGSTOP freezes Redis: the publish waits
out the server's command timeout (5 s) and answers 503 ``outcome_unknown``, while its
script waits in Redis's socket buffer. After SIGCONT Redis runs it: the event *is* stored. The
publisher, told 503, retries with the same ``Idempotency-Key``: the answer is the first id
(``Idempotent-Replayed: true``), and the session holds and streams that event once
(docs/protocol.md, "Idempotent publish"). Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.redis_server import PrivateRedis
from tests.support.server import (
    RemoteSession,
    ServerProcess,
    event_ids,
    free_port,
    open_stream,
    start_redis_server,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.own_backend, pytest.mark.asyncio]

PREFIX = "qwtest-stall"
STALL_BOUND_S = 15.0  # the publish answers after the 5 s command timeout


@pytest.fixture
def stalled_setup(
    e2e_database: Path, tmp_path: Path
) -> Iterator[tuple[PrivateRedis, ServerProcess]]:
    private = PrivateRedis(free_port(), tmp_path, persistent=False).start()
    try:
        server = start_redis_server(e2e_database, private.url, PREFIX, tmp_path / "server.log")
        try:
            yield private, server
        finally:
            server.stop()
    finally:
        if private.process is not None and private.process.poll() is None:
            os.kill(private.process.pid, signal.SIGCONT)  # a stopped process ignores SIGTERM
        private.stop()


def _post(server: ServerProcess, session: RemoteSession, key: str) -> tuple[int, Any, Any]:
    request = urllib.request.Request(
        f"{server.base_url}{session.events_path}",
        data=json.dumps({"type": "note", "data": "once"}).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {session.publish_token}",
            "Idempotency-Key": key,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=STALL_BOUND_S) as response:
            return response.status, json.loads(response.read()), response.headers
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), exc.headers


async def test_publish_timed_out_by_a_redis_stall_and_retried_with_its_key_is_stored_once(
    stalled_setup: tuple[PrivateRedis, ServerProcess],
) -> None:
    private, server = stalled_setup
    session = RemoteSession.create(server.base_url)
    session.publish("before")  # loads the session: Redis has its sequence
    assert private.process is not None
    answers: list[tuple[int, Any, Any]] = []
    os.kill(private.process.pid, signal.SIGSTOP)
    try:
        sender = threading.Thread(target=lambda: answers.append(_post(server, session, "k-1")))
        sender.start()
        sender.join(timeout=STALL_BOUND_S + 5)
    finally:
        os.kill(private.process.pid, signal.SIGCONT)
    assert answers, "the stalled publish never answered"
    status, body, headers = answers[0]
    assert (status, body["code"], headers["Retry-After"]) == (503, "outcome_unknown", "3")
    assert "same Idempotency-Key" in body["error"]
    with private.client() as client:  # Redis ran the waiting script once it resumed
        stream_key = f"{PREFIX}:s:{{{session.id}}}:stream"
        assert wait_for(lambda: client.xlen(stream_key) == 2, 10.0, 0.05)
    retried = _retry_until_answered(server, session)
    assert retried[0] == 200, retried
    assert retried[2]["Idempotent-Replayed"] == "true"
    notes = [e for e in session.load()["events"] if e["type"] == "note"]
    assert [e["id"] for e in notes] == [retried[1]["id"]]
    replay = await open_stream(server.port, session.events_path, session.read_token,
                               [("Last-Event-ID", "0")])  # fmt: skip
    try:
        await replay.read_until(lambda events: any(e.type == "replay_complete" for e in events))
    finally:
        replay.close()
    assert [e.type for e in replay.events] == ["before", "note", "replay_complete"]
    assert event_ids(replay.events)[1] == retried[1]["id"]


def _retry_until_answered(server: ServerProcess, session: RemoteSession) -> tuple[int, Any, Any]:
    """The publisher's retries: 503 while the server's reader reconnects, then the answer."""
    deadline = time.monotonic() + 20
    while True:
        answer = _post(server, session, "k-1")
        if answer[0] != 503 or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)
