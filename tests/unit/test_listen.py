"""``sessions.serving.listen``: where ``qwenweb.serve`` and ``manage.py demo`` may listen."""

from __future__ import annotations

import socket

import pytest

from sessions.serving.listen import CannotListen, check_address, check_can_listen, check_port


@pytest.mark.parametrize("port", [1, 8000, 65535])
def test_ports_1_to_65535_are_taken(port: int) -> None:
    check_port(port)


@pytest.mark.parametrize("port", [0, -1, 65536, 99999])
def test_other_ports_are_refused(port: int) -> None:
    with pytest.raises(CannotListen, match="must be 1 to 65535"):
        check_port(port)


@pytest.mark.parametrize("address", ["127.0.0.1", "0.0.0.0", "::1", "::", "::ffff:127.0.0.1"])
def test_ip_addresses_are_taken(address: str) -> None:
    check_address(address)


@pytest.mark.parametrize(
    "address", ["localhost", "example.invalid", "999.1.1.1", "127.1", "fe80::1%lo", ""]
)
def test_anything_but_an_ip_address_is_refused(address: str) -> None:
    # granian parses the address itself: no name, no IPv6 zone.
    with pytest.raises(CannotListen, match="not an IP address"):
        check_address(address)


def test_a_port_a_socket_listens_on_is_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CannotListen, match=f"^127.0.0.1:{port} is already in use$") as caught:
            check_can_listen("127.0.0.1", port)
    assert caught.value.in_use
    assert caught.value.in_use_message(other="another server", retry="-p 1") == (
        f"127.0.0.1:{port} is already in use (another server?): choose another port, e.g. -p 1"
    )


def test_connections_in_time_wait_do_not_make_a_port_in_use() -> None:
    # An earlier server's (it set SO_REUSEADDR, as granian and Twisted do, and the
    # connections it accepted inherit it): its side closed first, so it stays in TIME_WAIT
    # on the port after the listener is gone. A bind without SO_REUSEADDR would fail.
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = listener.accept()
            accepted.close()
            assert client.recv(1) == b""
    with socket.socket() as plain, pytest.raises(OSError, match="in use"):
        plain.bind(("127.0.0.1", port))  # the TIME_WAIT is there
    check_can_listen("127.0.0.1", port)


def test_an_address_of_another_machine_cannot_be_bound() -> None:
    with pytest.raises(CannotListen, match=r"^cannot listen on \[::2\]:\d+: ") as caught:
        check_can_listen("::2", 8000)
    assert not caught.value.in_use
