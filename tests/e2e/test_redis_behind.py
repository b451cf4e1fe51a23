"""A Redis that comes back *behind* what it acknowledged: never a silent gap (EB-7).

What a Sentinel failover to a lagging replica does, made deterministic on one private
``redis-server``: the session's keys are put back (``DUMP`` / ``RESTORE``) to how they were
a few events earlier and every client connection is dropped (``CLIENT KILL``), as the
promotion does. Then the other process, which never saw the lost events, publishes new
ones under the same ids. A client that had received the lost events must get
``state_resync_required`` when it resumes, never the stream continuing over ids that now
name other events.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.redis_server import PrivateRedis
from tests.support.server import (
    RawSSEClient,
    RemoteSession,
    ServerProcess,
    event_ids,
    free_port,
    start_redis_server,
    wait_for,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.own_backend,
    pytest.mark.asyncio,
    pytest.mark.timeout(120),  # private Redis servers and two server processes, loaded machine
]

PREFIX = "qwtest-behind"
RECOVERY_S = 20.0


@pytest.fixture
def servers(
    e2e_database: Path, tmp_path: Path
) -> Iterator[tuple[PrivateRedis, ServerProcess, ServerProcess]]:
    private = PrivateRedis(free_port(), tmp_path, persistent=False).start()
    started: list[ServerProcess] = []
    try:
        for name in ("a", "b"):
            started.append(
                start_redis_server(e2e_database, private.url, PREFIX, tmp_path / f"{name}.log")
            )
        yield private, started[0], started[1]
    finally:
        for server in started:
            server.stop()
        private.stop()


def _session_keys(session_id: str) -> list[str]:
    return [f"{PREFIX}:s:{{{session_id}}}:{part}" for part in ("meta", "stream")]


async def _stream(server: ServerProcess, session: RemoteSession, cursor: int) -> RawSSEClient:
    headers = [
        ("Accept", "text/event-stream"),
        ("Authorization", f"Bearer {session.read_token}"),
        ("Last-Event-ID", str(cursor)),
    ]
    return await RawSSEClient(server.port, session.events_path, headers).connect(timeout_s=30)


def _publish_until_accepted(server: ServerProcess, session: RemoteSession, data: str) -> int:
    remote = RemoteSession(server.base_url, session.id, session.read_token, session.publish_token)
    ids: list[int] = []

    def attempt() -> bool:
        try:
            ids.append(remote.publish("note", data))
        except AssertionError:  # 503 while the readers reconnect
            return False
        return True

    assert wait_for(attempt, RECOVERY_S, 0.2), server.log()[-3000:]
    return ids[0]


async def test_a_redis_behind_with_ids_reissued_by_another_process_gives_resync(
    servers: tuple[PrivateRedis, ServerProcess, ServerProcess],
) -> None:
    private, a, b = servers
    session = RemoteSession.create(a.base_url)
    assert [session.publish("note", f"old-{n}") for n in range(1, 4)] == [1, 2, 3]
    with private.client() as redis:
        behind = {key: redis.dump(key) for key in _session_keys(session.id)}
    assert [session.publish("note", f"old-{n}") for n in range(4, 6)] == [4, 5]
    client = await _stream(a, session, 0)
    await client.read_until(lambda ev: 5 in event_ids(ev), timeout_s=RECOVERY_S)
    client.close()

    with private.client() as redis:  # the promoted replica had only 1..3
        for key, value in behind.items():
            redis.restore(key, 0, value, replace=True)
        redis.client_kill_filter(_type="normal", skipme=True)
    # b never saw 4 and 5: it issues those ids again, for other events.
    assert [_publish_until_accepted(b, session, f"new-{n}") for n in (4, 5)] == [4, 5]

    resumed = await _stream(a, session, 5)
    try:
        events = await resumed.read_until(
            lambda ev: any(e.type == "state_resync_required" for e in ev) or len(ev) >= 1,
            timeout_s=RECOVERY_S,
        )
        assert events, bytes(resumed.body)
        assert events[0].type == "state_resync_required", [e.data for e in events]
        assert all(json.loads(e.data).get("data") != "new-4" for e in events)
    finally:
        resumed.close()
