"""The kernel's timeouts for half-open peers on the process's own sockets (docs/protocol.md,
"Half-open peers"): real sockets on 127.0.0.1, options read back with ``getsockopt``."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator

import pytest

from sessions.transport.peer_timeout import (
    PeerTimeouts,
    granian_http2_keepalive_args,
    socket_options,
)

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="TCP_USER_TIMEOUT is Linux's"
)


def _user_timeout_ms(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.create_server(("127.0.0.1", 0))
    yield sock
    sock.close()


def test_options_for_seven_seconds() -> None:
    options = dict(((level, name), value) for level, name, value in socket_options(7))
    assert options[(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)] == 7000
    assert options[(socket.SOL_SOCKET, socket.SO_KEEPALIVE)] == 1
    assert options[(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)] == 2
    assert options[(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)] == 3
    with pytest.raises(ValueError, match="user_timeout_s"):
        socket_options(0)


def test_listener_and_its_accepted_connection_get_the_timeout_and_later_ones_inherit_it(
    listener: socket.socket,
) -> None:
    # One connection accepted before (the first stream's own), one after: both covered.
    before = socket.create_connection(listener.getsockname())
    accepted_before, _ = listener.accept()
    outgoing = socket.create_connection(listener.getsockname())  # a client end
    accepted_outgoing, _ = listener.accept()
    timeouts = PeerTimeouts(7)
    try:
        timeouts.ensure()
        assert timeouts.listeners >= 1
        assert timeouts.connections >= 1
        assert _user_timeout_ms(listener) == 7000
        assert _user_timeout_ms(accepted_before) == 7000
        assert _user_timeout_ms(outgoing) == 0  # client ends (other ports) are left alone
        after = socket.create_connection(listener.getsockname())
        accepted_after, _ = listener.accept()
        assert _user_timeout_ms(accepted_after) == 7000  # inherited from the listener
        assert accepted_after.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        for sock in (after, accepted_after):
            sock.close()
    finally:
        for sock in (before, accepted_before, outgoing, accepted_outgoing):
            sock.close()


def test_ensure_runs_once_and_zero_turns_it_off(listener: socket.socket) -> None:
    off = PeerTimeouts(0)
    off.ensure()
    assert _user_timeout_ms(listener) == 0
    assert off.listeners == 0
    once = PeerTimeouts(3)
    once.ensure()
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 0)
    once.ensure()  # the second call does nothing
    assert _user_timeout_ms(listener) == 0


def test_granian_http2_ping_options() -> None:
    assert granian_http2_keepalive_args(7) == [
        "--http2-keep-alive-interval", "2333", "--http2-keep-alive-timeout", "7",
    ]  # fmt: skip
    assert granian_http2_keepalive_args(3600)[1] == "60000"  # granian's upper bound
