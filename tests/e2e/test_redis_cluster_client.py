"""The cluster client of the Redis backend while a primary is dead (issue 29).

A cluster of the test's own (:mod:`tests.support.redis_cluster`) and the backend's own
client (``redis_clients.async_cluster``). The primary killed is the one that client
uses as its *default node* (redis-py 8.1 reloads its command table there at every
slot-map refresh), and its replica is killed first, so no failover can end the outage
while the test runs: what the test sees does not depend on the election's timing. A
pipeline that reaches the dead primary makes redis-py refresh its slot map (as the
backend's process reports and idempotency recalls do); commands to the other primaries
must go on answering: not one refused, whatever the dead node.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import exceptions as redis_errors

from sessions.backends.redis_clients import RedisTarget, async_cluster
from tests.support.redis_cluster import RedisCluster

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.own_backend,
    pytest.mark.asyncio,
    pytest.mark.timeout(150),  # six redis-servers started on a loaded machine
]
ROUNDS = int(os.environ.get("QWENWEB_SOAK_CLUSTER_CLIENT_ROUNDS", "200"))
SCRIPT = "return redis.call('INCR', KEYS[1])"  # a script, as every publish is


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[RedisCluster]:
    group = RedisCluster(tmp_path / "redis")
    try:
        yield group.start()
    finally:
        group.stop()


def _key_per_primary(cluster: RedisCluster) -> dict[int, str]:
    """One key (its own hash tag) on each primary's slots, by primary port (bounded)."""
    keys: dict[int, str] = {}
    for n in range(10_000):
        key = f"qwtest-cluster-client:{{{n}}}"
        port = cluster.primary_port_of(key)
        if port is not None:
            keys.setdefault(port, key)
        if len(keys) == 3:
            return keys
    raise AssertionError(f"keys landed on {len(keys)} primaries only")


def _replica_ports_of(cluster: RedisCluster, primary_port: int) -> list[int]:
    for _start, _end, primary, *replicas in cluster._slots():
        if int(primary[1]) == primary_port:
            return [int(replica[1]) for replica in replicas]
    return []


async def test_a_dead_default_node_refuses_no_command_to_the_other_primaries(
    cluster: RedisCluster,
) -> None:
    target = RedisTarget(url="redis://", cluster=tuple(("127.0.0.1", n.port) for n in cluster.nodes))
    client = async_cluster(target, max_connections=8, connect_timeout_s=1.0, socket_timeout_s=5.0)
    script = client.register_script(SCRIPT)
    try:
        await client.initialize()
        victim = client.get_default_node().port
        keys = _key_per_primary(cluster)
        healthy = [key for port, key in keys.items() if port != victim]
        for key in healthy:  # warm: the script is loaded, the connections open
            await script(keys=[key])
        replicas = _replica_ports_of(cluster, victim)
        assert replicas, "the default node has no replica to kill first"
        for port in replicas:  # no failover can end the outage during the test
            cluster.node(port).kill()
        cluster.node(victim).kill()

        # A pipeline over keys of several slots (the process reports) reaches the dead
        # node: redis-py gives up on it and refreshes its slot map.
        with pytest.raises((redis_errors.ConnectionError, redis_errors.ClusterDownError)):
            async with client.pipeline(transaction=False) as pipe:
                pipe.set(keys[victim], b"1")
                pipe.set(healthy[0], b"1")
                await pipe.execute()

        refused: list[str] = []
        for _ in range(ROUNDS):
            for key in healthy:
                try:
                    await script(keys=[key])
                    await client.get(key)
                except redis_errors.RedisError as exc:
                    refused.append(f"{key}: {type(exc).__name__}: {exc}")
        assert refused == [], (len(refused), refused[:3])
        counts = [int(await client.get(key)) for key in healthy]
        assert counts == [1 + ROUNDS] * len(healthy)  # each ran once per round, no more
    finally:
        await client.aclose()
