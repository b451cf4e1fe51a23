"""What the bus, the transport and the backends announce, and who listens.

The inner layers (backends, runtime, transport) never import the operator side (records,
dashboard feed, lifecycle, metrics): they announce what happens to a :class:`Hooks`
object, and the operator side connects :class:`Listener` objects to it in
``AppConfig.ready`` (``sessions.apps``), the way Django's own apps wire their signals.

Two kinds of announcement
    *Per connection* (the hot path): :meth:`Hooks.connection_opened` asks every listener
    for a :class:`ConnectionObserver` and returns one object that the stream then calls
    directly once per ``send`` that wrote frames (``frames_written``, with the frames,
    their bytes and the exact JSON of their ``data:`` lines, so nobody re-parses what was
    written), for bytes that are not frames (``bytes_written``) and once at the end
    (``closed``). With one listener that observer is the listener's own; with several, a
    thin fan-out. No Django signal runs per frame, and no observer call either: in the
    64-subscriber fan-out a call per frame and observer was a third of the pump's time
    (docs/benchmarks.md, "Fan-out: the per-delivery path", issue 23).

    *Per publish*: :meth:`Hooks.event_published`, once per event a backend accepted in
    this process (not per subscriber, not per mirror that ingests it), called only on the
    listeners that override it.

    *Lifecycle* (rare): a session closed, the server's event loop attached, activity
    relayed from another process, a request refused with a JSON error. Listeners that do
    not care inherit the no-op methods.

Concurrency: every method is called on the server's event loop (EB-11), never awaits
and must never raise: a failing listener is logged and the others still run. This module
imports nothing from Django.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sessions.bus import Frame

__all__ = ["ConnectionInfo", "ConnectionObserver", "Hooks", "Listener", "hooks"]

logger = logging.getLogger("qwenweb.hooks")


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """One attached subscriber connection: who, from where, with which options.

    ``auth`` is ``"token"`` or ``"login"``; ``user_id`` is None for a token;
    ``subject`` is the token's subject or the user name; ``resumed_from`` the
    ``Last-Event-ID`` cursor (None without one); ``transport`` ``"sse"`` or ``"ws"``;
    strings are already sanitized for logs.
    """

    id: uuid.UUID
    session_id: str
    auth: str
    user_id: int | None
    subject: str
    client_addr: str
    user_agent: str
    client_id: str
    max_queued: int
    resumed_from: int | None
    transport: str = "sse"

    @property
    def label(self) -> str:
        """What log lines and the bus call this subscriber (``subscriber=<label>``)."""
        return str(self.id)


class ConnectionObserver:
    """Told what one stream wrote; the base class ignores everything.

    ``frames_written(frames, wires, payloads, nbytes)``: one ``send`` accepted these
    frames, in order; ``wires[i]`` is ``frames[i]``'s bytes as written (SSE block or
    WebSocket text), ``payloads[i]`` the JSON text of its ``data:`` line exactly as
    written, ``nbytes`` the sum of ``len(wire)`` (the three sequences have one entry per
    frame, at least one).
    ``bytes_written(nbytes)``: body bytes that are not frames (``retry:``, heartbeats).
    ``closed(reason, detail)``: once, with one of ``SubscriberConnection.EndReason``.
    Implementations never await and never raise.
    """

    __slots__ = ()

    def frames_written(
        self,
        frames: Sequence[Frame],
        wires: Sequence[bytes],
        payloads: Sequence[bytes],
        nbytes: int,
    ) -> None:
        """Count the frames one ``send`` accepted."""

    def bytes_written(self, nbytes: int) -> None:
        """Count body bytes that are not frames."""

    def closed(self, reason: str, detail: str = "") -> None:
        """Note how the connection ended (the first call wins)."""


class _Fanout(ConnectionObserver):
    __slots__ = ("_observers",)

    def __init__(self, observers: Sequence[ConnectionObserver]) -> None:
        self._observers = tuple(observers)

    def frames_written(
        self,
        frames: Sequence[Frame],
        wires: Sequence[bytes],
        payloads: Sequence[bytes],
        nbytes: int,
    ) -> None:
        for observer in self._observers:
            observer.frames_written(frames, wires, payloads, nbytes)

    def bytes_written(self, nbytes: int) -> None:
        for observer in self._observers:
            observer.bytes_written(nbytes)

    def closed(self, reason: str, detail: str = "") -> None:
        for observer in self._observers:
            observer.closed(reason, detail)


_NOBODY = ConnectionObserver()


class Listener:
    """Something on the operator side that wants to know; override what you need."""

    def connection_opened(self, info: ConnectionInfo) -> ConnectionObserver | None:
        """A subscriber was attached and its stream is about to start (None: not interested)."""
        return None

    def session_closed(self, session_id: str, last_event_id: int) -> None:
        """The session was closed (``session_closed`` published, the bus closed)."""

    def loop_attached(self, loop: asyncio.AbstractEventLoop) -> None:
        """``loop`` became the server's event loop in this process (first bus or feed)."""

    def activity_received(self, items: Sequence[Mapping[str, Any]]) -> None:
        """Operator activity items relayed from another process (multi-process backends)."""

    def event_published(self, session_id: str) -> None:
        """A backend of this process accepted one event of ``session_id`` (not a replay)."""

    def request_rejected(self, status: int, code: str) -> None:
        """A request was answered with the JSON error envelope (``status``, ``code``)."""

    def backend_link(self, event: str) -> None:
        """This process's link to a shared store changed: ``lost`` (its reader lost it),
        ``reattached`` (the reader is back), ``failover`` (back, on another primary)."""


class Hooks:
    """The announcement point: listeners connect, inner layers announce (module docstring).

    The process's lifecycle flags (draining, shutting down) are not announcements: they
    live in :mod:`sessions.process_state`.
    """

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        self._publish_listeners: tuple[Listener, ...] = ()

    def connect(self, listener: Listener) -> None:
        """Add ``listener`` (once; connecting it again does nothing)."""
        if listener not in self._listeners:
            self._listeners.append(listener)
            self._note_publish_listeners()

    def disconnect(self, listener: Listener) -> None:
        """Remove ``listener`` if connected. Never raises."""
        if listener in self._listeners:
            self._listeners.remove(listener)
            self._note_publish_listeners()

    def _note_publish_listeners(self) -> None:
        # The publish path calls only the listeners that want to know.
        self._publish_listeners = tuple(
            listener
            for listener in self._listeners
            if type(listener).event_published is not Listener.event_published
        )

    @property
    def listeners(self) -> tuple[Listener, ...]:
        """The connected listeners, in connection order."""
        return tuple(self._listeners)

    def connection_opened(self, info: ConnectionInfo) -> ConnectionObserver:
        """Return the observer of one new connection (a no-op one when nobody listens)."""
        observers = []
        for listener in self._listeners:
            try:
                observer = listener.connection_opened(info)
            except Exception:
                logger.exception("listener_failed hook=connection_opened listener=%r", listener)
                continue
            if observer is not None:
                observers.append(observer)
        if not observers:
            return _NOBODY
        return observers[0] if len(observers) == 1 else _Fanout(observers)

    def session_closed(self, session_id: str, last_event_id: int) -> None:
        """Announce that ``session_id`` was closed at ``last_event_id``."""
        _announce(self._listeners, "session_closed", session_id, last_event_id)

    def loop_attached(self, loop: asyncio.AbstractEventLoop) -> None:
        """Announce the server's event loop."""
        _announce(self._listeners, "loop_attached", loop)

    def activity_received(self, items: Sequence[Mapping[str, Any]]) -> None:
        """Hand activity relayed from another process to the listeners."""
        _announce(self._listeners, "activity_received", items)

    def event_published(self, session_id: str) -> None:
        """Announce one event accepted by this process's backend (never raises)."""
        _announce(self._publish_listeners, "event_published", session_id)

    def request_rejected(self, status: int, code: str) -> None:
        """Announce a request answered with the JSON error envelope (never raises)."""
        _announce(self._listeners, "request_rejected", status, code)

    def backend_link(self, event: str) -> None:
        """Announce a change of the link to the shared store (:meth:`Listener.backend_link`;
        never raises)."""
        _announce(self._listeners, "backend_link", event)


def _announce(listeners: Sequence[Listener], hook: str, *args: Any) -> None:
    """Call ``listener.<hook>(*args)`` on each of ``listeners``; a failing one is logged and
    the others still run. Never raises."""
    for listener in listeners:
        try:
            getattr(listener, hook)(*args)
        except Exception:
            logger.exception("listener_failed hook=%s listener=%r", hook, listener)


hooks = Hooks()
"""The process's announcement point; ``sessions.apps`` connects the operator side."""
