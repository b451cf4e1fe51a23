"""A private Redis Cluster for end-to-end tests: 3 primaries, each with one replica.

Six ``redis-server`` processes of this test in cluster mode (``cluster-node-timeout``
1500 ms, no persistence, ``cluster-require-full-coverage no`` so the other primaries keep
serving while one is down), on free 127.0.0.1 ports with their files in the test's
directory, joined by ``redis-cli --cluster create --cluster-replicas 1``. The machine's
shared Redis is never touched. A primary is killed with SIGKILL on purpose
(:meth:`RedisCluster.kill_primary_of`) and started again on its port with its node file,
where it rejoins as a replica of the promoted one.
"""

from __future__ import annotations

import random
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

from tests.support.redis_sentinel import RedisProcess
from tests.support.redis_server import REDIS_SERVER
from tests.support.server import worker_owns_port

NODE_TIMEOUT_MS = 1500
#: Bounded waits: a failover takes the node timeout plus an election, slower when loaded.
CLUSTER_WAIT_S = 60.0
REDIS_CLI = "/usr/bin/redis-cli"


def free_cluster_port() -> int:
    """A free port ``p`` <= 55535 whose cluster bus port ``p + 10000`` is free too, both of
    this pytest-xdist worker's share (``tests.support.server.worker_owns_port``)."""
    for _ in range(1000):
        port = random.randint(20_000, 55_535)
        if not worker_owns_port(port):  # another pytest-xdist worker's: see free_port
            continue
        try:
            for candidate in (port, port + 10_000):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


def cluster_node(directory: Path) -> RedisProcess:
    """One volatile cluster-mode server on a free port (not started)."""
    port = free_cluster_port()
    argv = [
        REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
        "--save", "", "--appendonly", "no", "--daemonize", "no",
        "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
        "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
        "--cluster-require-full-coverage", "no",
        "--repl-diskless-sync-delay", "0",
    ]  # fmt: skip
    return RedisProcess(port, directory, argv)


@dataclass
class RedisCluster:
    """3 primaries + 3 replicas under ``directory`` (module docstring)."""

    directory: Path
    nodes: list[RedisProcess] = field(default_factory=list)

    @property
    def seeds(self) -> str:
        """``QWENWEB_REDIS_CLUSTER``: ``127.0.0.1:port,...`` (every node)."""
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def start(self) -> RedisCluster:
        """Start the six servers, create the cluster; return once every node sees it ok.
        Raises RuntimeError (the servers are stopped) after ``CLUSTER_WAIT_S``."""
        self.nodes = [cluster_node(self.directory / f"node-{i}") for i in range(6)]
        try:
            for node in self.nodes:
                node.start()
            create = [REDIS_CLI, "--cluster", "create"]
            create += [f"127.0.0.1:{n.port}" for n in self.nodes]
            create += ["--cluster-replicas", "1", "--cluster-yes"]
            done = subprocess.run(create, capture_output=True, timeout=60, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout[-2000:]!r}")
            self.wait_ok()
        except BaseException:
            self.stop()
            raise
        return self

    def _slots(self) -> list[Any]:
        for node in self.nodes:
            if node.process is None:
                continue
            try:
                with node.client(timeout_s=1) as client:
                    return list(client.execute_command("CLUSTER", "SLOTS"))
            except (redis.RedisError, OSError):
                continue
        return []

    def primary_port_of(self, key: str) -> int | None:
        """The port of the primary serving ``key``'s slot, as a live node sees it."""
        slot = key_slot(key.encode())
        for start, end, primary, *_ in self._slots():
            if int(start) <= slot <= int(end):
                return int(primary[1])
        return None

    def node(self, port: int) -> RedisProcess:
        return next(n for n in self.nodes if n.port == port)

    def wait_ok(self, timeout_s: float = CLUSTER_WAIT_S) -> None:
        """Wait until every running node says ``cluster_state:ok`` and every slot's
        primary has a replica online. Raises RuntimeError."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._ok():
                return
            time.sleep(0.1)
        raise RuntimeError("the cluster did not settle in time")

    def _ok(self) -> bool:
        try:
            for node in self.nodes:
                if node.process is None:
                    continue
                with node.client(timeout_s=1) as client:
                    info = client.execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text:
                    return False
            slots = self._slots()
            running = sum(1 for n in self.nodes if n.process is not None)
            covered = sum(int(end) - int(start) + 1 for start, end, *_ in slots)
            replicas = sum(len(entry) - 3 for entry in slots)
            return covered == 16384 and replicas >= running - 3
        except (redis.RedisError, OSError):
            return False

    def kill_primary_of(self, key: str) -> RedisProcess:
        """SIGKILL the primary serving ``key``; return it (to :meth:`restart` later)."""
        port = self.primary_port_of(key)
        assert port is not None, "no primary serves the key"
        server = self.node(port)
        server.kill()
        return server

    def wait_failover(self, key: str, old_port: int, timeout_s: float = CLUSTER_WAIT_S) -> int:
        """Wait until another node serves ``key``'s slot as a primary; return its port."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            port = self.primary_port_of(key)
            if port is not None and port != old_port:
                return port
            time.sleep(0.1)
        raise RuntimeError(f"no failover away from port {old_port} within {timeout_s} s")

    def restart(self, server: RedisProcess) -> None:
        """Start a killed node again on its port (its nodes.conf: it rejoins as a replica)."""
        server.start()

    def role(self, server: RedisProcess) -> str:
        with server.client(timeout_s=1) as client:
            return str(client.info("replication").get("role"))

    def stop(self) -> None:
        """Stop every node this cluster started. Idempotent."""
        for node in self.nodes:
            node.stop()
