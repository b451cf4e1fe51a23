"""``python -m qwenweb.serve`` (granian) as a real process: HTTP/2 by ALPN, shutdown, limits.

- Over TLS, 8 streams of one session share one TCP connection (HTTP/2, the ``h2`` library),
  seen from the server's side with ``ss``.
- SIGTERM with open HTTP/1.1 and HTTP/2 streams: the process exits within 15 s, every
  stream got its terminal frame (``server_shutdown``) and its record says so.
- More than 1,024 idle streams on one process (granian's default backpressure stops at
  backlog / workers = 1,024 requests).
- The request header deadline (``REQUEST_HEADER_TIMEOUT_S``): 200 connections that send
  their headers one line at a time are closed while normal requests are served and an open
  stream keeps streaming.
- Bad input on the command line (a port in use or out of range, a bind address that is
  not an IP address, a certificate or key ``ssl`` cannot load, …): exit 2 with one line
  naming the option, under granian and ``--server daphne``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from tests.support.h2client import H2Connection
from tests.support.server import (
    REPO,
    RemoteSession,
    ServerProcess,
    event_ids,
    free_port,
    open_stream,
    request_json,
    serve_argv,
    server_env,
    stop_all,
    wait_for,
)
from tests.support.tls import client_context, tls_argv

pytestmark = [pytest.mark.e2e, pytest.mark.transport_only]

SHUTDOWN_BOUND_S = 15.0
"""Issue 12: SIGTERM with open streams ends the process within this."""

IDLE_STREAMS = 1_100
SLOW_CONNECTIONS = 200


@pytest.fixture
def start(e2e_database: Path, tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """``start(*extra_argv, tls=False, **env)``: ``qwenweb.serve`` on a free port."""
    started: list[ServerProcess] = []

    def _start(*extra: str, tls: bool = False, **env: str) -> ServerProcess:
        port = free_port()
        argv = serve_argv(port, *(tls_argv() if tls else ()), *extra)
        log = tmp_path / f"serve-{len(started)}.log"
        server = ServerProcess(argv, port, server_env(e2e_database, **env), log, tls=tls)
        started.append(server)
        return server.start()

    yield _start
    stop_all(started)


def established(port: int) -> list[str]:
    """The server side's established TCP connections on ``port`` (``ss``)."""
    out = subprocess.run(
        ["ss", "-tnH", "state", "established", f"( sport = :{port} )"],
        capture_output=True, text=True, check=True, timeout=10,
    ).stdout  # fmt: skip
    return [line for line in out.splitlines() if line.strip()]


def connections(database: Path, session_id: str) -> list[dict[str, Any]]:
    with sqlite3.connect(database) as db:
        db.row_factory = sqlite3.Row
        cursor = db.execute(
            "SELECT * FROM agent_sessions_subscriberconnection WHERE session_id = ?",
            (session_id,),
        )
        return [dict(row) for row in cursor]


def terminal(events: list[Any]) -> str:
    """The ``code`` of the last frame (``stream_error``)."""
    return str(json.loads(events[-1].data)["data"]["code"])


# -- HTTP/2 --------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_eight_streams_of_one_session_share_one_http2_connection(
    start: Callable[..., ServerProcess],
) -> None:
    server = start(tls=True)
    session = RemoteSession.create(server.base_url)
    connection = await H2Connection(server.port).connect()
    try:
        streams = [
            connection.open_stream(session.events_path, session.read_token) for _ in range(8)
        ]
        await connection.read_until(lambda: all(s.status for s in streams))
        assert [s.status for s in streams] == [200] * 8
        assert await asyncio.to_thread(wait_for, lambda: session.load()["subscriberCount"] == 8, 10)
        ids = [session.publish("note", {"n": n}) for n in range(3)]
        await connection.read_until(lambda: all(len(s.events) >= 3 for s in streams))
        assert [event_ids(s.events) for s in streams] == [ids] * 8
        # The server sees one TCP connection: ours.
        (line,) = established(server.port)
        assert f":{connection.local_port()}" in line
    finally:
        await connection.aclose()


# -- shutdown ------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_sigterm_ends_http1_and_http2_streams_and_exits_in_time(
    start: Callable[..., ServerProcess], e2e_database: Path
) -> None:
    # No drain window (DRAIN_S=0): this is granian's own shutdown of open HTTP/1.1 and
    # HTTP/2 streams; the spread-out drain is tests/e2e/test_drain_redis.py. (After a
    # drain window, granian waits for an idle HTTP/2 connection until its kill timeout.)
    server = start(tls=True, QWENWEB_RECORDS_FLUSH_INTERVAL_S="3600", QWENWEB_DRAIN_S="0")
    session = RemoteSession.create(server.base_url)
    http1 = await open_stream(
        server.port, session.events_path, session.read_token, tls=client_context()
    )
    connection = await H2Connection(server.port).connect()
    try:
        streams = [
            connection.open_stream(session.events_path, session.read_token) for _ in range(2)
        ]
        await connection.read_until(lambda: all(s.status for s in streams))
        event_id = session.publish("note", {"n": 1})
        await http1.read_events(1)
        await connection.read_until(lambda: all(s.events for s in streams))
        assert server.process is not None
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        await http1.read_to_end(timeout_s=SHUTDOWN_BOUND_S)
        await connection.read_to_end(timeout_s=SHUTDOWN_BOUND_S)
        # On to the connection's close: granian's GOAWAY can come after the streams ended
        # (the CI run that stopped reading here missed it once).
        await connection.read_until(lambda: False, timeout_s=SHUTDOWN_BOUND_S)
        code = await asyncio.to_thread(server.process.wait, SHUTDOWN_BOUND_S)
        took_s = time.monotonic() - started
    finally:
        await http1.aclose()
        await connection.aclose()
    assert code == 0
    assert took_s < SHUTDOWN_BOUND_S
    assert connection.goaway is not None  # HTTP/2's graceful close: GOAWAY, then the end
    print(f"exited {took_s:.2f} s after SIGTERM with 1 HTTP/1.1 and 2 HTTP/2 streams open")
    for events in (http1.events, *(s.events for s in streams)):
        assert event_ids(events) == [event_id]
        assert [e.type for e in events] == ["note", "stream_error"]
        assert terminal(events) == "server_draining"  # the graceful drain ended it
    rows = connections(e2e_database, session.id)
    assert len(rows) == 3
    assert {row["end_reason"] for row in rows} == {"server_shutdown"}
    assert sorted(row["bytes_sent"] for row in rows) == sorted(
        len(body) for body in (http1.body, *(s.body for s in streams))
    )


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_proxy_headers_give_the_client_address_from_the_local_proxy(
    start: Callable[..., ServerProcess], e2e_database: Path
) -> None:
    server = start("--proxy-headers", QWENWEB_RECORDS_FLUSH_INTERVAL_S="0.1")
    session = RemoteSession.create(server.base_url)
    stream = await open_stream(
        server.port, session.events_path, session.read_token, [("X-Forwarded-For", "203.0.113.7")]
    )
    try:
        assert await asyncio.to_thread(
            wait_for, lambda: len(connections(e2e_database, session.id)) == 1, 10
        )
        (row,) = connections(e2e_database, session.id)
        assert row["client_addr"] == "203.0.113.7"  # from 127.0.0.1: believed
    finally:
        await stream.aclose()


# -- limits --------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_more_than_1024_idle_streams_on_one_process(
    start: Callable[..., ServerProcess],
) -> None:
    # granian's default backpressure (backlog / workers = 1,024) would hold the 1,025th
    # request for ever; qwenweb.serve raises it to the fd limit.
    server = start(QWENWEB_MAX_SUBSCRIBERS=str(IDLE_STREAMS + 10))
    session = RemoteSession.create(server.base_url)
    # 250 connecting at once: with the Redis backend that is more subscribes in flight
    # than the process's Redis pool holds (100); they wait for a connection instead of
    # failing with 503 "Too many connections" (redis-py's plain pool does not wait).
    gate = asyncio.Semaphore(250)

    async def one() -> Any:
        async with gate:
            stream = await open_stream(server.port, session.events_path, session.read_token)
            await stream.read_until(lambda events: bool(stream.body))  # `retry:` came
            return stream

    streams = await asyncio.wait_for(
        asyncio.gather(*(one() for _ in range(IDLE_STREAMS))), timeout=90
    )
    try:
        assert [s.status for s in streams] == [200] * IDLE_STREAMS
        assert session.load()["subscriberCount"] == IDLE_STREAMS
        event_id = session.publish("note", {"to": "all"})
        await asyncio.wait_for(
            asyncio.gather(*(s.read_events(1, timeout_s=60) for s in streams)), timeout=60
        )
        assert all(event_ids(s.events) == [event_id] for s in streams)
    finally:
        for stream in streams:
            stream.close()


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_slow_request_headers_are_closed_while_requests_are_served(
    start: Callable[..., ServerProcess],
) -> None:
    server = start(QWENWEB_REQUEST_HEADER_TIMEOUT_S="2", QWENWEB_HEARTBEAT_INTERVAL_S="1")
    session = RemoteSession.create(server.base_url)
    stream = await open_stream(server.port, session.events_path, session.read_token)
    slow: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    for _ in range(SLOW_CONNECTIONS):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET /capabilities HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        slow.append((reader, writer))
    closed: set[int] = set()

    async def trickle(index: int) -> None:
        """One more header line every 0.5 s until the server closes the connection."""
        reader, writer = slow[index]
        for line in range(60):
            try:
                writer.write(f"X-Slow-{line}: 1\r\n".encode())
                await writer.drain()
                data = await asyncio.wait_for(reader.read(65536), timeout=0.5)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            if not data or data.startswith(b"HTTP/1.1 408"):
                closed.add(index)
                return

    trickling = asyncio.gather(*(trickle(i) for i in range(SLOW_CONNECTIONS)))
    try:
        served = 0
        while len(closed) < SLOW_CONNECTIONS and not trickling.done():
            status, _ = await asyncio.to_thread(
                request_json, "GET", f"{server.base_url}/capabilities"
            )
            assert status == 200
            served += 1
        await asyncio.wait_for(trickling, timeout=40)
    finally:
        for _, writer in slow:
            writer.close()
    assert len(closed) == SLOW_CONNECTIONS
    assert served > 0
    # The stream, open since before them and far past the deadline, still streams.
    event_id = session.publish("note", {"after": "slow headers"})
    await stream.read_until(lambda events: event_id in event_ids(events))
    assert not stream.ended
    stream.close()


# -- bad input -----------------------------------------------------------------------------


def run_serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "qwenweb.serve", "-p", str(free_port()), *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


BOTH: Final = ("granian", "daphne")

BAD_COMMAND_LINES: Final = [
    # id, the arguments, what stderr's one line says, the servers (``--server``) it is for.
    # Placeholders: TAKEN a port a socket of the test listens on; CERT, KEY the tests'
    # certificate and its key; OTHER_KEY the key of another certificate; LOCKED_KEY KEY
    # encrypted with a passphrase.
    ("unknown-server", [], "unknown --server 'gunicorn'; choose one of: granian, daphne",
     ("gunicorn",)),
    ("missing-cert", ["--certfile", "/nonexistent/cert.pem", "--keyfile", "/nonexistent/key.pem"],
     "--certfile /nonexistent/cert.pem: cannot read it", BOTH),
    ("unreadable-key", ["--certfile", "CERT", "--keyfile", "/"], "--keyfile /: cannot read it",
     BOTH),
    ("cert-without-key", ["--certfile", "CERT"], "--certfile and --keyfile go together", BOTH),
    ("workers-memory", ["--workers", "2"],
     "--workers 2 needs a backend shared by several processes", ("granian",)),
    ("port-in-use", ["-p", "TAKEN"],
     "-p TAKEN: 127.0.0.1:TAKEN is already in use (another server?): choose another port", BOTH),
    ("port-too-large", ["-p", "99999"], "-p 99999: must be 1 to 65535", BOTH),
    ("port-negative", ["-p", "-1"], "-p -1: must be 1 to 65535", BOTH),
    ("port-zero", ["-p", "0"], "-p 0: must be 1 to 65535 (0, any free port, is not supported)",
     BOTH),
    ("bind-bad-ip", ["-b", "999.1.1.1"], "-b 999.1.1.1: not an IP address", BOTH),
    ("bind-host-name", ["-b", "example.invalid"], "-b example.invalid: not an IP address", BOTH),
    ("cert-not-pem", ["--certfile", "/etc/hostname", "--keyfile", "/etc/hostname"],
     "--certfile /etc/hostname: no PEM certificate in it", ("granian",)),
    ("key-not-pem", ["--certfile", "CERT", "--keyfile", "CERT"],
     "--keyfile CERT: no PEM private key in it", ("granian",)),
    ("key-of-another-cert", ["--certfile", "CERT", "--keyfile", "OTHER_KEY"],
     "--keyfile OTHER_KEY: not the key of the certificate in --certfile CERT", ("granian",)),
    ("key-encrypted", ["--certfile", "CERT", "--keyfile", "LOCKED_KEY"],
     "--keyfile LOCKED_KEY: the key is encrypted; give it without a passphrase", ("granian",)),
    ("tls-under-daphne", ["--certfile", "CERT", "--keyfile", "KEY"],
     "--certfile/--keyfile are for granian", ("daphne",)),
]  # fmt: skip


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """CERT, KEY, OTHER_KEY and LOCKED_KEY (see BAD_COMMAND_LINES)."""
    from cryptography.hazmat.primitives import serialization

    from sessions.serving.devcert import make_local_certificate

    directory = tmp_path_factory.mktemp("tls")
    cert, key = tls_argv()[1], tls_argv()[3]
    locked = directory / "locked-key.pem"
    private = serialization.load_pem_private_key(Path(key).read_bytes(), password=None)
    locked.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase"),
        )
    )
    other = make_local_certificate(directory / "other")
    return {"CERT": cert, "KEY": key, "OTHER_KEY": str(other.key), "LOCKED_KEY": str(locked)}


@pytest.mark.parametrize(
    ("server", "args", "message"),
    [
        pytest.param(server, args, message, id=f"{name}-{server}")
        for name, args, message, servers in BAD_COMMAND_LINES
        for server in servers
    ],
)
def test_bad_command_line_exits_2_naming_the_problem(
    e2e_database: Path,
    tls_files: dict[str, str],
    server: str,
    args: list[str],
    message: str,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        names = {**tls_files, "TAKEN": str(taken.getsockname()[1])}
        args = [names.get(arg, arg) for arg in args]
        for name in sorted(names, key=len, reverse=True):  # OTHER_KEY before KEY
            message = message.replace(name, names[name])
        result = run_serve(
            "--server", server, *args, env=server_env(e2e_database, QWENWEB_BACKEND="memory")
        )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()  # one line, naming the option
    assert line.startswith(f"qwenweb.serve: error: {message}"), line


@pytest.mark.parametrize("server", ["granian", "daphne"])
def test_settings_django_refuses_exit_2_with_one_line(e2e_database: Path, server: str) -> None:
    env = server_env(e2e_database, DJANGO_DEBUG="0")
    env.pop("DJANGO_SECRET_KEY", None)
    result = run_serve("--server", server, env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "qwenweb.serve: error: DJANGO_SECRET_KEY must be set when DJANGO_DEBUG=0"
    ]


def test_head_answers_carry_the_get_headers_and_no_body(
    start: Callable[..., ServerProcess],
) -> None:
    # Django sends a HEAD answer's body; the server drops it (RFC 9110, 9.3.2).
    server = start()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(
            b"HEAD /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").lower().split("\r\n")
    assert lines[0] == "http/1.1 200 ok", head
    assert any(
        line.startswith("content-length: ") and line != "content-length: 0" for line in lines
    )
    assert body == b""
