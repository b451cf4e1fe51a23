"""Daphne with flow control: the ASGI ``send`` of a streaming response waits for the socket.

Daphne's ``send`` hands every body chunk to Twisted, which buffers it in memory without
limit, so a client that stops reading is invisible to the application and the server's
memory grows until it falls over. :class:`FlowControlServer` registers a streaming
producer (Twisted's ``IPushProducer``) on each response that has more body to come; Twisted
calls ``pauseProducing`` when the transport's write buffer passes its high-water mark and
``resumeProducing`` when it drains. While paused, ``send`` of a ``more_body`` chunk does not
return, so the stream's pump stops draining its subscriber queue and the event bus warns
and then evicts the slow subscriber with bounded memory (EB-21, EB-4, EB-5).

Used by ``python manage.py runserver`` (``sessions/management/commands/runserver.py``) and
by the production entry point ``python -m qwenweb.serve`` (daphne's command line with this
server class).
"""

from __future__ import annotations

import asyncio
from typing import Any

from daphne.server import Server
from twisted.internet.interfaces import IPushProducer
from zope.interface import implementer

__all__ = ["FlowControlServer", "WriteGate"]


@implementer(IPushProducer)
class WriteGate:
    """A push producer for one response: open while Twisted may write, shut while paused.

    Twisted calls :meth:`pauseProducing` / :meth:`resumeProducing` from the reactor thread,
    which under daphne's asyncio reactor is the event loop's thread, so an
    ``asyncio.Event`` is safe here. :meth:`stopProducing` (connection lost) and
    :meth:`release` open it for good so no ``send`` waits on a dead connection.
    """

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._released = False
        self.pauses = 0

    @property
    def paused(self) -> bool:
        """Whether Twisted has asked us to stop writing."""
        return not self._open.is_set()

    def pauseProducing(self) -> None:
        if not self._released:
            self.pauses += 1
            self._open.clear()

    def resumeProducing(self) -> None:
        self._open.set()

    def stopProducing(self) -> None:
        self.release()

    def release(self) -> None:
        """Open the gate for good (response finished or connection lost). Idempotent."""
        self._released = True
        self._open.set()

    async def wait_writable(self) -> None:
        """Return once the transport accepts writes again (at once if it does now)."""
        await self._open.wait()


class FlowControlServer(Server):  # type: ignore[misc]  # daphne ships no type hints
    """Daphne's ``Server`` whose ``send`` waits while the socket's buffers are full (EB-21)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._gates: dict[Any, WriteGate] = {}

    async def handle_reply(self, protocol: Any, message: dict[str, Any]) -> None:
        """Write ``message`` like daphne does, then wait while Twisted has paused us."""
        kind = message.get("type")
        if kind == "http.response.body" and not message.get("more_body", False):
            self._drop_gate(protocol)  # the last chunk: Twisted owns the rest
            await super().handle_reply(protocol, message)
            return
        await super().handle_reply(protocol, message)
        if kind == "http.response.start":
            self._add_gate(protocol)
        elif kind == "http.response.body":
            gate = self._gates.get(protocol)
            if gate is not None and gate.paused:
                try:
                    await gate.wait_writable()
                except asyncio.CancelledError:
                    # The application gave up on this socket (writer idle timeout): it
                    # takes nothing, so a graceful close would wait for ever. Abort it.
                    self._abort(protocol)
                    raise

    def _add_gate(self, protocol: Any) -> None:
        if protocol in self._gates or getattr(protocol, "channel", None) is None:
            return
        gate = WriteGate()
        try:
            protocol.registerProducer(gate, True)
        except (RuntimeError, ValueError):
            return  # another producer owns this response; fall back to daphne's behaviour
        self._gates[protocol] = gate
        if getattr(protocol.channel, "_waitingForTransport", False):
            gate.pauseProducing()  # the transport was already full before we registered
        protocol.notifyFinish().addBoth(lambda _: self._drop_gate(protocol))

    def _abort(self, protocol: Any) -> None:
        self._drop_gate(protocol)
        channel = getattr(protocol, "channel", None)
        transport = getattr(channel, "transport", None)
        if transport is not None:
            transport.abortConnection()

    def _drop_gate(self, protocol: Any) -> None:
        gate = self._gates.pop(protocol, None)
        if gate is None:
            return
        gate.release()
        if getattr(protocol, "channel", None) is not None and protocol.producer is gate:
            protocol.unregisterProducer()
