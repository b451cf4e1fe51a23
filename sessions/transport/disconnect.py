"""Noticing that the client of a stream went away (EB-20), without a task of its own.

A stream's response body never reads the request again, so the only way to learn that
its client left before the next write fails is to keep one ``receive()`` pending until
it answers ``http.disconnect``. A task per stream for that costs memory per idle stream
(a task, its coroutine frames and its entry in asyncio's task registry; issue 23).
:class:`DisconnectWatch` chains ``receive()`` awaitables by callback instead: granian's
``receive()`` returns a future, which takes the callback directly; a server whose
``receive`` is a coroutine function (uvicorn, daphne) gets one task per pending call, as
before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["DisconnectWatch"]


class DisconnectWatch:
    """Call ``on_disconnect()`` once, on the loop, when ``receive()`` answers
    ``http.disconnect``; other messages are read and dropped.

    Args:
        receive: the ASGI ``receive`` callable of the request.
        on_disconnect: what to do then (no argument; must not raise).

    ``disconnected`` says whether it happened. :meth:`close` stops watching (the pending
    ``receive()`` is cancelled). A ``receive()`` that raises ends the watch quietly: the
    stream then learns of the client's departure from its next write.
    """

    __slots__ = ("_on_disconnect", "_pending", "_receive", "disconnected")

    def __init__(
        self, receive: Callable[[], Awaitable[Any]], on_disconnect: Callable[[], None]
    ) -> None:
        self._receive = receive
        self._on_disconnect = on_disconnect
        self._pending: asyncio.Future[Any] | None = None
        self.disconnected = False
        self._next()

    def _next(self) -> None:
        try:
            awaitable = self._receive()
        except Exception:  # (raised before it awaited: the watch ends, as documented)
            return
        pending = awaitable if asyncio.isfuture(awaitable) else asyncio.ensure_future(awaitable)
        self._pending = pending
        pending.add_done_callback(self._received)

    def _received(self, pending: asyncio.Future[Any]) -> None:
        if pending is not self._pending or pending.cancelled():
            return
        self._pending = None
        if pending.exception() is not None:
            return
        message = pending.result()
        if message.get("type") == "http.disconnect":
            self.disconnected = True
            self._on_disconnect()
        else:
            self._next()

    def close(self) -> None:
        """Stop watching; ``on_disconnect`` is not called after this. Idempotent."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.remove_done_callback(self._received)
            pending.add_done_callback(_retrieved)
            pending.cancel()


def _retrieved(pending: asyncio.Future[Any]) -> None:
    # (a receive() that failed after close: its exception is nobody's to log)
    if not pending.cancelled():
        pending.exception()
