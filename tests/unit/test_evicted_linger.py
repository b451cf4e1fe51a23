"""A frozen reader's connection during the linger after its eviction (B21; docs/protocol.md,
"A reader frozen while it is evicted"): real sockets and the real kernel. The server side
carries ``TCP_USER_TIMEOUT`` = 3 s, the reader reads nothing, so its receive window closes
and the kernel ends the connection after 3 s unless the linger raised the timeout.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sessions.bus import EventBus
from sessions.conf import get_config
from sessions.transport.evicted_linger import EvictedLinger, Linger
from sessions.transport.peer_timeout import (
    acknowledges_everything,
    configure_socket,
    connection_socket,
)
from tests.support.netns import _enter, network, unavailable_reason

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="TCP_USER_TIMEOUT is Linux's"
)

U_S = 3.0
"""The server side's TCP_USER_TIMEOUT: the linger's lookup must raise it before the kernel
ends the frozen connection, and a lookup waits up to ``_SCAN_INTERVAL_S`` (1 s, one scan a
second per process) plus its acknowledgement checks: at 1 s a loaded machine lost that
race (ETIMEDOUT before the reset under test)."""
RAISED_S = 30.0
FREEZE_S = 2 * U_S  # the reader reads nothing this long: two kernel timeouts


class Pair:
    """A server connection (accepted on a listener carrying U) and its frozen reader."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        configure_socket(self.listener, U_S)  # accepted sockets inherit it
        self.reader = socket.socket()
        self.reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        self.reader.connect(self.listener.getsockname())
        self.server, _ = self.listener.accept()
        self.sent = 0

    def fill(self) -> None:
        """Write until the kernel takes no more: the reader's window is closed."""
        self.server.setblocking(False)
        while True:
            try:
                self.sent += self.server.send(b"x" * 65536)
            except BlockingIOError:
                return

    def linger(self, *, http1: bool = True) -> EvictedLinger:
        peer = self.reader.getsockname()
        return EvictedLinger(
            (peer[0], peer[1]), self.listener.getsockname()[1], U_S, RAISED_S, http1=http1
        )

    def read_all(self) -> int:
        self.reader.settimeout(5)
        got = 0
        while got < self.sent and (chunk := self.reader.recv(1 << 20)):
            got += len(chunk)
        return got

    def close(self) -> None:
        for sock in (self.reader, self.server, self.listener):
            sock.close()


@pytest.fixture
def pair() -> Iterator[Pair]:
    made = Pair()
    yield made
    made.close()


def _so_error(sock: socket.socket) -> int:
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)


def _user_timeout_ms(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)


async def _evicted(linger: EvictedLinger) -> None:
    linger.evicted()
    assert linger.settled is not None
    async with asyncio.timeout(10):
        await linger.settled


def test_without_the_linger_the_kernel_ends_a_frozen_reader_after_u(pair: Pair) -> None:
    # The control: what issue 26's battery saw (a reset) — the test below can fail.
    pair.fill()
    deadline = time.monotonic() + 5 * FREEZE_S
    while _so_error(pair.server) != errno.ETIMEDOUT:
        assert time.monotonic() < deadline, "the kernel never ended the frozen connection"
        time.sleep(0.1)  # polling interval of the bounded wait
    with pytest.raises(ConnectionResetError):
        pair.read_all()


@pytest.mark.asyncio
async def test_the_raised_timeout_keeps_a_frozen_reader_past_u(pair: Pair) -> None:
    pair.fill()
    linger = pair.linger()
    await _evicted(linger)
    assert linger.raised
    assert _user_timeout_ms(pair.server) == RAISED_S * 1000
    await asyncio.sleep(FREEZE_S)  # the freeze under test: past U, twice
    assert _so_error(pair.server) == 0
    assert pair.read_all() == pair.sent  # every byte, no reset
    linger.close()
    assert _user_timeout_ms(pair.server) == U_S * 1000  # U back for the connection's reuse


@pytest.mark.asyncio
async def test_readers_evicted_together_are_found_in_one_batch(pair: Pair) -> None:
    other = Pair()
    try:
        pair.fill()
        other.fill()
        lingers = [pair.linger(), other.linger()]
        for linger in lingers:
            linger.evicted()
        async with asyncio.timeout(10):
            await asyncio.gather(*(linger.settled for linger in lingers if linger.settled))
        assert [linger.raised for linger in lingers] == [True, True]
        assert _user_timeout_ms(other.server) == RAISED_S * 1000
        for linger in lingers:
            linger.close()
    finally:
        other.close()


@pytest.mark.asyncio
async def test_when_the_linger_runs_out_the_connection_is_reset_at_once(pair: Pair) -> None:
    # The server keeps its own descriptor (granian keeps writing to a closed window): the
    # reset must not wait for it, and must drop what the kernel holds for the reader.
    pair.fill()
    linger = pair.linger()
    await _evicted(linger)
    linger.expired()
    linger.close()
    assert _so_error(pair.server) == errno.ECONNRESET  # the server's writes now fail
    with pytest.raises(ConnectionResetError):
        pair.read_all()


@pytest.mark.asyncio
async def test_an_http2_connection_is_not_reset_it_carries_other_streams(pair: Pair) -> None:
    pair.fill()
    linger = pair.linger(http1=False)
    await _evicted(linger)
    linger.expired()
    linger.close()
    pair.server.setblocking(True)
    pair.server.shutdown(socket.SHUT_WR)
    assert pair.read_all() == pair.sent


@pytest.mark.asyncio
async def test_a_stream_that_ended_before_the_lookup_leaves_the_connection_alone(
    pair: Pair,
) -> None:
    linger = pair.linger()
    linger.close()
    linger.evicted()  # (an eviction on the stream's way out)
    assert linger.settled is None
    assert _user_timeout_ms(pair.server) == U_S * 1000


def test_connection_socket_finds_the_connection_by_its_peer(pair: Pair) -> None:
    port = pair.listener.getsockname()[1]
    found = connection_socket(pair.reader.getsockname(), port)
    assert found is not None
    try:
        assert found.getpeername() == pair.reader.getsockname()
        assert acknowledges_everything(found)  # on loopback everything is acknowledged
    finally:
        found.close()
    assert connection_socket(("127.0.0.1", 1), port) is None
    assert connection_socket(pair.reader.getsockname(), port + 1 if port < 65535 else 1) is None


def test_attach_hooks_the_eviction_only_where_it_applies() -> None:
    config = get_config()
    scope: dict[str, Any] = {
        "client": ("127.0.0.1", "50000"),  # granian gives the port as a string
        "server": ("127.0.0.1", "8000"),
        "http_version": "1.1",
    }
    subscription = EventBus(8).subscribe()
    linger = Linger.attach(scope, subscription, config)
    assert isinstance(linger, EvictedLinger)
    assert subscription.on_evicted == linger.evicted
    behind_unix_socket = EventBus(8).subscribe()
    assert not isinstance(
        Linger.attach({**scope, "client": None}, behind_unix_socket, config), EvictedLinger
    )
    assert behind_unix_socket.on_evicted is None


_NO_NETNS = unavailable_reason()


@pytest.mark.skipif(_NO_NETNS is not None, reason=f"needs network namespaces: {_NO_NETNS}")
def test_a_vanished_peer_with_bytes_in_flight_keeps_u() -> None:
    # A peer gone without FIN acknowledges nothing: the linger must not keep it for longer
    # than U (vanished peers are still dropped within U; docs/protocol.md, Half-open peers).
    with network() as net:
        made: list[socket.socket] = []

        def listen() -> None:
            _enter(net.server_ns)  # (this short-lived thread only)
            made.append(socket.create_server((net.server_ip, 0)))

        thread = threading.Thread(target=listen)
        thread.start()
        thread.join(10)
        listener = made[0]
        reader = net.client_socket(1)
        try:
            net.client_call(reader.connect, listener.getsockname())
            server, _ = listener.accept()
            configure_socket(server, 30.0)
            with server:
                server.sendall(b"hello")
                net.blackhole(1)
                server.sendall(b"x" * 1000)  # never acknowledged
                port = listener.getsockname()[1]
                linger = EvictedLinger(reader.getsockname(), port, 30.0, RAISED_S, http1=True)
                assert not acknowledges_everything(server)
                asyncio.run(_evicted(linger))
                assert not linger.raised
                assert _user_timeout_ms(server) == 30_000
        finally:
            reader.close()
            listener.close()
