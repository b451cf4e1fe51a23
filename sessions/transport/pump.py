"""The pump: a subscription's frames to ASGI ``send``, with heartbeats (EB-18, EB-21).

Every transport runs this pump; what differs is the :class:`Framer`, which turns frames
into ASGI messages (SSE: body chunks of ``text/event-stream``; WebSocket: one text
message per frame) and says what a heartbeat is. How a connection ends stays the
transport's.

Overflow policy
    The pump drains the subscriber queue only as fast as ``send`` returns, so a server
    whose ``send`` waits on the socket turns a client that stops reading into a full
    queue, then ``slow_client_warning`` and ``client_evicted`` (EB-4, EB-5, EB-21). The
    frames already queued are written in one ``send`` of at most ``MAX_BATCH_BYTES``. A
    ``send`` that takes no byte for the writer idle timeout raises
    :class:`WriterIdleTimeoutError` (the socket's buffers are full and the client takes
    nothing, or the peer vanished), unless the bus has evicted the subscriber: then the
    frames still queued, ending with ``client_evicted``, get a bounded linger, so a
    frozen reader that wakes up reads them and a clean end (B21).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Final, Protocol

from asgiref.typing import ASGISendCallable as Send
from asgiref.typing import ASGISendEvent as Message

from sessions.bus import Frame, Subscription
from sessions.bus.sweep import sweeper
from sessions.hooks import ConnectionObserver
from sessions.wire import HEARTBEAT, FrameEncoder

__all__ = ["MAX_BATCH_BYTES", "Framer", "SseFramer", "WriterIdleTimeoutError", "pump_frames"]


MAX_BATCH_BYTES: Final = 256 * 1024
"""Queued frames written together in one ``send``, at most this many bytes (one frame
may be larger)."""

_NOBODY = ConnectionObserver()


class Framer(Protocol):
    """How one transport writes frames: the only part of the pump that differs.

    ``encode(frame)`` returns ``(wire, payload)``: the frame's bytes as this transport
    writes them, and the compact JSON of its envelope exactly as SSE's ``data:`` line
    carries it (what the operator side records). ``messages(wires)`` returns the ASGI
    messages that write those frames in order. ``heartbeat()`` returns the message to
    write after ``heartbeat_interval_s`` of silence and its size in bytes, or None when
    the transport keeps the connection alive elsewhere (the WebSocket's socket writer).
    Implementations never await and never raise.
    """

    def encode(self, frame: Frame) -> tuple[bytes, bytes]: ...

    def messages(self, wires: list[bytes]) -> Sequence[Message]: ...

    def heartbeat(self) -> tuple[Message, int] | None: ...


class SseFramer:
    """SSE framing (EB-18): one body chunk per batch, ``: heartbeat`` comments.

    ``encoder`` frames the events (one per process shares its cache across streams).
    """

    __slots__ = ("encoder",)

    def __init__(self, encoder: FrameEncoder) -> None:
        self.encoder = encoder

    def encode(self, frame: Frame) -> tuple[bytes, bytes]:
        """``(the SSE block, the JSON of its data: line)``."""
        if frame.id is None:
            return self.encoder.synthetic(frame)
        return self.encoder.event(frame), frame.json or b""

    def messages(self, wires: list[bytes]) -> Sequence[Message]:
        """One ``http.response.body`` chunk holding every block."""
        return ({"type": "http.response.body", "body": b"".join(wires), "more_body": True},)

    def heartbeat(self) -> tuple[Message, int] | None:
        """The ``: heartbeat`` comment chunk."""
        return _SSE_HEARTBEAT, len(HEARTBEAT)


_SSE_HEARTBEAT: Message = {"type": "http.response.body", "body": HEARTBEAT, "more_body": True}


class WriterIdleTimeoutError(Exception):
    """Raised by :func:`pump_frames` when ``send`` accepted nothing for ``idle_s`` seconds."""

    def __init__(self, idle_s: float) -> None:
        super().__init__(f"the socket accepted no byte for {idle_s:g} s")
        self.idle_s = idle_s


class _IdleWatch:
    """The writer idle timeout: one sweeper deadline per stream, not an ``asyncio.timeout``
    per send.

    An ``asyncio.timeout`` scope around every ``send`` was a third of the pump's time when
    each event is its own ``send`` (docs/benchmarks.md, issue 23). Here a ``send`` costs two
    attribute writes and a clock read; a deadline of the loop's
    :class:`~sessions.bus.sweep.Sweeper` (not a timer handle per stream: memory per idle
    stream) comes once per ``idle_s`` (or when the pending ``send`` reaches ``idle_s``,
    up to an eighth of ``idle_s`` late, at most 1 s) and cancels the pump's task only if
    one ``send`` has been pending that long. :func:`pump_frames` turns that cancellation into
    :class:`WriterIdleTimeoutError`. A subscriber the bus already evicted gets
    ``linger_s`` more in all, from when the idle bound first passed, so that a reader
    frozen while it was evicted still reads its last frames (``slow_client_warning``,
    ``client_evicted``) and the clean end of the body rather than a reset (B21).
    """

    __slots__ = (
        "_linger_s",
        "_linger_until",
        "_loop",
        "_subscription",
        "_sweeper",
        "_task",
        "fired",
        "idle_s",
        "started",
    )

    def __init__(self, idle_s: float, subscription: Subscription, linger_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None  # pump_frames runs in a task
        self._task = task
        self._subscription = subscription
        self._linger_s = linger_s
        self._linger_until: float | None = None  # loop time; set when first needed
        self.idle_s = idle_s
        self.started: float | None = None  # loop time the pending send began, or None
        self.fired = False
        self._sweeper = sweeper(self._loop)
        self._due(self._loop.time() + idle_s)

    def _check(self) -> None:
        started, now = self.started, self._loop.time()
        if started is not None and now - started >= self.idle_s:
            if self._subscription.evicted:
                if self._linger_until is None:
                    # (from when the bound passed, not from this late check)
                    self._linger_until = started + self.idle_s + self._linger_s
                if now < self._linger_until:
                    self._sweeper.call_at(
                        self, self._linger_until, _IdleWatch._check, self.idle_s / 8
                    )
                    return
            self.fired = True
            self._task.cancel()
            return
        self._due(started + self.idle_s if started is not None else now + self.idle_s)

    def _due(self, when: float) -> None:
        self._sweeper.call_at(self, when, _IdleWatch._check, self.idle_s / 8)

    def close(self) -> None:
        self._sweeper.cancel(self)


async def _send_watched(send: Send, message: Message, watch: _IdleWatch | None) -> None:
    if watch is None:
        await send(message)
        return
    watch.started = watch._loop.time()
    await send(message)
    watch.started = None


async def pump_frames(
    subscription: Subscription,
    send: Send,
    heartbeat_interval_s: float,
    observer: ConnectionObserver | None = None,
    writer_idle_timeout_s: float | None = None,
    *,
    encoder: FrameEncoder | None = None,
    evicted_linger_s: float | None = None,
    framer: Framer | None = None,
) -> None:
    """Write every frame of ``subscription`` to ``send`` until it ends (EB-18).

    Frames already queued go out together in one body message (at most 256 KiB), so a
    burst costs one ``send`` while every frame still reaches the socket as soon as it is
    produced. When nothing arrives for ``heartbeat_interval_s`` seconds a ``: heartbeat``
    comment is written. Once ``send`` returned, ``observer`` is told about its frames
    in one call (the frames, their wire bytes, the JSON of their ``data:`` lines) and
    about each heartbeat.
    ``encoder`` frames the events (one per process shares its cache across streams);
    ``framer`` turns them into messages (default :class:`SseFramer` over ``encoder``).
    After each ``send`` returned, its size is added to ``subscription.bytes_sent`` (one
    integer add per batch or heartbeat, for operators' bytes per second).

    Returns when the subscription ends (evicted, bus closed, disconnected); raises
    whatever ``send`` or the iterator raises, and :class:`WriterIdleTimeoutError` when one
    ``send`` (frames or a heartbeat, which go through the same path, so a half-open
    connection is found too) does not return within ``writer_idle_timeout_s`` seconds,
    or, once the bus evicted the subscriber, within ``evicted_linger_s`` more in all
    (default: ``writer_idle_timeout_s``): a reader frozen while it was evicted gets its
    last frames and a clean end when it wakes within that bound (B21).
    """
    # `is None`, not `or`: an empty FrameEncoder is falsy (it has a length), and a new
    # encoder per stream would frame every event once per subscriber.
    if observer is None:
        observer = _NOBODY
    if framer is None:
        framer = SseFramer(encoder if encoder is not None else FrameEncoder())
    linger_s = evicted_linger_s if evicted_linger_s is not None else writer_idle_timeout_s or 0.0
    watch = (
        None
        if writer_idle_timeout_s is None
        else _IdleWatch(writer_idle_timeout_s, subscription, linger_s)
    )
    # One coroutine per stream (the loop is not a function of its own): a frame held for
    # as long as the stream lasts is memory per idle stream (issue 23).
    try:
        while True:
            try:
                frame = await subscription.next_frame(heartbeat_interval_s)
            except StopAsyncIteration:
                return
            if frame is None:
                heartbeat = framer.heartbeat()
                if heartbeat is not None:
                    await _send_watched(send, heartbeat[0], watch)
                    subscription.bytes_sent += heartbeat[1]
                    observer.bytes_written(heartbeat[1])
                continue
            frames = []
            wires = []
            payloads = []
            size = 0
            while True:
                wire, payload = framer.encode(frame)
                frames.append(frame)
                wires.append(wire)
                payloads.append(payload)
                size += len(wire)
                if size >= MAX_BATCH_BYTES:
                    break
                queued = subscription.next_nowait()
                if queued is None:
                    break
                frame = queued
            for message in framer.messages(wires):
                await _send_watched(send, message, watch)
            subscription.bytes_sent += size  # one add per batch: operators' bytes per second
            observer.frames_written(frames, wires, payloads, size)  # one call per batch

    except asyncio.CancelledError:
        # The watch cancelled the task (and nobody else did): the socket took nothing.
        task = asyncio.current_task()
        if watch is not None and watch.fired and task is not None and task.uncancel() == 0:
            raise WriterIdleTimeoutError(watch.idle_s) from None
        raise
    finally:
        if watch is not None:
            watch.close()
