"""A crash or a restart of the only server process is just another disconnect (issue 24).

One ``python -m qwenweb.serve`` process on a fresh database with the default settings
(the durable backend, its log beside the database), a publisher posting over HTTP all
along; the server's whole process group is killed with SIGKILL ``QWENWEB_SOAK_KILLS``
times (5; ``make soak``: 20) and stopped with SIGTERM (``DRAIN_S=1``)
``QWENWEB_SOAK_TERMS`` times (1; ``make soak``: 5), each time restarted on the same
database. Then a client away since before the first crash resumes with its cursor and
epoch: it gets every acknowledged event since, once, in order, then ``replay_complete``,
and no ``state_resync_required``.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import (
    RemoteSession,
    ServerProcess,
    free_port,
    migrate,
    open_stream,
    request_json,
    serve_argv,
    server_env,
    wait_for,
)

pytestmark = [pytest.mark.own_backend, pytest.mark.asyncio, pytest.mark.timeout(600)]

KILLS = int(os.environ.get("QWENWEB_SOAK_KILLS", "5"))
TERMS = int(os.environ.get("QWENWEB_SOAK_TERMS", "1"))
ACKS_PER_ROUND = 15
"""Acknowledged publishes each server life sees before it is stopped (at least)."""
ROUND_WAIT_S = 60.0


class Publisher(threading.Thread):
    """Publishes ``{"n": k}`` over HTTP until halted; keeps every acknowledged (n, id, epoch).

    A publish that got no 200 (refused connection, reset, 503) is not acknowledged: the
    next one carries the next n (never retried, so an n seen twice is a duplicate)."""

    def __init__(self, session: RemoteSession) -> None:
        super().__init__(daemon=True)
        self.session = session
        self.acked: list[tuple[int, int, str]] = []
        self.failures = 0
        self._halt = threading.Event()

    def run(self) -> None:
        n = 0
        url = f"{self.session.base_url}{self.session.events_path}"
        while not self._halt.is_set():
            n += 1
            try:
                status, body = request_json(
                    "POST", url, {"type": "note", "data": {"n": n}}, self.session.publish_token
                )
            except (OSError, urllib.error.URLError, ValueError):
                status, body = 0, None
            if status == 200:
                self.acked.append((n, int(body["id"]), str(body["epoch"])))
            else:
                self.failures += 1
                self._halt.wait(0.02)  # (a server starting: do not spin)

    def halt(self) -> None:
        self._halt.set()
        self.join(30)


def _server(port: int, env: dict[str, str], log: Path) -> ServerProcess:
    return ServerProcess(serve_argv(port), port, env, log).start(timeout_s=60)


async def test_kill_9_and_sigterm_restarts_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    database = tmp_path / "db.sqlite3"
    migrate(database)
    env = server_env(database, QWENWEB_DRAIN_S="1")
    env.pop("QWENWEB_BACKEND", None)  # the default settings: the durable backend
    env.pop("QWENWEB_EVENT_LOG_PATH")  # its log beside the database
    port = free_port()
    server = _server(port, env, tmp_path / "serve.log")
    session = RemoteSession.create(server.base_url, ringSize=10_000)
    away_cursor = session.publish("note", {"before": 1})
    away_epoch = session.load()["epoch"]
    publisher = Publisher(session)
    publisher.start()
    stops = ["kill"] * KILLS + ["term"] * TERMS
    random.Random(24).shuffle(stops)
    try:
        for stop in stops:
            target = len(publisher.acked) + ACKS_PER_ROUND
            assert wait_for(lambda t=target: len(publisher.acked) >= t, ROUND_WAIT_S), (
                f"{len(publisher.acked)} acknowledged, wanted {target}; log: {server.log()[-1500:]}"
            )
            if stop == "kill":
                server.kill()  # SIGKILL, the whole process tree at once
            else:
                server.stop()  # SIGTERM: drain (DRAIN_S=1), flush, exit
            server = _server(port, env, tmp_path / "serve.log")
        target = len(publisher.acked) + ACKS_PER_ROUND
        assert wait_for(lambda: len(publisher.acked) >= target, ROUND_WAIT_S)
        publisher.halt()
        client = await open_stream(
            port,
            session.events_path,
            session.read_token,
            [("Last-Event-ID", str(away_cursor)), ("X-Event-Epoch", away_epoch)],
        )
        events = await client.read_until(
            lambda got: any(e.type == "replay_complete" for e in got), 30
        )
        await client.aclose()
        metrics = urllib.request.urlopen(f"{server.base_url}/metrics", timeout=10).read().decode()
    finally:
        publisher.halt()
        server.stop()
    types = [e.type for e in events]
    assert "state_resync_required" not in types, types[:5]
    assert types[-1] == "replay_complete", types[-5:]
    frames: list[dict[str, Any]] = [json.loads(e.data) for e in events if e.type == "note"]
    ids = [f["id"] for f in frames]
    assert ids == list(range(away_cursor + 1, away_cursor + 1 + len(ids))), "a gap or a repeat"
    numbers = [f["data"]["n"] for f in frames]
    assert len(numbers) == len(set(numbers)), "an event was stored twice"
    by_number = {f["data"]["n"]: f["id"] for f in frames}
    lost = [(n, i) for n, i, _ in publisher.acked if by_number.get(n) != i]
    assert lost == [], f"{len(lost)} acknowledged events lost or renumbered: {lost[:5]}"
    assert {epoch for _, _, epoch in publisher.acked} == {away_epoch}
    rows = [line for line in metrics.splitlines() if line.startswith("qwenweb_event_log_rows")]
    assert rows, "no qwenweb_event_log_rows in /metrics"
    assert float(rows[0].split()[-1]) > 0  # (a gauge flushed every second: a lower bound)
    assert "qwenweb_event_log_commit_seconds_bucket" in metrics
    print(
        f"{KILLS} kills, {TERMS} SIGTERMs: {len(publisher.acked)} acknowledged, "
        f"{len(frames)} replayed, {publisher.failures} publishes refused while down, "
        f"0 lost, 0 duplicated, 0 resync ({time.strftime('%H:%M:%S')})"
    )
