"""The one writer of a WebSocket: every message of a socket goes out through it, in order.

Overflow policy (EB-21 for a socket)
    Each subscription's pump and the command loop write through :class:`SocketWriter`,
    one message at a time (a FIFO lock). Every supported server's ``websocket.send``
    waits for the socket: granian's ``send`` itself, any other server's (uvicorn's and
    daphne's ``send`` return at once, measured) through
    :class:`~sessions.transport.unsent.UnsentGate`, so a client that stops reading holds the
    writer, every pump of the socket waits behind it, and each subscription's bounded
    queue fills until the bus warns and evicts it (EB-3 … EB-5), exactly as an SSE
    stream. A message pending for ``idle_s`` without the socket taking it calls
    ``on_idle`` once (the socket is then closed: ``writer_idle_timeout``). One timer per
    socket, never an ``asyncio.timeout`` per message.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import cast

from asgiref.typing import ASGISendCallable as Send
from asgiref.typing import ASGISendEvent as Message

from sessions.transport.unsent import UnsentGate

__all__ = ["SocketClosedError", "SocketWriter"]


class SocketClosedError(Exception):
    """Raised by :class:`SocketWriter` once the socket is closed: nothing more is written."""


class SocketWriter:
    """Serialize ``send`` for one socket and watch it for a writer that takes nothing.

    Args:
        send: the ASGI ``send`` of the socket.
        idle_s: how long one message may wait on the socket before ``on_idle`` is called
            (``WRITER_IDLE_TIMEOUT_S``).
        on_idle: called once, on the event loop, never awaited.
        gate: the connection's :class:`~sessions.transport.unsent.UnsentGate`, waited on
            before each message (None: rely on ``send``).

    Attributes:
        last_write: loop time of the last message the socket took (or of creation).
        idle_fired: whether ``on_idle`` was called.
    """

    __slots__ = (
        "_gate",
        "_handle",
        "_lock",
        "_loop",
        "_on_idle",
        "_send",
        "closed",
        "idle_fired",
        "idle_s",
        "last_write",
        "pending_since",
    )

    def __init__(
        self,
        send: Send,
        idle_s: float,
        on_idle: Callable[[], None],
        gate: UnsentGate | None = None,
    ) -> None:
        self._send = send
        self._gate = gate
        self._lock = asyncio.Lock()
        self._loop = asyncio.get_running_loop()
        self._on_idle = on_idle
        self.idle_s = idle_s
        self.closed = False
        self.idle_fired = False
        self.pending_since: float | None = None
        self.last_write = self._loop.time()
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(idle_s, self._check)

    async def __call__(self, message: Message) -> None:
        """Write one ASGI message after those before it (an ASGI ``send``).

        Raises :class:`SocketClosedError` once the socket is closed, and whatever the
        server's ``send`` raises.
        """
        async with self._lock:
            if self.closed:
                raise SocketClosedError("the socket is closed")
            self.pending_since = self._loop.time()
            try:
                if self._gate is not None:  # the server's send may not wait: the kernel's bound
                    await self._gate.wait()
                await self._send(message)
            finally:
                self.pending_since = None
                self.last_write = self._loop.time()

    async def text(self, text: str) -> None:
        """Write one text message (``websocket.send``)."""
        await self(cast("Message", {"type": "websocket.send", "text": text}))

    async def close(self, code: int, reason: str = "") -> None:
        """Write the close message and refuse every later one. Idempotent; never raises
        for a socket already gone."""
        if self.closed:
            return
        # The peer may be gone already: then there is nobody to tell.
        with contextlib.suppress(Exception):
            await self(cast("Message", {"type": "websocket.close", "code": code, "reason": reason}))
        self.closed = True

    @property
    def busy(self) -> bool:
        """Whether a message is being written or waits to be."""
        return self._lock.locked()

    def stop(self) -> None:
        """Refuse every later message and stop the idle timer. Idempotent, never raises."""
        self.closed = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _check(self) -> None:
        if self.closed:
            return
        started, now = self.pending_since, self._loop.time()
        if started is not None and now - started >= self.idle_s:
            self.idle_fired = True
            self._handle = None
            self._on_idle()
            return
        due = (started if started is not None else now) + self.idle_s
        self._handle = self._loop.call_at(due, self._check)
