"""Real server processes and raw-socket SSE clients for end-to-end tests.

The server is another process with its own bus: tests drive it over HTTP only, never by
importing the bus (style.md, Tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11

from sessions.auth import issue_token
from sessions.ops.parent_death import die_with_parent
from sessions.wire import ServerSentEvent, SSEParser

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A port of 127.0.0.1 that nothing listens on now, for a server about to start.

    Under pytest-xdist only a port of this worker's share (:func:`worker_owns_port`): two
    workers never pick the same one in the moment between this call and their servers'
    ``bind``. Raises ``RuntimeError`` if the kernel offers none of this share (never seen)."""
    for _ in range(1000):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if worker_owns_port(port):
            return port
    raise RuntimeError("no free port of this pytest-xdist worker's share in 1000 tries")


def worker_owns_port(port: int) -> bool:
    """Whether ``port`` belongs to this pytest-xdist worker's share of the ports (always,
    outside xdist). Worker ``i`` of ``n`` owns the ports with ``(port % 10000) // 2 % n ==
    i``: a Redis Cluster node's bus port, ``port + 10000``, has its node's owner, and
    ``bind`` to port 0 hands out odd ports first, so the shares are equal."""
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return (port % 10_000) // 2 % count == int(worker.removeprefix("gw"))


def server_env(database_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a server process: this one's, on the SQLite file ``database_path``.

    ``DATABASE_URL`` is always replaced, never passed through: the end-to-end tests read
    their server's rows from that file (``sqlite3``), and a ``DATABASE_URL`` naming
    PostgreSQL (``make test-postgres``) would otherwise point every server at one shared,
    non-test database. The PostgreSQL runs cover the in-process tests.
    """
    env = os.environ.copy()
    # A server stopped with open streams drains them over DRAIN_S (default 10 s); tests
    # that stop servers must not wait that long (stop_process kills after 10 s).
    env.setdefault("QWENWEB_DRAIN_S", "1")
    # The durable backend's log: one per server environment, beside its database (several
    # servers of a test run share one database; one log has one writer). A server restarted
    # with the same environment finds its log again.
    env["QWENWEB_EVENT_LOG_PATH"] = f"{database_path}.events-{secrets.token_hex(4)}.sqlite3"
    env.update(
        DATABASE_URL=f"sqlite:///{database_path}",
        DJANGO_SETTINGS_MODULE="qwenweb.settings",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def migrate(database_path: Path) -> None:
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v0"],
        cwd=REPO,
        env=server_env(database_path),
        check=True,
        timeout=120,
    )


@dataclass
class ServerProcess:
    """A server on ``host``:``port`` (default 127.0.0.1) started with ``argv`` (daphne,
    runserver, uvicorn, granian). ``ready`` (default: ``GET /capabilities`` from here)
    raises ``OSError`` until the server answers (a server in another network namespace is
    asked from there)."""

    argv: Sequence[str]
    port: int
    env: dict[str, str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    tls: bool = False
    """Whether it speaks TLS (``tests.support.tls``'s certificate): ``https://`` URLs."""
    host: str = "127.0.0.1"
    ready: Callable[[], Any] | None = None

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ServerProcess:
        """Start the server and wait (bounded) until it answers; a server that does not
        come up is stopped before the error propagates, so no test leaves one running."""
        with self.log_path.open("ab") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                list(self.argv),
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=dies_with_this_process(),
            )
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited: {self.log_path.read_text()[-2000:]}")
            try:
                if self.ready is not None:
                    self.ready()
                else:
                    get_json(f"{self.base_url}/capabilities")
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(
            f"server did not start in {timeout_s} s: {self.log_path.read_text()[-2000:]}"
        )

    def stop(self) -> None:
        """SIGTERM (then SIGKILL, bounded); then SIGKILL whatever of its tree is left (a
        worker still draining when its main process was killed has 1 s to end by itself:
        not worth waiting for here)."""
        if self.process is not None:
            tree = self.pids() if self.process.poll() is None else []
            stop_process(self.process)
            _kill_all(tree[1:])

    def kill(self, timeout_s: float = 10.0) -> None:
        """SIGKILL the server and every process of its tree at once (a crash of the whole
        server: with the main process alone, each worker would first end its streams and
        write its records, tests/e2e/test_process_tree.py)."""
        assert self.process is not None
        pids = self.pids()
        _kill_all(pids)
        self.process.wait(timeout=timeout_s)
        # The workers are not our children: wait (bounded) until each is gone too, so a
        # caller sees the crash complete (a scrape right after found a worker still alive).
        deadline = time.monotonic() + timeout_s
        while any(_running(pid) for pid in pids[1:]):
            assert time.monotonic() < deadline, f"processes {pids[1:]} outlived SIGKILL"
            time.sleep(0.01)

    def pids(self) -> list[int]:
        """The server process and all its descendants (granian's workers), while alive."""
        assert self.process is not None
        found, todo = [], [self.process.pid]
        while todo:
            pid = todo.pop()
            found.append(pid)
            with contextlib.suppress(OSError):
                for task in os.listdir(f"/proc/{pid}/task"):
                    children = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                    todo.extend(int(child) for child in children)
        return found

    def _status_field(self, name: str) -> int:
        total = 0
        for pid in self.pids():
            with contextlib.suppress(OSError, StopIteration):
                status = Path(f"/proc/{pid}/status").read_text()
                line = next(line for line in status.splitlines() if line.startswith(name))
                total += int(line.split()[1])
        return total

    def rss_kib(self) -> int:
        """Resident memory in KiB (``VmRSS``), summed over the process tree (:meth:`pids`)."""
        return self._status_field("VmRSS:")

    def thread_count(self) -> int:
        """OS threads, summed over the process tree."""
        return self._status_field("Threads:")

    def fd_count(self) -> int:
        """Open file descriptors, summed over the process tree."""
        total = 0
        for pid in self.pids():
            with contextlib.suppress(OSError):
                total += len(os.listdir(f"/proc/{pid}/fd"))
        return total

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def started_server(
    argv: Callable[[int], Sequence[str]], env: dict[str, str], log_path: Path
) -> Iterator[ServerProcess]:
    """Start ``argv(port)`` on a free port with ``env``, its output to ``log_path``, and
    yield it once it answers (:meth:`ServerProcess.start`, which raises if it does not);
    stop it on the way out. The body of a server fixture:
    ``with started_server(serve_argv, env, log) as server: yield server``."""
    port = free_port()
    server = ServerProcess(argv(port), port, env, log_path).start()
    try:
        yield server
    finally:
        server.stop()


def running(pids: Sequence[int]) -> list[int]:
    """Those of ``pids`` that still run (read from ``/proc``; zombies do not)."""
    return [pid for pid in pids if _running(pid)]


def _running(pid: int) -> bool:
    """Whether a thread of process ``pid`` still runs (a zombie no longer does: its parent
    may never reap it). Its main thread may be a zombie while others still exit, holding
    the process's descriptors (its listening socket) open."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for task in tasks:
        try:
            stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
        except OSError:
            continue
        if stat.rpartition(")")[2].split()[0] != "Z":
            return True
    return False


def _kill_all(pids: Sequence[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def stop_all(servers: Sequence[ServerProcess], timeout_s: float = 10.0) -> None:
    """Stop every server at once: SIGTERM to all, then wait for each (SIGKILL after
    ``timeout_s``), then SIGKILL what is left of their trees. Each drains ``DRAIN_S`` at
    the same time as the others instead of one after another."""
    trees = {}
    for server in servers:
        if server.process is not None and server.process.poll() is None:
            trees[id(server)] = server.pids()
            server.process.terminate()
    deadline = time.monotonic() + timeout_s
    for server in servers:
        if id(server) in trees:
            assert server.process is not None
            stop_process(server.process, max(0.1, deadline - time.monotonic()))
            _kill_all(trees[id(server)][1:])


def dies_with_this_process() -> Callable[[], object] | None:
    """A ``preexec_fn`` that has the kernel SIGKILL the child when this test process dies
    (``PR_SET_PDEATHSIG``), so a killed or crashed pytest leaves no server, Redis or
    Sentinel behind (granian's workers follow their main process by themselves). None off
    the main thread: the signal follows the thread that started the child, and a helper
    thread's end is no reason to kill a server."""
    if threading.current_thread() is not threading.main_thread():
        return None
    parent = os.getpid()
    return functools.partial(die_with_parent, parent, signal.SIGKILL)


def stop_process(process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> None:
    """Stop ``process`` if it still runs: SIGTERM, then SIGKILL after ``timeout_s`` (bounded)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=timeout_s)


TEST_REDIS_URL = os.environ.get("QWENWEB_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
"""The Redis the end-to-end clusters share (``QWENWEB_TEST_REDIS_URL`` names another); each
writes only under a key prefix of its own and deletes it (never FLUSHDB)."""


def start_redis_server(
    database: Path,
    redis_url: str,
    prefix: str,
    log_path: Path,
    *serve_options: str,
    **extra_env: str,
) -> ServerProcess:
    """Start ``python -m qwenweb.serve`` on a free port with the Redis backend.

    The server uses ``redis_url`` under the key prefix ``prefix``, with a process TTL of
    2 s and a heartbeat every second (``extra_env`` adds to or overrides these);
    ``serve_options`` go to its command line (``--workers 2``).
    """
    port = free_port()
    env = server_env(
        database,
        **{
            "QWENWEB_BACKEND": "redis",
            "QWENWEB_REDIS_URL": redis_url,
            "QWENWEB_REDIS_KEY_PREFIX": prefix,
            "QWENWEB_PROCESS_TTL_S": "2",
            "QWENWEB_HEARTBEAT_INTERVAL_S": "1",
            **extra_env,
        },
    )
    return ServerProcess(serve_argv(port, *serve_options), port, env, log_path).start()


@dataclass
class RedisCluster:
    """The ``qwenweb.serve`` processes of one deployment: one database, the Redis backend on
    ``redis_url`` under the key prefix ``prefix``.

    ``cluster(name, *serve_options, **env)`` starts one more (:func:`start_redis_server`
    with the cluster's ``env``, then the call's), logging to ``<log_dir>/<name>.log``.
    Made by :func:`redis_cluster`, which stops them all and deletes the prefix's keys.
    """

    database: Path
    log_dir: Path
    redis_url: str = TEST_REDIS_URL
    prefix: str = field(default_factory=lambda: f"qwtest-{secrets.token_hex(4)}")
    env: dict[str, str] = field(default_factory=dict)
    started: list[ServerProcess] = field(default_factory=list)

    def __call__(self, name: str, *serve_options: str, **env: str) -> ServerProcess:
        server = start_redis_server(
            self.database,
            self.redis_url,
            self.prefix,
            self.log_dir / f"{name}.log",
            *serve_options,
            **{**self.env, **env},
        )
        self.started.append(server)
        return server


@contextlib.contextmanager
def redis_cluster(
    database: Path, log_dir: Path, *, redis_url: str = TEST_REDIS_URL, **extra_env: str
) -> Iterator[RedisCluster]:
    """A :class:`RedisCluster` with a key prefix of its own and ``extra_env`` for each of
    its processes. On exit every process started is stopped (at once) and the prefix's keys
    are deleted."""
    from tests.support.backend import delete_run_keys

    cluster = RedisCluster(database, log_dir, redis_url, env=dict(extra_env))
    try:
        yield cluster
    finally:
        stop_all(cluster.started)
        delete_run_keys(cluster.prefix, redis_url)


def daphne_argv(port: int) -> list[str]:
    return [
        sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
        "qwenweb.asgi:application",
    ]  # fmt: skip


def serve_argv(port: int, *extra: str, host: str = "127.0.0.1") -> list[str]:
    """The production entry point, granian (``python -m qwenweb.serve``) on ``host``;
    ``extra``: its options (``--certfile C --keyfile K``, ``--server daphne``, ...)."""
    return [sys.executable, "-m", "qwenweb.serve", "-b", host, "-p", str(port), *extra]


def runserver_argv(port: int, *extra: str) -> list[str]:
    return [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload", *extra]


def request_json(
    method: str, url: str, body: Any = None, token: str | None = None
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    context = None
    if url.startswith("https://"):
        from tests.support.tls import client_context

        context = client_context()
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as response:
            raw = response.read()
            return response.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        return exc.code, json.loads(raw) if raw else None


def get_json(url: str, token: str | None = None) -> Any:
    status, body = request_json("GET", url, token=token)
    if status != 200:
        raise OSError(f"GET {url}: {status} {body}")
    return body


@dataclass
class RemoteSession:
    """A session created on a server over HTTP, with its tokens."""

    base_url: str
    id: str
    read_token: str
    publish_token: str

    @classmethod
    def create(cls, base_url: str, **body: Any) -> RemoteSession:
        status, created = request_json(
            "POST", f"{base_url}/session", body, token=issue_token("*", ["create"], "e2e")
        )
        assert status == 201, created
        return cls(base_url, created["id"], created["tokens"]["read"], created["tokens"]["publish"])

    @property
    def events_path(self) -> str:
        return f"/session/{self.id}/events"

    def publish(self, event_type: str = "note", data: Any = None) -> int:
        status, body = request_json(
            "POST", f"{self.base_url}{self.events_path}", {"type": event_type, "data": data},
            token=self.publish_token,
        )  # fmt: skip
        assert status == 200, body
        return int(body["id"])

    def load(self) -> Any:
        return get_json(f"{self.base_url}/session/{self.id}", token=self.read_token)


@dataclass
class RawSSEClient:
    """An SSE client on a raw asyncio socket: h11 for HTTP/1.1 framing, our parser for SSE."""

    port: int
    path: str
    headers: list[tuple[str, str]]
    status: int = 0
    response_headers: dict[str, str] = field(default_factory=dict)
    events: list[ServerSentEvent] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)
    ended: bool = False
    tls_context: ssl.SSLContext | None = None
    """TLS (HTTP/1.1 by ALPN) when set."""

    async def connect(
        self, timeout_s: float = 10.0, *, host: str = "127.0.0.1", sock: socket.socket | None = None
    ) -> RawSSEClient:
        """Connect to ``host`` (with ``sock``, an unconnected socket, when given: one made in
        another network namespace or bound to a source address) and read the headers."""
        async with asyncio.timeout(timeout_s):
            if sock is None:
                self._reader, self._writer = await asyncio.open_connection(
                    host, self.port, ssl=self.tls_context
                )
            else:
                sock.setblocking(False)
                await asyncio.get_running_loop().sock_connect(sock, (host, self.port))
                self._reader, self._writer = await asyncio.open_connection(
                    sock=sock,
                    ssl=self.tls_context,
                    server_hostname=host if self.tls_context else None,
                )
            self._conn = h11.Connection(our_role=h11.CLIENT)
            self._parser = SSEParser(self.events.append)
            request = h11.Request(
                method="GET",
                target=self.path,
                headers=[("Host", f"{host}:{self.port}"), *self.headers],
            )
            self._writer.write(self._conn.send(request) + self._conn.send(h11.EndOfMessage()))
            while not self.status:
                await self._pump_once()
        return self

    async def _pump_once(self) -> None:
        event = self._conn.next_event()
        if event is h11.NEED_DATA:
            data = await self._reader.read(65536)
            self._conn.receive_data(data)
            return
        if isinstance(event, h11.Response):
            self.status = event.status_code
            self.response_headers = {k.decode().lower(): v.decode() for k, v in event.headers}
        elif isinstance(event, h11.Data):
            self.body += event.data
            self._parser.feed_bytes(bytes(event.data))
        elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
            self.ended = True

    async def read_until(self, predicate: Any, timeout_s: float = 10.0) -> list[ServerSentEvent]:
        """Read until ``predicate(events)`` holds or the response ends; bounded."""
        async with asyncio.timeout(timeout_s):
            while not predicate(self.events) and not self.ended:
                await self._pump_once()
        return self.events

    async def read_events(self, count: int, timeout_s: float = 10.0) -> list[ServerSentEvent]:
        return await self.read_until(lambda events: len(events) >= count, timeout_s)

    async def read_to_end(self, timeout_s: float = 10.0) -> list[ServerSentEvent]:
        return await self.read_until(lambda events: False, timeout_s)

    def close(self) -> None:
        self._writer.close()

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Close and wait (bounded) until the socket is closed (TLS needs the loop)."""
        self._writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._writer.wait_closed(), timeout_s)


async def open_stream(
    port: int,
    path: str,
    token: str | None,
    extra_headers: Sequence[tuple[str, str]] = (),
    tls: ssl.SSLContext | None = None,
    *,
    host: str = "127.0.0.1",
    sock: socket.socket | None = None,
) -> RawSSEClient:
    headers = [("Accept", "text/event-stream"), *extra_headers]
    if token:
        headers.append(("Authorization", f"Bearer {token}"))
    return await RawSSEClient(port, path, headers, tls_context=tls).connect(host=host, sock=sock)


def event_ids(events: Sequence[ServerSentEvent]) -> list[int]:
    """Ids of the real events (synthetic frames have none)."""
    return [json.loads(e.data)["id"] for e in events if json.loads(e.data).get("id") is not None]


def wait_for(predicate: Any, timeout_s: float, interval_s: float = 0.02) -> bool:
    """Poll ``predicate`` until true or ``timeout_s`` passes; return the last result."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
