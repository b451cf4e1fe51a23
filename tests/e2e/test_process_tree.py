"""A server's processes end together (docs/deployment.md, "Stopping").

- ``kill -9`` of ``python -m qwenweb.serve``'s main process (one worker on the memory
  backend; two on Redis): within 2 s no process of the tree is left (the pids read from
  ``/proc`` before the kill), the port can be bound again, and the open stream got its
  terminal frame and its record.
- ``kill -9`` of ``manage.py demo``: the server it started ends as well, as fast.
- SIGTERM, with an HTTP/2 client that stopped reading: the whole tree is gone within
  ``DRAIN_S`` + 5 s (granian alone would wait for that connection 14 s more).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from sessions.serving.listen import CannotListen, check_can_listen
from tests.support.backend import delete_run_keys, redis_url
from tests.support.h2client import H2Connection
from tests.support.server import (
    RemoteSession,
    ServerProcess,
    free_port,
    get_json,
    open_stream,
    running,
    serve_argv,
    server_env,
    stop_all,
    wait_for,
)
from tests.support.tls import tls_argv

pytestmark = [pytest.mark.e2e, pytest.mark.own_backend, pytest.mark.asyncio]

PARENT_DEATH_BOUND_S: Final = 2.0
"""Issue 22: after a ``kill -9`` of the main process, no process of the server is left
and the port is free within this."""

DRAIN_S: Final = 2.0
SIGTERM_MARGIN_S: Final = 5.0
"""Issue 22: SIGTERM ends the whole tree within ``DRAIN_S`` + this."""


@pytest.fixture
def start(e2e_database: Path, tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """``start(argv_for_port, **env)``: a server (``argv_for_port(port)``) on a free port.

    Afterwards every process of every tree started is gone (stopped, or killed), and the
    Redis keys of the run's prefix are deleted.
    """
    started: list[ServerProcess] = []
    trees: list[int] = []
    prefix = f"qwtest-{secrets.token_hex(4)}"

    def _start(argv_for_port: Callable[[int], list[str]], **env: str) -> ServerProcess:
        port = free_port()
        env = {"QWENWEB_REDIS_URL": redis_url(), "QWENWEB_REDIS_KEY_PREFIX": prefix, **env}
        log = tmp_path / f"server-{len(started)}.log"
        server = ServerProcess(argv_for_port(port), port, server_env(e2e_database, **env), log)
        server.tls = "--tls" in server.argv or "--certfile" in server.argv
        started.append(server)
        server.start(timeout_s=60)
        trees.extend(server.pids())
        return server

    yield _start
    stop_all(started)
    for pid in running(trees):  # a test that failed: what outlived its parent
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    delete_run_keys(prefix, redis_url())


def connections(database: Path, session_id: str) -> list[dict[str, Any]]:
    with sqlite3.connect(database) as db:
        db.row_factory = sqlite3.Row
        cursor = db.execute(
            "SELECT * FROM agent_sessions_subscriberconnection WHERE session_id = ?",
            (session_id,),
        )
        return [dict(row) for row in cursor]


def port_free(port: int) -> bool:
    """Whether a server could bind 127.0.0.1:``port`` now (``qwenweb.serve``'s own check)."""
    try:
        check_can_listen("127.0.0.1", port)
    except CannotListen:
        return False
    return True


async def kill_9_and_wait(server: ServerProcess, pid: int, expected: int) -> float:
    """SIGKILL ``pid`` (the root of ``server``'s tree of ``expected`` processes); return
    how long until none of them runs and the port is free (bounded: fails naming what is
    left)."""
    pids = server.pids()
    assert len(pids) == expected, pids
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    await asyncio.to_thread(
        wait_for, lambda: not running(pids) and port_free(server.port), PARENT_DEATH_BOUND_S
    )
    took_s = time.monotonic() - killed_at
    left = running(pids)
    assert not left, f"still running {PARENT_DEATH_BOUND_S} s after kill -9: {left}"
    assert port_free(server.port), f"port {server.port} still taken after {took_s:.2f} s"
    return took_s


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("workers", "backend"), [(1, "memory"), (2, "redis")], ids=["1-worker", "2-workers-redis"]
)
async def test_kill_9_of_the_main_process_ends_its_workers_and_frees_the_port(
    start: Callable[..., ServerProcess], e2e_database: Path, workers: int, backend: str
) -> None:
    server = start(
        lambda port: serve_argv(port, "--workers", str(workers)), QWENWEB_BACKEND=backend
    )
    session = RemoteSession.create(server.base_url)
    stream = await open_stream(server.port, session.events_path, session.read_token)
    try:
        session.publish("note", {"n": 1})
        await stream.read_events(1)
        assert server.process is not None
        took_s = await kill_9_and_wait(server, server.process.pid, 1 + workers)
        await stream.read_to_end(timeout_s=PARENT_DEATH_BOUND_S)
    finally:
        await stream.aclose()
    print(f"{workers} worker(s) gone {took_s:.2f} s after kill -9 of the main process")
    assert [e.type for e in stream.events] == ["note", "stream_error"]
    assert json.loads(stream.events[-1].data)["data"]["code"] == "server_draining"
    rows = connections(e2e_database, session.id)
    assert [row["end_reason"] for row in rows] == ["server_shutdown"]
    assert rows[0]["bytes_sent"] == len(stream.body)


@pytest.mark.timeout(90)
async def test_kill_9_of_the_demo_ends_the_server_it_started(
    start: Callable[..., ServerProcess],
) -> None:
    server = start(
        lambda port: [sys.executable, "manage.py", "demo", "--no-agent", "--port", str(port)]
    )
    session = RemoteSession.create(server.base_url)
    stream = await open_stream(server.port, session.events_path, session.read_token)
    try:
        session.publish("note", {"n": 1})
        await stream.read_events(1)
        assert server.process is not None
        took_s = await kill_9_and_wait(server, server.process.pid, 2)  # demo, its server
        await stream.read_to_end(timeout_s=PARENT_DEATH_BOUND_S)
    finally:
        await stream.aclose()
    print(f"the demo's server gone {took_s:.2f} s after kill -9 of the demo")
    assert [e.type for e in stream.events] == ["note", "stream_error"]


@pytest.mark.timeout(90)
async def test_sigterm_ends_the_tree_within_drain_s_plus_5_s(
    start: Callable[..., ServerProcess],
) -> None:
    server = start(lambda port: serve_argv(port, *tls_argv()), QWENWEB_DRAIN_S=str(DRAIN_S))
    session = RemoteSession.create(server.base_url)
    http2 = await H2Connection(server.port).connect()
    try:
        stream = http2.open_stream(session.events_path, session.read_token)
        await http2.read_until(lambda: bool(stream.status))
        assert get_json(f"{server.base_url}/readyz")["status"] == "ready"
        pids = server.pids()
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        # The client reads nothing more: its connection stays open until the server ends.
        bound_s = DRAIN_S + SIGTERM_MARGIN_S
        gone = await asyncio.to_thread(wait_for, lambda: not running(pids), bound_s)
        took_s = time.monotonic() - started
    finally:
        await http2.aclose()
    assert gone, f"still running {bound_s} s after SIGTERM: {running(pids)}"
    assert server.process.wait(timeout=1) == 0
    print(f"tree of {len(pids)} gone {took_s:.2f} s after SIGTERM (DRAIN_S={DRAIN_S:g})")
