"""Redis Cluster: sessions sharded over three primaries, one primary killed under load.

A cluster of the test's own (:mod:`tests.support.redis_cluster`: 3 primaries, 3
replicas, ``cluster-node-timeout`` 1500 ms) and two ``python -m qwenweb.serve`` processes
given its seed nodes. Sessions are created until one lives on each primary; each gets a
keyed publisher (with retries) and a resuming reader on the other process. The primary of
one session is killed with SIGKILL and started again ``RESTART_AFTER_S`` later. What must
hold:

- on the other primaries no publish is refused and no stream ends;
- the victim's session resumes once its replica is promoted: its reader receives every
  acknowledged event exactly once, or ``state_resync_required`` first; never a silent
  gap nor a duplicate (the same checks as the Sentinel failover load);
- the killed server comes back as a replica; ``/readyz`` was 503 after the kill and is
  200 at the end; no qwenweb process restarted;
- each process counts the other one's readers (operator figures summed over processes).

``QWENWEB_SOAK_CLUSTER_FAILOVERS`` kills (1 here; ``make soak``: 3), the primaries of the
first two sessions in turn; the third session's primary is never killed, so it witnesses
every failover (not one refusal, one stream).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import astuple
from pathlib import Path

import pytest

from tests.support.failover_load import Publisher, Reader, ReadyProbe
from tests.support.redis_cluster import RedisCluster
from tests.support.server import (
    RemoteSession,
    ServerProcess,
    free_port,
    start_redis_server,
    wait_for,
)

PREFIX = "qwtest-cluster"
FAILOVERS = int(os.environ.get("QWENWEB_SOAK_CLUSTER_FAILOVERS", "1"))
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.own_backend,
    pytest.mark.asyncio,
    # Six redis-servers, two qwenweb processes, each failover's ~20 s, on a loaded machine.
    pytest.mark.timeout(150 + 60 * FAILOVERS),
]
RATE_PER_S = 40.0  # per session
RESTART_AFTER_S = 12.0
CATCH_UP_S = 30.0
LOAD_BEFORE_KILL_S = 3.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RedisCluster]:
    group = RedisCluster(tmp_path / "redis")
    try:
        yield group.start()
    finally:
        group.stop()


@pytest.fixture
def servers(
    e2e_database: Path, cluster: RedisCluster, tmp_path: Path
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    started: list[ServerProcess] = []
    try:
        for name in ("a", "b"):
            started.append(
                start_redis_server(
                    e2e_database,
                    f"redis://127.0.0.1:{free_port()}/0",  # ignored: the seeds say
                    PREFIX,
                    tmp_path / f"{name}.log",
                    QWENWEB_REDIS_CLUSTER=cluster.seeds,
                )
            )
        yield started[0], started[1]
    finally:
        for server in started:
            server.stop()


def _stream_key(session: RemoteSession) -> str:
    return f"{PREFIX}:s:{{{session.id}}}:stream"


def _one_session_per_primary(cluster: RedisCluster, base_url: str) -> list[RemoteSession]:
    """Create sessions until each of the three primaries serves one (bounded); the first
    is on the primary of slot 0: the cluster clients' *default node* (the first primary of
    ``CLUSTER SLOTS``), whose loss broke commands to the other primaries (issue 29)."""
    chosen: dict[int, RemoteSession] = {}
    for _ in range(60):
        session = RemoteSession.create(base_url)
        port = cluster.primary_port_of(_stream_key(session))
        if port is not None and port not in chosen:
            chosen[port] = session
        if len(chosen) == 3:
            first = cluster.primary_port_of("{06S}")  # a key of slot 0
            assert first in chosen, "slot 0 has no primary"
            return sorted(chosen.values(), key=lambda s: chosen[first] is not s)
    raise AssertionError(f"60 sessions landed on {len(chosen)} primaries only")


async def test_sessions_on_other_primaries_never_notice_a_primary_failover(
    cluster: RedisCluster, servers: tuple[ServerProcess, ServerProcess]
) -> None:
    a, b = servers
    pids = (a.pids(), b.pids())
    sessions = _one_session_per_primary(cluster, a.base_url)
    publishers = [Publisher((a, b), session, RATE_PER_S) for session in sessions]
    readers = [Reader(b if n % 2 else a, session) for n, session in enumerate(sessions)]
    probe = ReadyProbe(servers)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(reader.run(stop)) for reader in readers]
    kills: list[float] = []
    victims: set[int] = set()
    try:
        probe.start()
        for publisher in publishers:
            publisher.start()
        await asyncio.sleep(LOAD_BEFORE_KILL_S)  # load before the kill (the scenario)
        for round_ in range(FAILOVERS):
            victim = round_ % (len(sessions) - 1)  # the last session: never a victim
            victims.add(victim)
            key = _stream_key(sessions[victim])
            started = time.monotonic()
            killed = await asyncio.to_thread(cluster.kill_primary_of, key)
            kills.append(time.monotonic())
            await asyncio.to_thread(cluster.wait_failover, key, killed.port)
            await asyncio.sleep(max(0.0, started + RESTART_AFTER_S - time.monotonic()))
            await asyncio.to_thread(cluster.restart, killed)
            await asyncio.to_thread(cluster.wait_ok)
            assert await asyncio.to_thread(cluster.role, killed) == "slave"
            await asyncio.sleep(LOAD_BEFORE_KILL_S)
        for publisher in publishers:
            await asyncio.to_thread(publisher.finish)
        deadline = time.monotonic() + CATCH_UP_S
        while time.monotonic() < deadline and any(
            (r.cursor or 0) < max((p.event_id for p in pub.acked), default=0)
            for r, pub in zip(readers, publishers, strict=True)
        ):
            await asyncio.sleep(0.1)
        # Operator figures are summed over the processes' reports (written to several
        # slots): the process without a session's reader still counts that reader.
        for n, session in enumerate(sessions):
            other = RemoteSession(a.base_url if n % 2 else b.base_url, *astuple(session)[1:])
            counted = await asyncio.to_thread(
                wait_for, lambda s=other: s.load().get("subscriberCount") == 1, 10.0, 0.1
            )
            assert counted, (n, other.load())
    finally:
        for publisher in publishers:
            publisher.stop.set()
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        probe.finish()

    report = [
        (len(p.acked), p.codes, len(r.received), len(r.resyncs), r.streams)
        for p, r in zip(publishers, readers, strict=True)
    ]
    print(f"sessions={[(s.id, cluster.primary_port_of(_stream_key(s))) for s in sessions]}")
    print(f"victims={sorted(victims)} (acked, codes, received, resyncs, streams)={report}")
    for index, (publisher, reader) in enumerate(zip(publishers, readers, strict=True)):
        assert publisher.failures == [], publisher.failures[:5]
        assert len(publisher.acked) > 0
        assert reader.violations == [], reader.violations[:10]
        if index not in victims:
            assert publisher.codes == {}, (index, report)  # not one refusal
            assert reader.streams == 1, (index, report)  # its stream never ended
        if not reader.resyncs:
            missing = [p.key for p in publisher.acked if reader.received.get(p.key, 0) != 1]
            assert missing == [], (index, len(missing), missing[:10])
    assert (a.pids(), b.pids()) == pids  # no process restarted
    for server in servers:
        for kill in kills:
            assert 503 in probe.statuses(server, kill, kill + 30), "readyz stayed 200"
        assert probe.statuses(server, 0, time.monotonic())[-1] == 200
