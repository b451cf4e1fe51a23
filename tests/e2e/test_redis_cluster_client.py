"""The cluster client of the Redis backend while a primary is dead (issue 29).

A cluster of the test's own (:mod:`tests.support.redis_cluster`) and the backend's own
client (``redis_clients.async_cluster``). The primary killed is the one that client
uses as its *default node* (redis-py 8.1 reloads its command table there at every
slot-map refresh), and its replica is killed first, so no failover can end the outage
while the test runs: what the test sees does not depend on the election's timing. A
pipeline that reaches the dead primary makes redis-py refresh its slot map (as the
backend's process reports and idempotency recalls do); commands to the other primaries
must go on answering: not one refused, whatever the dead node.

A publish is not idempotent without its Idempotency-Key: the backend's cluster publish
(``cluster_script_once``) must not send a script again once it may have run (its reply
was lost), and loads a script missing on a node (a promoted replica) on that node.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from redis import exceptions as redis_errors

from sessions.backends.redis_clients import RedisTarget, async_cluster, cluster_script_once
from tests.support.redis_cluster import RedisCluster
from tests.support.server import wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.own_backend,
    pytest.mark.asyncio,
    pytest.mark.timeout(150),  # six redis-servers started on a loaded machine
]
ROUNDS = int(os.environ.get("QWENWEB_SOAK_CLUSTER_CLIENT_ROUNDS", "200"))
SCRIPT = "return redis.call('INCR', KEYS[1])"  # a script, as every publish is
#: Counts its runs, then stays busy ARGV[1] microseconds (longer than the socket timeout).
SLOW_SCRIPT = """
redis.call('INCR', KEYS[1])
local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start > tonumber(ARGV[1])
return 1
"""


def _client(cluster: RedisCluster) -> Any:
    seeds = tuple(("127.0.0.1", n.port) for n in cluster.nodes)
    target = RedisTarget(url="redis://", cluster=seeds)
    return async_cluster(target, max_connections=8, connect_timeout_s=1.0, socket_timeout_s=5.0)


async def _close(client: Any) -> None:
    """Close every connection (the backend's cluster client's ``aclose`` closes none)."""
    await client.close_connections()


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


def _kill_for_good(cluster: RedisCluster, primary_port: int) -> None:
    """Kill a primary and, first, its replicas: no failover can end the outage while the
    test runs."""
    replicas = _replica_ports_of(cluster, primary_port)
    assert replicas, "the primary has no replica to kill first"
    for port in replicas:
        cluster.node(port).kill()
    cluster.node(primary_port).kill()


async def test_a_dead_default_node_refuses_no_command_to_the_other_primaries(
    cluster: RedisCluster,
) -> None:
    client = _client(cluster)
    script = client.register_script(SCRIPT)
    try:
        await client.initialize()
        victim = int(client.get_default_node().port)
        keys = _key_per_primary(cluster)
        healthy = [key for port, key in keys.items() if port != victim]
        for key in healthy:  # warm: the script is loaded, the connections open
            await script(keys=[key])
        _kill_for_good(cluster, victim)

        # A pipeline over keys of several slots (the process reports) reaches the dead
        # node: redis-py gives up on it and refreshes its slot map.
        pipe = client.pipeline(transaction=False)
        pipe.set(keys[victim], b"1")
        pipe.set(healthy[0], b"1")
        with pytest.raises((redis_errors.ConnectionError, redis_errors.ClusterDownError)):
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
        counts = [int(await client.get(key) or 0) for key in healthy]
        assert counts == [1 + ROUNDS] * len(healthy)  # each ran once per round, no more
    finally:
        await _close(client)


async def test_a_refresh_after_a_dead_node_closes_no_command_in_flight_on_the_others(
    cluster: RedisCluster,
) -> None:
    """redis-py 8.1 answers a pipeline's connection error with the client's ``aclose()``,
    which closed every connection of every node, also one whose command another task had
    sent and awaited the reply of: a publish on a healthy primary then lost its reply
    (503 ``outcome_unknown`` on a session the failover had nothing to do with). A command
    held in flight by the healthy primary itself (a ``BLPOP`` it answers when the test
    pushes), sent with its node named as a publish is (so redis-py sends nothing twice),
    must get its answer."""
    target = RedisTarget(
        url="redis://", cluster=tuple(("127.0.0.1", n.port) for n in cluster.nodes)
    )
    # (a long read timeout: the BLPOP is answered by the test, not by a timeout)
    client = async_cluster(target, max_connections=8, connect_timeout_s=1.0, socket_timeout_s=60)
    try:
        await client.initialize()
        victim = int(client.get_default_node().port)
        keys = _key_per_primary(cluster)
        port, key = next((port, key) for port, key in keys.items() if port != victim)
        node = client.get_node_from_key(key)
        in_flight = asyncio.create_task(client.execute_command("BLPOP", key, 50, target_nodes=node))
        with cluster.node(port).client(timeout_s=10) as plain:
            blocked = partial(lambda c: int(c.info("clients")["blocked_clients"]) == 1, plain)
            assert await asyncio.to_thread(wait_for, blocked, 20.0), "the BLPOP never arrived"
            _kill_for_good(cluster, victim)

            pipe = client.pipeline(transaction=False)  # reaches the dead node: a refresh
            pipe.set(keys[victim], b"1")
            pipe.set(f"{key}:pipelined", b"1")  # (the same slot as the BLPOP's key)
            with pytest.raises((redis_errors.ConnectionError, redis_errors.ClusterDownError)):
                await pipe.execute()

            plain.rpush(key, b"answer")
            assert list(await asyncio.wait_for(in_flight, 30)) == [key.encode(), b"answer"]
    finally:
        await _close(client)


async def test_a_script_whose_reply_was_lost_is_not_sent_again(cluster: RedisCluster) -> None:
    client = _client(cluster)
    script = client.register_script(SLOW_SCRIPT)
    key = "qwtest-cluster-client:{once}"
    try:
        await client.initialize()  # (its COMMAND table is large: read with the long timeout)
        for node in client.get_nodes():  # then replies are awaited 0.3 s: the script's is lost
            node.connection_kwargs["socket_timeout"] = 0.3
            await node.disconnect()
        with pytest.raises(redis_errors.TimeoutError):  # the reply did not come in time
            await cluster_script_once(client, script, [key], [1_500_000])
        with redis_client_of(cluster, key) as node:  # (waits for the script to end)
            assert int(node.get(key)) == 1  # it ran once: not sent again
    finally:
        await _close(client)


async def test_a_script_missing_on_its_node_is_loaded_there(cluster: RedisCluster) -> None:
    client = _client(cluster)
    script = client.register_script(SCRIPT)
    key = "qwtest-cluster-client:{flushed}"
    try:
        assert await cluster_script_once(client, script, [key], []) == 1
        with redis_client_of(cluster, key) as node:
            node.script_flush()  # as a promoted replica: none of the old primary's scripts
        assert await cluster_script_once(client, script, [key], []) == 2
    finally:
        await _close(client)


def redis_client_of(cluster: RedisCluster, key: str) -> Any:
    """A plain client to the primary serving ``key`` (a context manager)."""
    port = cluster.primary_port_of(key)
    assert port is not None
    return cluster.node(port).client(timeout_s=10)
