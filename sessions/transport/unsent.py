"""The bytes a connection's kernel socket holds unacknowledged: a bound any server obeys.

Why: a server whose ASGI ``send`` returns before the socket took the bytes (measured for
WebSockets: uvicorn's ``websockets-sansio`` and legacy ``websockets`` implementations, and
daphne, buffer every message in memory; granian's ``send`` waits) hides a client that
stopped reading from the application, and its memory grows without bound. What the
application can still see is the kernel: once the peer's receive window is closed, the
connection's send queue (``SIOCOUTQ``: bytes not yet acknowledged) only grows. While it
holds more than ``max_unsent_bytes``, :meth:`UnsentGate.wait` does not return, so the
transport's writer waits as it would under a server whose ``send`` waits; the server's
own buffer holds at most what was written before the bound was passed.

How the connection is found: once per socket, among this process's TCP sockets
(``/proc/self/fd``, as :mod:`sessions.transport.peer_timeout` does), the one whose
local port is the scope's ``server`` port and whose peer is the scope's ``client``. A dup
of it is kept for the ioctl and closed by :meth:`UnsentGate.close`. Linux only; elsewhere,
or behind a proxy that rewrote the client address, there is no gate (None).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import socket
import struct
import sys
import termios
from typing import Any, Final

from sessions.transport.peer_timeout import tcp_sockets

__all__ = ["UnsentGate"]

logger = logging.getLogger("qwenweb.stream")

_POLL_S: Final = (0.005, 0.1)
"""First and longest wait between two looks at a full send queue (doubling)."""


class UnsentGate:
    """Wait while one connection's kernel send queue holds more than ``max_unsent_bytes``."""

    __slots__ = ("_sock", "max_unsent_bytes", "waits")

    def __init__(self, sock: socket.socket, max_unsent_bytes: int) -> None:
        self._sock: socket.socket | None = sock
        self.max_unsent_bytes = max_unsent_bytes
        self.waits = 0

    @classmethod
    def find(cls, client: Any, server: Any, max_unsent_bytes: int) -> UnsentGate | None:
        """The gate of the connection from ``client`` to ``server`` (ASGI scope pairs), or
        None when it cannot be found (not Linux, a proxy's address). Never raises."""
        if not sys.platform.startswith("linux") or not client or not server:
            return None
        peer = (str(client[0]), int(client[1]))
        port = int(server[1])
        found = None
        for item in tcp_sockets():
            if found is None and not item.listening and item.local[1] == port:
                try:
                    address = item.sock.getpeername()
                except OSError:
                    address = None
                if address is not None and (str(address[0]), int(address[1])) == peer:
                    found = item.sock
                    continue
            item.sock.close()
        if found is None:
            logger.info("unsent_gate_missing client=%s:%d", peer[0], peer[1])
            return None
        return cls(found, max_unsent_bytes)

    def unsent_bytes(self) -> int:
        """Bytes of the connection not yet acknowledged by the peer (0 once closed)."""
        sock = self._sock
        if sock is None:
            return 0
        try:
            raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, struct.pack("i", 0))
        except OSError:
            return 0
        return int(struct.unpack("i", raw)[0])

    async def wait(self) -> None:
        """Return once the send queue is at or below the bound (at once if it is now)."""
        delay = _POLL_S[0]
        while self.unsent_bytes() > self.max_unsent_bytes:
            self.waits += 1
            await asyncio.sleep(delay)
            delay = min(_POLL_S[1], delay * 2)

    def close(self) -> None:
        """Close the dup (the server's own descriptor is untouched). Idempotent."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
