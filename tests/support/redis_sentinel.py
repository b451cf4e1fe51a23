"""A private Sentinel-managed Redis for end-to-end failover tests.

One primary, ``replicas`` replicas and three Sentinels (``down-after-milliseconds`` 1000,
``failover-timeout`` 6000, quorum 2), every one a ``redis-server`` of this test on a free
127.0.0.1 port with its files in the test's directory. The machine's shared Redis is never
touched. Servers are killed with SIGKILL on purpose (:meth:`SentinelGroup.kill_primary`) and
started again on their port, where Sentinel turns them into replicas of the new primary.
"""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from tests.support.redis_server import REDIS_SERVER
from tests.support.server import dies_with_this_process, free_port, stop_process

SERVICE = "qwtest-primary"
#: Bounded waits: Sentinel's failover takes down-after (1 s) plus an election, slower on a
#: loaded machine.
FAILOVER_WAIT_S = 60.0


@dataclass
class RedisProcess:
    """One ``redis-server`` (or Sentinel) of this test: ``argv`` started on ``port``."""

    port: int
    directory: Path
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None

    @classmethod
    def data_server(cls, directory: Path, replica_of: int | None = None) -> RedisProcess:
        """A volatile data server (no AOF, no RDB) on a free port, a replica of
        127.0.0.1:``replica_of`` when given; not started."""
        port = free_port()
        argv = [
            REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory),
            "--save", "", "--appendonly", "no", "--daemonize", "no",
            # A replica that (re)joins is synced at once, not after Redis's default 5 s.
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip
        if replica_of is not None:
            argv += ["--replicaof", "127.0.0.1", str(replica_of)]
        return cls(port, directory, argv)

    def start(self, timeout_s: float = 15.0) -> None:
        """Start it; return once it answers PING. Raises RuntimeError after ``timeout_s``."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / "server.log").open("ab") as log:
            self.process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, preexec_fn=dies_with_this_process()
            )
        deadline = time.monotonic() + timeout_s
        while not self.answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                text = (self.directory / "server.log").read_text(errors="replace")
                self.stop()
                raise RuntimeError(f"redis-server did not come up: {text[-2000:]}")
            time.sleep(0.05)

    def answers(self) -> bool:
        try:
            with self.client(timeout_s=1) as client:
                return bool(client.ping())
        except (redis.RedisError, OSError):
            return False

    def client(self, timeout_s: float = 5) -> redis.Redis:
        """A client of this server; close it (``with``): an unclosed one leaks its socket."""
        return redis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=timeout_s, socket_connect_timeout=1
        )

    def kill(self) -> None:
        """SIGKILL (no shutdown, no save). Idempotent."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
        self.process = None


@dataclass
class SentinelGroup:
    """Primary + replicas + 3 Sentinels under ``directory`` (module docstring)."""

    directory: Path
    replicas: int = 1
    servers: list[RedisProcess] = field(default_factory=list)
    sentinels: list[RedisProcess] = field(default_factory=list)

    @property
    def sentinel_hosts(self) -> str:
        """``QWENWEB_REDIS_SENTINELS``: ``127.0.0.1:port,...``."""
        return ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)

    def start(self) -> SentinelGroup:
        """Start every server; return once the Sentinels agree on the primary and its
        replicas are in sync. Raises RuntimeError after ``FAILOVER_WAIT_S``."""
        primary = RedisProcess.data_server(self.directory / "redis-0")
        primary_port = primary.port
        self.servers = [primary]
        self.servers += [
            RedisProcess.data_server(self.directory / f"redis-{i + 1}", primary_port)
            for i in range(self.replicas)
        ]
        for server in self.servers:
            server.start()
        for index in range(3):
            port = free_port()
            directory = self.directory / f"sentinel-{index}"
            directory.mkdir(parents=True, exist_ok=True)
            conf = directory / "sentinel.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {directory}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 6000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            sentinel = RedisProcess(port, directory, [REDIS_SERVER, str(conf), "--sentinel"])
            sentinel.start()
            self.sentinels.append(sentinel)
        self.wait_ready()
        return self

    def primary_port(self) -> int | None:
        """The primary's port as the first Sentinel that answers names it, or None."""
        for sentinel in self.sentinels:
            try:
                with sentinel.client(timeout_s=1) as client:
                    address: Any = client.sentinel_get_master_addr_by_name(SERVICE)
            except (redis.RedisError, OSError):
                continue
            if address:
                return int(address[1])
        return None

    def primary(self) -> RedisProcess:
        port = self.primary_port()
        for server in self.servers:
            if server.port == port:
                return server
        raise RuntimeError(f"no server of this group is the primary (port {port})")

    def wait_ready(self, timeout_s: float = FAILOVER_WAIT_S) -> None:
        """Wait until every Sentinel names the same live primary, which sees all the
        running replicas online and knows the other Sentinels. Raises RuntimeError."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._ready():
                return
            time.sleep(0.1)
        raise RuntimeError("the Sentinel group did not settle in time")

    def _ready(self) -> bool:
        try:
            ports = set()
            for sentinel in self.sentinels:
                with sentinel.client(timeout_s=1) as client:
                    master: Any = client.sentinel_master(SERVICE)
                ports.add(int(master["port"]))
                if int(master.get("num-other-sentinels", 0)) < 2:
                    return False
                if "s_down" in master.get("flags", "") or "o_down" in master.get("flags", ""):
                    return False
            if len(ports) != 1:
                return False
            primary = next(s for s in self.servers if s.port in ports)
            if primary.process is None:
                return False
            with primary.client(timeout_s=1) as client:
                info = client.info("replication")
            running = sum(1 for s in self.servers if s.process is not None) - 1
            online = sum(
                1
                for key, value in info.items()
                if key.startswith("slave") and isinstance(value, dict)
                and value.get("state") == "online"
            )  # fmt: skip
            return info.get("role") == "master" and online >= running
        except (redis.RedisError, OSError, StopIteration, KeyError):
            return False

    def kill_primary(self) -> RedisProcess:
        """SIGKILL the current primary; return it (to :meth:`restart` later)."""
        server = self.primary()
        server.kill()
        return server

    def wait_failover(self, old_port: int, timeout_s: float = FAILOVER_WAIT_S) -> int:
        """Wait until the Sentinels name a primary other than ``old_port`` that answers as
        one; return its port. Raises RuntimeError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            port = self.primary_port()
            if port is not None and port != old_port:
                server = next(s for s in self.servers if s.port == port)
                try:
                    with server.client(timeout_s=1) as client:
                        role = client.info("replication").get("role")
                    if role == "master":
                        return port
                except (redis.RedisError, OSError):
                    pass
            time.sleep(0.1)
        raise RuntimeError(f"no failover away from port {old_port} within {timeout_s} s")

    def restart(self, server: RedisProcess) -> None:
        """Start a killed server again on its port (Sentinel makes it a replica)."""
        server.start()

    def stop(self) -> None:
        """Stop every server and Sentinel this group started. Idempotent."""
        for server in [*self.sentinels, *self.servers]:
            server.stop()
