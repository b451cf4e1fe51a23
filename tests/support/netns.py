"""Private network namespaces for fault tests: a server, a router and a client, joined by veth.

::

    server ns  10.R.1.1 ── veth ── 10.R.1.2  router ns  10.R.2.1 ── veth ── 10.R.2.x  client ns

The server process runs in the server namespace (:meth:`Network.server_argv` wraps its
command line in ``ip netns exec``); the test's own sockets and HTTP requests are made in
the client namespace from threads that joined it (:meth:`Network.client_call`,
:meth:`Network.client_socket`: a socket belongs to the namespace it was created in, so it
can be used from any thread afterwards). The client namespace has several addresses, so
one reader can be cut off while the publisher and the test's polling keep working.

:meth:`Network.blackhole` adds ``ip rule … blackhole`` rules in the *router* for one client
address, both directions: its packets leave the sender's host and are dropped on the way,
silently (no ICMP, no RST, no error on either end) — a peer that vanished without FIN, as
when a laptop lid closes or a NAT entry expires. Nothing is added to the host's own
namespace; :meth:`Network.close` deletes all three namespaces (and with them the veths).

Needs root (CAP_NET_ADMIN and ``/run/netns``); :func:`unavailable_reason` says why not.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import os
import secrets
import socket
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
IP = "/usr/sbin/ip"
CLIENT_ADDRESSES = 6
"""Addresses in the client namespace: ``.2`` for the test's requests, the rest for readers."""


def _ip(*args: str) -> None:
    result = subprocess.run([IP, *args], capture_output=True, text=True, timeout=10)
    if result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not os.path.exists(IP):
        return f"{IP} (iproute2) is not installed"
    name = f"qwprobe-{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", name)
    except (RuntimeError, OSError) as exc:
        return f"cannot create a network namespace: {exc}"
    _ip("netns", "del", name)
    return None


def _enter(name: str) -> None:
    """Move the calling thread into network namespace ``name`` (setns(2), this thread only)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({name}): {os.strerror(errno)}")
    finally:
        os.close(fd)


@dataclass
class Network:
    """Three namespaces (server, router, client) with addresses and routes; see the module."""

    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    subnet: int = field(default_factory=lambda: 100 + secrets.randbelow(150))
    _pool: concurrent.futures.ThreadPoolExecutor | None = None
    _blackholed: list[str] = field(default_factory=list)

    @property
    def server_ns(self) -> str:
        return f"qw{self.tag}-srv"

    @property
    def router_ns(self) -> str:
        return f"qw{self.tag}-rtr"

    @property
    def client_ns(self) -> str:
        return f"qw{self.tag}-cli"

    @property
    def server_ip(self) -> str:
        return f"10.{self.subnet}.1.1"

    def client_ip(self, n: int) -> str:
        """Client address ``n`` (0: the test's requests; 1 … 4: readers)."""
        if not 0 <= n < CLIENT_ADDRESSES - 1:
            raise ValueError(f"client address {n} out of range")
        return f"10.{self.subnet}.2.{n + 2}"

    def create(self) -> Network:
        s, r, c, net = self.server_ns, self.router_ns, self.client_ns, f"10.{self.subnet}"
        try:
            for ns in (s, r, c):
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", s, "link", "add", "eth0", "type", "veth", "peer", "name", "up0", "netns", r)
            _ip("-n", c, "link", "add", "eth0", "type", "veth", "peer", "name", "down0", "netns", r)
            _ip("-n", s, "addr", "add", f"{net}.1.1/24", "dev", "eth0")
            _ip("-n", r, "addr", "add", f"{net}.1.2/24", "dev", "up0")
            _ip("-n", r, "addr", "add", f"{net}.2.1/24", "dev", "down0")
            for n in range(CLIENT_ADDRESSES - 1):
                _ip("-n", c, "addr", "add", f"{self.client_ip(n)}/24", "dev", "eth0")
            for ns, dev in ((s, "eth0"), (r, "up0"), (r, "down0"), (c, "eth0")):
                _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", s, "route", "add", "default", "via", f"{net}.1.2")
            _ip("-n", c, "route", "add", "default", "via", f"{net}.2.1")
            subprocess.run(
                [IP, "netns", "exec", r, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
                check=True,
                timeout=10,
            )
        except BaseException:
            self.close()
            raise
        self._pool = concurrent.futures.ThreadPoolExecutor(
            4, thread_name_prefix=f"netns-{c}", initializer=_enter, initargs=(c,)
        )
        return self

    def close(self) -> None:
        """Delete the namespaces (idempotent; never raises for one already gone)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        for ns in (self.client_ns, self.router_ns, self.server_ns):
            subprocess.run([IP, "netns", "del", ns], capture_output=True, timeout=10)

    def server_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in the server namespace (``ip netns exec`` execs it: same pid)."""
        return [IP, "netns", "exec", self.server_ns, *argv]

    def client_call(self, fn: Callable[..., T], *args: Any, timeout_s: float = 30.0) -> T:
        """Run ``fn(*args)`` on a thread inside the client namespace; bounded wait."""
        return self.client_submit(fn, *args).result(timeout_s)

    def client_submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        """Start ``fn(*args)`` on one of the client namespace's 4 threads."""
        assert self._pool is not None, "create() first"
        return self._pool.submit(fn, *args)

    def client_socket(self, n: int) -> socket.socket:
        """A TCP socket of the client namespace bound to client address ``n`` (not connected)."""

        def make() -> socket.socket:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((self.client_ip(n), 0))
            return sock

        return self.client_call(make)

    def blackhole(self, n: int) -> None:
        """Silently drop every packet from and to client address ``n``, in the router."""
        address = self.client_ip(n)
        _ip("-n", self.router_ns, "rule", "add", "pref", "100", "from", address, "blackhole")
        _ip("-n", self.router_ns, "rule", "add", "pref", "101", "to", address, "blackhole")
        self._blackholed.append(address)

    def server_sockets(self, port: int) -> str:
        """``ss -tino`` of the server namespace for connections on ``port`` (diagnostics)."""
        return subprocess.run(
            [IP, "netns", "exec", self.server_ns, "ss", "-tino", "state", "established",
             f"( sport = :{port} )"],
            capture_output=True, text=True, timeout=10,
        ).stdout  # fmt: skip


@contextlib.contextmanager
def network() -> Iterator[Network]:
    """A :class:`Network` for the ``with`` block; its namespaces are deleted afterwards."""
    net = Network().create()
    try:
        yield net
    finally:
        net.close()
