"""Where a server may listen: the one rule for ``python -m qwenweb.serve`` and ``manage.py demo``.

- :func:`check_port`: a port is 1 … 65535. 0 ("any free port") is refused: granian binds
  one socket per worker, so each would get a port of its own, and it reports none of
  them (it logs ``:0``); a server nobody can find is no use.
- :func:`check_address`: an IPv4 or IPv6 address (``127.0.0.1``, ``::1``, ``0.0.0.0``,
  ``::``), no host name: granian parses the address itself and takes no name, not even
  ``localhost``, nor an IPv6 zone (``fe80::1%eth0``).
- :func:`check_can_listen`: bind the address and port as the servers do, then close the
  socket at once, so that a port in use is one line instead of the server's traceback.

Each raises :class:`CannotListen`, whose text is one line without the option or value
(:func:`check_port`, :func:`check_address`) or naming ``address:port``
(:func:`check_can_listen`); the caller adds its option's name and, for a port in use,
how to choose another (:meth:`CannotListen.in_use_message`).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from typing import Final

__all__ = [
    "CannotListen",
    "another_port",
    "check_address",
    "check_can_listen",
    "check_port",
    "host_port",
]

MAX_PORT: Final = 65535


class CannotListen(ValueError):
    """A server cannot listen there; ``str()`` says why in one line.

    ``in_use``: the address and port are taken (another server listens there).
    """

    def __init__(self, message: str, *, in_use: bool = False) -> None:
        super().__init__(message)
        self.in_use = in_use

    def in_use_message(self, *, other: str, retry: str) -> str:
        """The message with what may hold the port (``other``, e.g. "another demo") and
        how to run on another one (``retry``, e.g. ``-p 8001``); other problems as they
        are."""
        if not self.in_use:
            return str(self)
        return f"{self} ({other}?): choose another port, e.g. {retry}"


def host_port(address: str, port: int) -> str:
    """``127.0.0.1:8000``, ``[::1]:8000``."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def another_port(port: int) -> int:
    """A port to suggest instead of ``port`` (the next one; the one before at the top)."""
    return port + 1 if port < MAX_PORT else port - 1


def check_port(port: int) -> None:
    """Raise :class:`CannotListen` unless ``port`` is 1 … 65535 (module docstring)."""
    if port == 0:
        raise CannotListen(f"must be 1 to {MAX_PORT} (0, any free port, is not supported)")
    if not 0 < port <= MAX_PORT:
        raise CannotListen(f"must be 1 to {MAX_PORT}")


def check_address(address: str) -> None:
    """Raise :class:`CannotListen` unless ``address`` is an IPv4 or IPv6 address."""
    try:
        ipaddress.ip_address(address)
    except ValueError:
        valid = False
    else:
        valid = "%" not in address  # Python takes a zone (fe80::1%eth0); granian does not
    if not valid:
        raise CannotListen(
            "not an IP address (e.g. 127.0.0.1, ::1, 0.0.0.0 or ::; "
            "a host name, even localhost, is not taken)"
        )


def check_can_listen(address: str, port: int) -> None:
    """Raise :class:`CannotListen` when ``address:port`` cannot be bound now.

    The socket is closed at once: another process may still take the port before the
    server binds it (a race this cannot close; the server then fails as before). As the
    servers do (granian and Twisted both), with ``SO_REUSEADDR``: an earlier run's
    connections in TIME_WAIT do not count as taken. Without ``SO_REUSEPORT``, which
    granian sets: a second granian would otherwise share the port with a running one,
    same user, and get half of its connections; here it counts as in use.
    """
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    where = host_port(address, port)
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((address, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CannotListen(f"{where} is already in use", in_use=True) from None
        raise CannotListen(f"cannot listen on {where}: {exc.strerror or exc}") from None
    except OverflowError:  # a port out of range, not checked by check_port first
        raise CannotListen(f"cannot listen on {where}: the port must be 1 to {MAX_PORT}") from None
