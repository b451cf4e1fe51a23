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
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

__all__ = [
    "GRANIAN_HTTP2_KEEPALIVE_OPTIONS",
    "PeerTimeouts",
    "configure_socket",
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
