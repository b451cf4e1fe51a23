"""Half-open peers: the kernel's ``TCP_USER_TIMEOUT`` and keepalive on the server's sockets.

Why the kernel
    A peer that vanishes without FIN (a laptop lid closed, a NAT entry expired, a cable
    pulled) is invisible to the application under a server that buffers: granian's
    ``send`` returns as soon as its own buffer and the kernel's socket buffer take the
    bytes (measured: 3.87 MB of unacknowledged data before ``send`` blocked), so the
    writer idle timeout of :mod:`sessions.transport.pump` only fires once megabytes of
    heartbeats have piled up — hours for an idle stream. The kernel knows at once that
    nothing is acknowledged. With ``TCP_USER_TIMEOUT`` = U, a connection whose sent bytes
    stay unacknowledged for U seconds is closed with ``ETIMEDOUT``; the server then ends
    the request (``http.disconnect``, or ``send`` raises) and the stream ends with
    ``client_disconnect`` (EB-20). An idle stream has bytes in flight every
    ``HEARTBEAT_INTERVAL_S`` (its heartbeat), so it is found within heartbeat + U of the
    vanishing; a busy one within U of its next frame. Keepalive probes (idle U/3, then
    every U/3) cover a connection with nothing to send; with ``TCP_USER_TIMEOUT`` set the
    kernel ends it after U without acknowledgement too.

Why on the listening sockets, found in this process
    On Linux a socket returned by ``accept`` inherits these options from its listening
    socket. Granian builds its listener itself in Rust (in each worker, after the ASGI
    lifespan startup) and accepts no pre-bound socket; uvicorn and daphne take one
    (``--fd``) but only from whoever starts them. The application runs in the process that
    owns the listener under each of them, so :class:`PeerTimeouts` finds the process's
    listening TCP sockets in ``/proc/self/fd`` and sets the options on them once, at the
    first stream, together with the connections already accepted from them (so the first
    stream's own connection is covered). Server-agnostic: granian, uvicorn, daphne,
    hypercorn.

Limits
    Linux only (elsewhere :meth:`PeerTimeouts.ensure` does nothing). Behind a reverse proxy
    the kernel sees the proxy, whose connection stays healthy when the browser vanishes:
    there only the proxy's own timeouts help (docs/deployment.md). A connection that
    completes its handshake in the microseconds between the two scans keeps the defaults.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

__all__ = [
    "GRANIAN_HTTP2_KEEPALIVE_OPTIONS",
    "ConnectionKey",
    "PeerTimeouts",
    "acknowledges_everything",
    "configure_socket",
    "connection_socket",
    "connection_sockets",
    "granian_http2_keepalive_args",
    "socket_options",
    "tcp_sockets",
]

logger = logging.getLogger("qwenweb.stream")

_FD_DIR: Final = "/proc/self/fd"
KEEPALIVE_PROBES: Final = 3
"""Unanswered keepalive probes before the kernel gives up (``TCP_KEEPCNT``)."""

GRANIAN_HTTP2_KEEPALIVE_OPTIONS: Final = (
    "--http2-keep-alive-interval",
    "--http2-keep-alive-timeout",
)
"""Granian's HTTP/2 PING options (interval in ms, timeout in s): an unanswered PING closes the
whole connection. See :func:`granian_http2_keepalive_args`."""


def socket_options(user_timeout_s: float) -> list[tuple[int, int, int]]:
    """The ``(level, option, value)`` triples set on a server socket for timeout U seconds.

    ``SO_KEEPALIVE`` on; ``TCP_KEEPIDLE`` and ``TCP_KEEPINTVL`` U/3 (at least 1 s);
    ``TCP_KEEPCNT`` 3; ``TCP_USER_TIMEOUT`` U in milliseconds. Raises ``ValueError`` for
    U ≤ 0.
    """
    if user_timeout_s <= 0:
        raise ValueError(f"user_timeout_s must be > 0; got {user_timeout_s!r}")
    probe_s = max(1, round(user_timeout_s / 3))
    return [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, probe_s),
        (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, probe_s),
        (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES),
        (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, max(1, round(user_timeout_s * 1000))),
    ]


def configure_socket(sock: socket.socket, user_timeout_s: float) -> None:
    """Set :func:`socket_options` on ``sock`` (a TCP socket, listening or connected).

    Raises ``OSError`` from ``setsockopt``.
    """
    for level, option, value in socket_options(user_timeout_s):
        sock.setsockopt(level, option, value)


def granian_http2_keepalive_args(user_timeout_s: float) -> list[str]:
    """Granian command-line options that PING every HTTP/2 connection (for the serve entry).

    Interval U/3 (ms, granian's bound 60,000), timeout U (s, at least 1): a connection whose
    peer stopped answering is closed, with all its streams, within about 4/3 U. Redundant
    with ``TCP_USER_TIMEOUT`` on a direct connection; what remains when the kernel's option
    cannot be set (not Linux).
    """
    interval_ms = min(60_000, max(1, round(user_timeout_s * 1000 / 3)))
    return [
        GRANIAN_HTTP2_KEEPALIVE_OPTIONS[0], str(interval_ms),
        GRANIAN_HTTP2_KEEPALIVE_OPTIONS[1], str(max(1, round(user_timeout_s))),
    ]  # fmt: skip


@dataclass
class _Found:
    fd: int
    sock: socket.socket
    listening: bool
    local: tuple[str, int]


def tcp_sockets() -> Iterator[_Found]:
    """This process's TCP sockets (each a dup the caller closes)."""
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return
    for name in names:
        try:
            if not os.readlink(f"{_FD_DIR}/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue  # closed meanwhile, or not ours to read
        try:
            if sock.family not in (socket.AF_INET, socket.AF_INET6) or (
                sock.type != socket.SOCK_STREAM
            ):
                sock.close()
                continue
            listening = bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
            local = sock.getsockname()
        except OSError:
            sock.close()
            continue
        yield _Found(int(name), sock, listening, (str(local[0]), int(local[1])))


def _plain_ip(host: str) -> str:
    """``::ffff:1.2.3.4`` (an IPv4 peer on a dual-stack socket) as ``1.2.3.4``."""
    return host[7:] if host.lower().startswith("::ffff:") and "." in host else host


_PROC_NET_TCP: Final = ("/proc/self/net/tcp", "/proc/self/net/tcp6")

#: A connection's key: (local port, (peer host, peer port)).
ConnectionKey = tuple[int, tuple[str, int]]


def _hex_ip(text: str) -> str:
    """An address of ``/proc/net/tcp{,6}`` (32-bit words in host order, in hex) as text."""
    words = b"".join(struct.pack("=I", int(text[i : i + 8], 16)) for i in range(0, len(text), 8))
    family = socket.AF_INET if len(words) == 4 else socket.AF_INET6
    return _plain_ip(socket.inet_ntop(family, words))


def _inodes(wanted: set[ConnectionKey]) -> dict[int, ConnectionKey]:
    """Socket inode -> key, for the wanted connections found in ``/proc/self/net/tcp{,6}``."""
    ports = {(local, peer[1]) for local, peer in wanted}
    found: dict[int, ConnectionKey] = {}
    for path in _PROC_NET_TCP:
        try:
            with open(path, encoding="ascii") as table:
                lines = table.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            local, remote = fields[1].rpartition(":"), fields[2].rpartition(":")
            pair = (int(local[2], 16), int(remote[2], 16))
            if pair not in ports or fields[9] == "0":
                continue
            key = (pair[0], (_hex_ip(remote[0]), pair[1]))
            if key in wanted:
                found[int(fields[9])] = key
    return found


def connection_sockets(wanted: set[ConnectionKey]) -> dict[ConnectionKey, socket.socket]:
    """Dups of this process's TCP connections named by ``(local port, (peer host, peer
    port))``; a connection not found (closed, or an address rewritten by a proxy) is left
    out. The caller closes them; while one is open its connection stays open even if the
    server closes its own descriptor. One pass over ``/proc/self/net/tcp{,6}`` and one
    ``readlink`` per descriptor of the process, whatever the number wanted: for rare events,
    batched, off the event loop.
    """
    wanted = {(local, (_plain_ip(peer[0]), int(peer[1]))) for local, peer in wanted}
    inodes = _inodes(wanted)
    found: dict[ConnectionKey, socket.socket] = {}
    try:
        names = os.listdir(_FD_DIR) if inodes else []
    except OSError:
        names = []
    for name in names:
        try:
            link = os.readlink(f"{_FD_DIR}/{name}")
            inode = int(link[8:-1]) if link.startswith("socket:[") else 0
            key = inodes.get(inode)
            if key is None or key in found:
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue  # closed meanwhile, or not ours to read
        try:
            same = os.fstat(sock.fileno()).st_ino == inode  # (not a descriptor reused since)
        except OSError:
            same = False
        if same:
            found[key] = sock
        else:
            sock.close()
    return found


def connection_socket(peer: tuple[str, int], local_port: int) -> socket.socket | None:
    """One connection of :func:`connection_sockets`, or None."""
    key = (local_port, (_plain_ip(peer[0]), int(peer[1])))
    return connection_sockets({key}).get(key)


_TCP_INFO_UNACKED: Final = struct.Struct("=I")
_TCP_INFO_UNACKED_OFFSET: Final = 24
"""``tcpi_unacked`` in Linux's ``struct tcp_info`` (after 8 one-byte fields and 4 ``u32``)."""


def acknowledges_everything(sock: socket.socket) -> bool:
    """Whether the peer has acknowledged every byte sent on ``sock`` (``tcpi_unacked`` 0).

    True for a reader that is alive but reads nothing (its closed receive window holds the
    data back; its kernel answers the window probes); False while sent data waits for an
    acknowledgement (a peer gone, or bytes in flight). Raises ``OSError``.
    """
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    if len(info) < _TCP_INFO_UNACKED_OFFSET + 4:
        return False
    (unacked,) = _TCP_INFO_UNACKED.unpack_from(info, _TCP_INFO_UNACKED_OFFSET)
    return bool(unacked == 0)


class PeerTimeouts:
    """Set :func:`socket_options` once on this process's listening sockets (see the module).

    Args:
        user_timeout_s: U in seconds; None or 0 turns it off (``ensure`` does nothing).
    """

    def __init__(self, user_timeout_s: float | None) -> None:
        self.user_timeout_s = user_timeout_s or None
        self.done = self.user_timeout_s is None or not sys.platform.startswith("linux")
        self.listeners = 0
        self.connections = 0

    def ensure(self) -> None:
        """Configure the listeners and their accepted connections, the first time only.

        Cheap after the first call (one attribute test). Never raises: a socket that
        refuses an option is logged and skipped.
        """
        if self.done:
            return
        self.done = True
        assert self.user_timeout_s is not None
        found = list(tcp_sockets())
        try:
            ports = set()
            for item in found:
                if item.listening and self._configure(item):
                    self.listeners += 1
                    ports.add(item.local[1])
            for item in found:
                if not item.listening and item.local[1] in ports and self._configure(item):
                    self.connections += 1
        finally:
            for item in found:
                item.sock.close()
        logger.info(
            "peer_timeouts user_timeout_s=%g listeners=%d connections=%d",
            self.user_timeout_s,
            self.listeners,
            self.connections,
        )

    def _configure(self, item: _Found) -> bool:
        assert self.user_timeout_s is not None
        try:
            configure_socket(item.sock, self.user_timeout_s)
        except OSError as exc:
            logger.warning("peer_timeouts_failed fd=%d error=%s", item.fd, exc)
            return False
        return True
