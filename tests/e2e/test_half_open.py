"""Half-open peers: a reader that vanishes without FIN is found (docs/protocol.md, "Half-open
peers"; issue 12, item 7).

The server runs in a private network namespace, its readers in another, a router between
them (tests/support/netns.py). A blackhole rule in the router then drops every packet of
two readers, silently: one on an idle session (heartbeats only, every 2 s), one on a busy
session (10 events/s). With ``QWENWEB_WRITER_IDLE_TIMEOUT_S=5`` both must be gone from
``subscriberCount`` within 15 s (the writer idle timeout + 10 s), under
``python -m qwenweb.serve`` (granian), its ``--server daphne`` (daphne with flow control)
and uvicorn; a healthy reader of the busy session, on the same network, gets every event.
The control case turns the kernel's timeout off and must fail: the buffers in front of the
socket take the heartbeats and the events for minutes, nothing notices.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sessions.api_client import Publisher
from tests.support.netns import Network, network, unavailable_reason
from tests.support.server import (
    RawSSEClient,
    RemoteSession,
    ServerProcess,
    event_ids,
    get_json,
    open_stream,
    serve_argv,
    server_env,
)

_NO_NETNS = unavailable_reason()
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.own_backend,
    pytest.mark.skipif(_NO_NETNS is not None, reason=f"needs network namespaces: {_NO_NETNS}"),
]

PORT = 8000
WRITER_IDLE_TIMEOUT_S = 5.0
HEARTBEAT_S = 2.0
EVICTION_BOUND_S = WRITER_IDLE_TIMEOUT_S + 10.0
"""Issue 12's bound: a vanished peer is gone within the writer idle timeout + 10 s."""
BUSY_RATE_HZ = 10.0
MAX_BUSY_EVENTS = 400
"""Upper bound on events published to the busy session (40 s at 10/s)."""


def _argv(kind: str, host: str) -> list[str]:
    if kind == "serve":  # the production entry point: granian
        return serve_argv(PORT, host=host)
    if kind == "serve-daphne":
        return serve_argv(PORT, "--server", "daphne", host=host)
    return [
        sys.executable, "-m", "uvicorn", "qwenweb.asgi:application", "--host", host,
        "--port", str(PORT), "--lifespan", "off", "--log-level", "warning",
    ]  # fmt: skip


@pytest.fixture
def net() -> Iterator[Network]:
    with network() as made:
        yield made


def _start(net: Network, kind: str, database: Path, log: Path, **env: str) -> ServerProcess:
    env.setdefault("QWENWEB_HEARTBEAT_INTERVAL_S", str(HEARTBEAT_S))
    if not env["QWENWEB_HEARTBEAT_INTERVAL_S"]:
        del env["QWENWEB_HEARTBEAT_INTERVAL_S"]  # the default (15 s)
    server = ServerProcess(
        net.server_argv(_argv(kind, net.server_ip)),
        PORT,
        server_env(
            database,
            DJANGO_ALLOWED_HOSTS=net.server_ip,
            QWENWEB_WRITER_IDLE_TIMEOUT_S=str(WRITER_IDLE_TIMEOUT_S),
            # Inside its namespace 127.0.0.1 is not the host's: no Redis there. The
            # transport is what is tested; `make test-redis` skips it (own_backend).
            QWENWEB_BACKEND="memory",
            **env,
        ),
        log,
        host=net.server_ip,
    )
    server.ready = lambda: net.client_call(get_json, f"{server.base_url}/capabilities")
    return server.start()


class _BusyPublisher:
    """Publish ``tick`` events at 10/s from the client namespace until stopped (bounded)."""

    def __init__(self, net: Network, session: RemoteSession) -> None:
        self.ids: list[int] = []
        self._stop = threading.Event()
        self._future = net.client_submit(self._run, session)

    def _run(self, session: RemoteSession) -> None:
        publisher = Publisher(session.base_url, session.id, session.publish_token)
        try:
            for n in range(MAX_BUSY_EVENTS):
                if self._stop.wait(1 / BUSY_RATE_HZ):  # the pace under test
                    return
                self.ids.append(publisher.publish("tick", {"n": n}))
        finally:
            publisher.close()

    def stop(self) -> list[int]:
        self._stop.set()
        self._future.result(30)  # re-raises what publishing raised
        return self.ids


async def _reader(net: Network, session: RemoteSession, address: int) -> RawSSEClient:
    sock = await asyncio.to_thread(net.client_socket, address)
    return await open_stream(
        PORT, session.events_path, session.read_token, host=net.server_ip, sock=sock
    )


def _count(net: Network, session: RemoteSession) -> int:
    return int(net.client_call(session.load, timeout_s=10)["subscriberCount"])


async def _vanish_and_time(
    net: Network, server: ServerProcess
) -> tuple[dict[str, float | None], list[int], RawSSEClient]:
    """Two vanishing readers (idle, busy) and a healthy one; return how long each vanished
    one stayed counted after the blackhole (None: still counted at the bound), the ids
    published and the healthy reader."""
    idle = await asyncio.to_thread(net.client_call, RemoteSession.create, server.base_url)
    busy = await asyncio.to_thread(net.client_call, RemoteSession.create, server.base_url)
    readers = [await _reader(net, idle, 1), await _reader(net, busy, 2)]
    healthy = await _reader(net, busy, 0)
    try:
        assert await asyncio.to_thread(_count, net, idle) == 1
        assert await asyncio.to_thread(_count, net, busy) == 2
        publisher = _BusyPublisher(net, busy)
        try:
            await healthy.read_until(lambda events: len(events) >= 3, timeout_s=10)
            net.blackhole(1)
            net.blackhole(2)
            vanished_at = time.monotonic()
            gone: dict[str, float | None] = {"idle": None, "busy": None}
            while time.monotonic() - vanished_at < EVICTION_BOUND_S + 2:
                counts = {
                    "idle": await asyncio.to_thread(_count, net, idle),
                    "busy": await asyncio.to_thread(_count, net, busy) - 1,  # minus healthy
                }
                for name, count in counts.items():
                    if count == 0 and gone[name] is None:
                        gone[name] = time.monotonic() - vanished_at
                if None not in gone.values():
                    break
                await asyncio.sleep(0.2)  # polling interval of the bounded wait
        finally:
            ids = publisher.stop()
        last = ids[-1]
        await healthy.read_until(lambda events: last in event_ids(events), timeout_s=10)
        return gone, ids, healthy
    finally:
        for reader in (*readers, healthy):
            reader.close()


@pytest.mark.asyncio
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["serve", "serve-daphne", "uvicorn"])
async def test_reader_whose_packets_vanish_is_gone_within_writer_idle_timeout_plus_10_s(
    net: Network, kind: str, e2e_database: Path, tmp_path: Path
) -> None:
    server = _start(net, kind, e2e_database, tmp_path / "server.log")
    try:
        gone, ids, healthy = await _vanish_and_time(net, server)
        print(f"{kind}: vanished readers gone after {gone} s; {len(ids)} events published")
        for name, after_s in gone.items():
            assert after_s is not None, f"{name} reader still counted {EVICTION_BOUND_S} s on"
            assert after_s <= EVICTION_BOUND_S, f"{name} reader gone only after {after_s:.1f} s"
        assert event_ids(healthy.events) == ids  # the healthy reader on that network got all
    finally:
        server.stop()


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_with_the_default_heartbeat_too(
    net: Network, e2e_database: Path, tmp_path: Path
) -> None:
    # Issue 12's Done-when names only WRITER_IDLE_TIMEOUT_S=5: with the default heartbeat
    # (15 s) the stream's heartbeat is capped at half the kernel's timeout (3.5 s), so an
    # idle reader is still found within the bound.
    server = _start(
        net, "serve", e2e_database, tmp_path / "server.log", QWENWEB_HEARTBEAT_INTERVAL_S=""
    )
    try:
        gone, _ids, _healthy = await _vanish_and_time(net, server)
        print(f"serve, default heartbeat: vanished readers gone after {gone} s")
        for name, after_s in gone.items():
            assert after_s is not None, f"{name} reader still counted {EVICTION_BOUND_S} s on"
            assert after_s <= EVICTION_BOUND_S, f"{name} reader gone only after {after_s:.1f} s"
    finally:
        server.stop()


@pytest.mark.asyncio
@pytest.mark.timeout(120)
@pytest.mark.xfail(
    strict=True,
    reason="without TCP_USER_TIMEOUT nothing finds the vanished peer: granian's buffer and "
    "the kernel's take the bytes, so send never waits (this case proves the test can fail)",
)
async def test_without_the_kernel_timeout_a_vanished_reader_stays(
    net: Network, e2e_database: Path, tmp_path: Path
) -> None:
    server = _start(
        net, "serve", e2e_database, tmp_path / "server.log", QWENWEB_TCP_USER_TIMEOUT_S="0"
    )
    try:
        gone, _ids, _healthy = await _vanish_and_time(net, server)
        assert None not in gone.values(), gone
    finally:
        server.stop()
