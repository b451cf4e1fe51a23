"""``/readyz`` and ``/metrics`` of real server processes (issue 16, "Done when").

- Readiness: a process whose Redis URL points at a port where nothing listens answers
  ``/readyz`` 503 naming Redis, while ``/healthz`` stays 200.
- Several processes: two ``python -m qwenweb.serve`` processes under Redis share one
  ``PROMETHEUS_MULTIPROC_DIR``; either one's ``/metrics`` gives the sums of both, and
  the live gauges of a process killed with SIGKILL leave the sums at the next scrape.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.server import (
    RawSSEClient,
    RemoteSession,
    ServerProcess,
    free_port,
    open_stream,
    redis_cluster,
    serve_argv,
    server_env,
    wait_for,
)

pytestmark = [pytest.mark.e2e]

WAIT_S = 10.0


def get(url: str, host: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if host is not None:
        request.add_header("Host", host)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def sample(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_readyz_is_503_when_redis_does_not_answer_and_healthz_stays_200(
    e2e_database: Path, tmp_path: Path
):
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    port = free_port()
    env = server_env(e2e_database, QWENWEB_BACKEND="redis", QWENWEB_REDIS_URL=dead)
    server = ServerProcess(serve_argv(port), port, env, tmp_path / "serve.log").start()
    try:
        status, body = get(f"{server.base_url}/readyz", host=f"10.0.3.7:{port}")
        assert status == 503, body
        assert '"code":"not_ready"' in body
        assert "redis" in body
        assert get(f"{server.base_url}/healthz", host=f"10.0.3.7:{port}")[0] == 200
    finally:
        server.stop()


@pytest.fixture
def start_server(e2e_database: Path, tmp_path: Path) -> Iterator[Callable[[str], ServerProcess]]:
    directory = tmp_path / "prometheus"
    directory.mkdir()
    with redis_cluster(e2e_database, tmp_path, PROMETHEUS_MULTIPROC_DIR=str(directory)) as cluster:
        yield cluster


@pytest.mark.asyncio
async def test_metrics_of_two_processes_are_sums_and_a_killed_ones_gauges_leave(start_server):
    a, b = start_server("a"), start_server("b")
    assert get(f"{a.base_url}/readyz")[0] == 200
    session = RemoteSession.create(a.base_url)
    streams = [
        await open_stream(server.port, session.events_path, session.read_token)
        for server in (a, b, b)
    ]
    for base_url, count in ((a.base_url, 3), (b.base_url, 2)):
        for n in range(count):
            RemoteSession(base_url, session.id, "", session.publish_token).publish("tick", n)
    for stream in streams:
        await stream.read_events(5, timeout_s=WAIT_S)

    def scraped(name: str, value: float) -> bool:  # b flushes within a second
        return sample(get(f"{a.base_url}/metrics")[1], name) == value

    assert wait_for(lambda: scraped("qwenweb_subscribers", 3), WAIT_S)
    assert wait_for(lambda: scraped("qwenweb_events_published_total", 5), WAIT_S)
    assert wait_for(lambda: scraped("qwenweb_frames_sent_total", 15), WAIT_S)
    b.kill()  # SIGKILL, its worker too: processes that die without cleaning up
    text = get(f"{a.base_url}/metrics")[1]
    assert sample(text, "qwenweb_subscribers") == 1  # its live gauge files were removed
    assert sample(text, "qwenweb_events_published_total") == 5  # its counts stay
    for stream in streams:
        stream.close()


def test_a_bad_host_header_logs_one_short_line_without_traceback(
    e2e_database: Path, tmp_path: Path
):
    port = free_port()
    env = server_env(e2e_database)
    server = ServerProcess(serve_argv(port), port, env, tmp_path / "serve.log").start()
    try:
        before = len(server.log())
        status, _ = get(f"{server.base_url}/capabilities", host="h" * 8192)
        assert status == 400
        assert get(f"{server.base_url}/healthz", host="h" * 100)[0] == 200
        assert wait_for(lambda: "disallowed_host" in server.log()[before:], WAIT_S)
    finally:
        server.stop()
    written = server.log()[before:]
    lines = [line for line in written.splitlines() if "disallowed_host" in line]
    assert len(lines) == 1
    assert len(lines[0]) < 300
    assert "Traceback" not in written


@pytest.mark.asyncio
async def test_metrics_of_workers_2_on_one_port_are_the_sums(e2e_database: Path, tmp_path: Path):
    directory = tmp_path / "prometheus"
    directory.mkdir()
    streams: list[RawSSEClient] = []
    with redis_cluster(e2e_database, tmp_path, PROMETHEUS_MULTIPROC_DIR=str(directory)) as cluster:
        server = cluster("serve", "--workers", "2")
        try:
            session = RemoteSession.create(server.base_url)
            # Connections reach either worker: open them until both hold some (bounded).
            while len(streams) < 40 and len(_pids_with_streams(directory)) < 2:
                streams.append(
                    await open_stream(server.port, session.events_path, session.read_token)
                )
            assert len(_pids_with_streams(directory)) == 2, "every connection reached one worker"
            for n in range(4):
                session.publish("tick", n)
            for stream in streams:
                await stream.read_events(4, timeout_s=WAIT_S)
            count = len(streams)
            assert wait_for(lambda: _scrape(server, "qwenweb_subscribers") == count, WAIT_S)
            assert wait_for(lambda: _scrape(server, "qwenweb_events_published_total") == 4, WAIT_S)
            assert wait_for(
                lambda: _scrape(server, "qwenweb_frames_sent_total") == 4 * count, WAIT_S
            )
        finally:
            for stream in streams:
                stream.close()


def _scrape(server: ServerProcess, name: str) -> float:
    return sample(get(f"{server.base_url}/metrics")[1], name)


def _pids_with_streams(directory: Path) -> set[str]:
    """Pids whose live-gauge file exists: the workers that have opened a stream."""
    return {path.stem.rpartition("_")[2] for path in directory.glob("gauge_livesum_*.db")}
