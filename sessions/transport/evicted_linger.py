"""A frozen reader's connection, kept for the linger after its eviction (B21, issue 26).

The problem
    The kernel's ``TCP_USER_TIMEOUT`` (U, :mod:`sessions.transport.peer_timeout`) also
    ends a connection whose peer keeps its receive window closed for U: Linux counts the
    window probes a live but frozen reader answers as unacknowledged time. So a reader
    stopped for longer than U (32 s with the defaults) lost its last frames
    (``slow_client_warning``, ``client_evicted``) to a reset, whatever the pump's linger.

The rule
    When the bus has evicted a subscriber (``Subscription.on_evicted`` calls
    :meth:`EvictedLinger.evicted`), the stream's own connection is found by its peer
    address (:func:`~sessions.transport.peer_timeout.connection_sockets`, off the event
    loop, in batches: one scan at most every second, whatever the number of evictions)
    and, if its peer has acknowledged every byte sent (alive, window closed:
    :func:`~sessions.transport.peer_timeout.acknowledges_everything`), its
    ``TCP_USER_TIMEOUT`` is raised to ``QwenwebConfig.evicted_peer_timeout_s`` (U + W +
    linger + 2 s), longer than the pump's linger can last. A peer with bytes unacknowledged
    (gone) keeps U: vanished peers are still dropped within U. When the linger runs out
    (:meth:`EvictedLinger.expired`) an HTTP/1.x connection is reset at once
    (``connect(AF_UNSPEC)``: the kernel sends RST and drops the bytes it holds): granian
    does not close a connection whose bytes wait on a closed window when the application
    returns, it keeps writing until the kernel gives up (measured: still established with
    3.66 MB unsent after the stream ended). A stream that ends otherwise gets U back
    (:meth:`EvictedLinger.close`), since HTTP/1.1 may reuse the connection.

Limits
    Linux only (like U). Behind a proxy the scope's client address is not the socket's
    peer: nothing is found, nothing changes (the proxy's buffers face the server).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import socket
import struct
import sys
import threading
import time
from typing import Any, Final

from sessions.bus import Subscription
from sessions.conf import QwenwebConfig
from sessions.transport.peer_timeout import (
    ConnectionKey,
    acknowledges_everything,
    connection_sockets,
)

__all__ = ["EvictedLinger", "Linger"]

logger = logging.getLogger("qwenweb.stream")

_LOCK: Final = threading.Lock()  # the lingers' state, between the loop and the lookup thread
_SCAN_INTERVAL_S: Final = 1.0
_ACK_CHECKS: Final = 5
_ACK_CHECK_INTERVAL_S: Final = 0.2
# ``struct sockaddr`` with family AF_UNSPEC: connect(2) with it disconnects a TCP socket
# (tcp_disconnect: RST, queues dropped), whoever else holds a descriptor of it.
_UNSPEC_ADDRESS: Final = struct.pack("=H14x", socket.AF_UNSPEC)


def _reset(sock: socket.socket) -> None:
    """Abort ``sock``'s connection now (RST). Raises ``OSError``."""
    libc = ctypes.CDLL(None, use_errno=True)
    address = ctypes.create_string_buffer(_UNSPEC_ADDRESS, len(_UNSPEC_ADDRESS))
    if libc.connect(sock.fileno(), address, len(_UNSPEC_ADDRESS)) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


def _user_timeout_ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class Linger:
    """What a stream calls around its pump; this base does nothing (the kernel timeout is
    off, not Linux, or no client address): see :class:`EvictedLinger`."""

    __slots__ = ()

    @property
    def raised(self) -> bool:
        """Whether the connection's timeout was raised (for tests and the log)."""
        return False

    @staticmethod
    def attach(scope: Any, subscription: Subscription, config: QwenwebConfig) -> Linger:
        """The linger of the stream of ``scope``, told by ``subscription`` when the bus
        evicts it (``Subscription.on_evicted``); a :class:`Linger` that does nothing where it
        cannot apply."""
        user_timeout_s, evicted_timeout_s = config.peer_timeout_s, config.evicted_peer_timeout_s
        client, server = scope.get("client"), scope.get("server")
        if not (user_timeout_s and evicted_timeout_s and client and server):
            return _OFF
        if not sys.platform.startswith("linux"):
            return _OFF
        try:
            peer, local_port = (str(client[0]), int(client[1])), int(server[1])
        except (TypeError, ValueError, IndexError):
            return _OFF
        http1 = str(scope.get("http_version", "1.1")) in ("1", "1.0", "1.1")
        linger = EvictedLinger(peer, local_port, user_timeout_s, evicted_timeout_s, http1=http1)
        subscription.on_evicted = linger.evicted
        return linger

    def evicted(self) -> None:
        """The bus evicted the subscriber."""

    def expired(self) -> None:
        """The pump's linger ran out (a no-op unless :meth:`evicted` raised the timeout)."""

    def close(self) -> None:
        """The stream ends."""


_OFF: Final = Linger()


class EvictedLinger(Linger):
    """One stream's connection during the linger after its eviction (see the module).

    Args:
        peer: the client's ``(host, port)`` (the ASGI scope's ``client``).
        local_port: the port the connection was accepted on (the scope's ``server``).
        user_timeout_s: U, the connection's ``TCP_USER_TIMEOUT`` now (seconds).
        evicted_timeout_s: the value it gets while the evicted reader lingers (seconds).
        http1: whether the connection carries one stream (HTTP/1.x): only then is it reset
            when the linger runs out (an HTTP/2 connection carries the client's others).
    """

    # One per stream (idle streams' memory counts): slots, and one lock for all of them.
    __slots__ = (
        "_closed",
        "_evicted_timeout_s",
        "_http1",
        "_local_port",
        "_peer",
        "_reset",
        "_sock",
        "_user_timeout_s",
        "settled",
    )

    def __init__(
        self,
        peer: tuple[str, int],
        local_port: int,
        user_timeout_s: float,
        evicted_timeout_s: float,
        *,
        http1: bool,
    ) -> None:
        self._peer = peer
        self._local_port = local_port
        self._user_timeout_s = user_timeout_s
        self._evicted_timeout_s = evicted_timeout_s
        self._http1 = http1
        self._sock: socket.socket | None = None
        self.settled: asyncio.Future[None] | None = None
        """Done once the batch that looked for the connection has run (for tests)."""
        self._closed = False
        self._reset = False

    @property
    def raised(self) -> bool:
        """Whether the connection's timeout is raised now (for tests and the log)."""
        return self._sock is not None

    def evicted(self) -> None:
        """The bus evicted the subscriber while its ``send`` waits: raise the connection's
        timeout, off the event loop, in the next batch (once; later calls do nothing).
        Never raises."""
        if self.settled is None and not self._closed:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # evicted outside the event loop: nothing to do here
                return
            self.settled = loop.create_future()
            _FINDER.request(self)

    def _adopt(self, sock: socket.socket | None, acknowledged: bool) -> None:  # in a thread
        if sock is None:
            logger.info("evicted_linger connection_not_found peer=%s:%d", *self._peer)
            return
        if not acknowledged:
            logger.info("evicted_linger peer_unacknowledged peer=%s:%d", *self._peer)
            sock.close()
            return
        try:
            sock.setsockopt(
                socket.IPPROTO_TCP,
                socket.TCP_USER_TIMEOUT,
                _user_timeout_ms(self._evicted_timeout_s),
            )
        except OSError as exc:
            logger.info("evicted_linger failed peer=%s:%d error=%s", *self._peer, exc)
            sock.close()
            return
        with _LOCK:
            if not self._closed:
                self._sock = sock
                logger.info(
                    "evicted_linger peer=%s:%d user_timeout_s=%g",
                    *self._peer,
                    self._evicted_timeout_s,
                )
                return
        self._restore(sock)  # the stream ended meanwhile

    def expired(self) -> None:
        """The linger ran out: an HTTP/1.x connection is reset now (its buffered bytes are
        dropped at once; the server then finds it closed). Never raises."""
        with _LOCK:
            if self._sock is None or not self._http1:
                return
            try:
                _reset(self._sock)
                self._reset = True
                logger.info("evicted_linger_expired peer=%s:%d reset", *self._peer)
            except OSError as exc:
                logger.info("evicted_linger_expired peer=%s:%d error=%s", *self._peer, exc)

    def close(self) -> None:
        """The stream ends: give the connection U back (unless it is to be reset) and let
        go of it. Never raises."""
        with _LOCK:
            self._closed = True
            sock, self._sock = self._sock, None
        if sock is not None:
            if self._reset:
                sock.close()
            else:
                self._restore(sock)

    def _restore(self, sock: socket.socket) -> None:
        try:
            sock.setsockopt(
                socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, _user_timeout_ms(self._user_timeout_s)
            )
        except OSError:
            pass  # the connection is gone
        finally:
            sock.close()


class _Finder:
    """Looks connections up for every :class:`EvictedLinger` waiting, in batches: one pass
    over the process's descriptors per batch, at most one batch a second, whatever the
    number of evictions (a burst that evicts a thousand readers costs one scan)."""

    def __init__(self) -> None:
        self._pending: list[EvictedLinger] = []
        self._task: asyncio.Future[None] | None = None
        self._last = -_SCAN_INTERVAL_S

    def request(self, linger: EvictedLinger) -> None:
        task, loop = self._task, asyncio.get_running_loop()
        if task is not None and task.get_loop() is not loop:  # (a new loop: tests)
            self._pending, task = [], None
        self._pending.append(linger)
        if task is None or task.done():
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            await asyncio.sleep(max(0.0, self._last + _SCAN_INTERVAL_S - loop.time()))
            batch, self._pending = self._pending, []
            self._last = loop.time()
            try:
                await asyncio.to_thread(_look_up, batch)
            except Exception:  # never let one batch stop the next
                logger.exception("evicted_linger lookup failed")
            finally:
                for linger in batch:
                    if linger.settled is not None and not linger.settled.done():
                        linger.settled.set_result(None)


def _look_up(batch: list[EvictedLinger]) -> None:  # in a worker thread
    batch = [linger for linger in batch if not linger._closed]
    keys: dict[EvictedLinger, ConnectionKey] = {
        linger: (linger._local_port, linger._peer) for linger in batch
    }
    found = connection_sockets(set(keys.values())) if keys else {}
    # (one socket per connection: of several HTTP/2 streams evicted together, the first)
    socks = {linger: found.pop(key, None) for linger, key in keys.items()}
    # Bytes sent just before may still be in flight: a live peer acknowledges them within a
    # round trip, a vanished one never (a second at most, for the whole batch).
    waiting = {linger for linger, sock in socks.items() if sock is not None}
    for attempt in range(_ACK_CHECKS):
        for linger in list(waiting):
            sock = socks[linger]
            assert sock is not None
            try:
                acknowledged = acknowledges_everything(sock)
            except OSError:
                acknowledged = False
            if acknowledged:
                waiting.discard(linger)
                linger._adopt(sock, True)
        if not waiting or attempt == _ACK_CHECKS - 1:
            break
        time.sleep(_ACK_CHECK_INTERVAL_S)
    for linger, sock in socks.items():
        if sock is None or linger in waiting:
            linger._adopt(sock, False)


_FINDER: Final = _Finder()
