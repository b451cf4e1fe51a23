"""A private ``redis-server`` for end-to-end tests that break Redis on purpose.

The machine's shared Redis (127.0.0.1:6379) is never touched: each test starts its own on
a free port with its data directory in the test's ``tmp_path``.
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from tests.support.server import dies_with_this_process, stop_process

REDIS_SERVER = "/usr/bin/redis-server"


@dataclass
class PrivateRedis:
    """A ``redis-server`` of this test only: 127.0.0.1:``port``, data in ``directory``.

    ``persistent`` turns on the AOF with an fsync per write, so a restart keeps every
    acknowledged write; without it a restart starts empty.
    """

    port: int
    directory: Path
    persistent: bool
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> PrivateRedis:
        """Start the server and return once it answers PING; raises after ``timeout_s``."""
        argv = [
            REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.directory), "--save", "", "--daemonize", "no",
            "--appendonly", "yes" if self.persistent else "no", "--appendfsync", "always",
        ]  # fmt: skip
        with (self.directory / "redis.log").open("ab") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, preexec_fn=dies_with_this_process()
            )
        deadline = time.monotonic() + timeout_s
        while not self._answers_ping():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log_text = (self.directory / "redis.log").read_text(errors="replace")
                raise RuntimeError(f"redis-server did not come up: {log_text[-2000:]}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        """Stop the server (SIGTERM: AOF flushed; SIGKILL after 10 s). Idempotent."""
        if self.process is not None:
            stop_process(self.process)
        self.process = None

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def _answers_ping(self) -> bool:
        """One raw ``PING`` (no client-side retries): True on ``+PONG`` (not while loading)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False
