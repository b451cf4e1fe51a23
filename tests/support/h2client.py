"""An HTTP/2 SSE client for end-to-end tests: the ``h2`` library on one asyncio TLS socket.

One :class:`H2Connection` is one TCP connection (ALPN ``h2``, the tests' CA); each
:meth:`~H2Connection.open_stream` is one request on it, with its own SSE parser. Received
data is acknowledged as it is parsed (the windows reopen), unless a stream is *paused*
(:meth:`~H2Connection.pause`): then its window stays closed once full, as for a client
that stops reading that one stream — the other streams of the connection keep flowing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.events

from sessions.wire import ServerSentEvent, SSEParser
from tests.support.tls import client_context

GOAWAY_FRAME = 0x7


@dataclass
class H2Stream:
    """One request of an :class:`H2Connection` and what it received."""

    stream_id: int
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    events: list[ServerSentEvent] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)
    ended: bool = False
    reset: bool = False
    paused: bool = False
    unacknowledged: int = 0

    def __post_init__(self) -> None:
        self.parser = SSEParser(self.events.append)


class H2Connection:
    """One HTTP/2 connection over TLS to 127.0.0.1:``port``."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.streams: dict[int, H2Stream] = {}
        self.closed = False
        self.alpn: str | None = None
        self._buffer = bytearray()
        self.goaway: tuple[int, int] | None = None
        """``(last_stream_id, error_code)`` of the last GOAWAY received, if any."""
        self._conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )

    async def connect(self, timeout_s: float = 10.0) -> H2Connection:
        """Open the connection; raises ``AssertionError`` unless ALPN chose ``h2``."""
        async with asyncio.timeout(timeout_s):
            self._reader, self._writer = await asyncio.open_connection(
                "127.0.0.1", self.port, ssl=client_context(("h2",))
            )
        ssl_object = self._writer.get_extra_info("ssl_object")
        self.alpn = ssl_object.selected_alpn_protocol() if ssl_object else None
        assert self.alpn == "h2", f"ALPN chose {self.alpn!r}"
        self._conn.initiate_connection()
        self._flush()
        return self

    def local_port(self) -> int:
        """The client-side port of this TCP connection."""
        return int(self._writer.get_extra_info("sockname")[1])

    def _flush(self) -> None:
        data = self._conn.data_to_send()
        if data:
            self._writer.write(data)

    def open_stream(
        self, path: str, token: str | None = None, headers: Sequence[tuple[str, str]] = ()
    ) -> H2Stream:
        """Send ``GET path`` (``Accept: text/event-stream``) on a new stream."""
        stream_id = self._conn.get_next_available_stream_id()
        request = [
            (":method", "GET"),
            (":scheme", "https"),
            (":authority", f"127.0.0.1:{self.port}"),
            (":path", path),
            ("accept", "text/event-stream"),
            *headers,
        ]
        if token:
            request.append(("authorization", f"Bearer {token}"))
        self._conn.send_headers(stream_id, request, end_stream=True)
        self._flush()
        stream = self.streams[stream_id] = H2Stream(stream_id)
        return stream

    def pause(self, stream: H2Stream) -> None:
        """Stop acknowledging ``stream``'s data: its window closes once full."""
        stream.paused = True

    async def _pump_once(self) -> None:
        data = await self._reader.read(65536)
        if not data:
            self.closed = True
            for stream in self.streams.values():
                stream.ended = True
            return
        # One frame at a time (9-byte header: 24-bit length, type): a server's graceful
        # shutdown is GOAWAY(2^31 - 1), a PING, the last frames of its open streams, then a
        # final GOAWAY and the close. The h2 library treats the first GOAWAY as the end
        # of the connection and refuses every later frame, so GOAWAY frames are kept
        # from it (noted in `goaway`): the client goes on as a browser does — it answers
        # the PING and reads its streams to their end — until the server closes.
        self._buffer += data
        while len(self._buffer) >= 9:
            size = 9 + int.from_bytes(self._buffer[:3], "big")
            if len(self._buffer) < size:
                break
            frame, self._buffer = bytes(self._buffer[:size]), self._buffer[size:]
            if frame[3] == GOAWAY_FRAME:
                last_stream_id = int.from_bytes(frame[9:13], "big") & 0x7FFF_FFFF
                self.goaway = (last_stream_id, int.from_bytes(frame[13:17], "big"))
                continue
            for event in self._conn.receive_data(frame):
                self._handle(event)
        self._flush()

    def _handle(self, event: Any) -> None:
        stream = self.streams.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, h2.events.ResponseReceived) and stream:
            headers: dict[str, str] = {
                _text(name): _text(value) for name, value in event.headers or ()
            }
            stream.status = int(headers.pop(":status"))
            stream.headers = headers
        elif isinstance(event, h2.events.DataReceived) and stream:
            stream.body += event.data
            stream.parser.feed_bytes(bytes(event.data))
            # The connection window is always given back; the stream's only if not paused.
            if stream.paused:
                stream.unacknowledged += event.flow_controlled_length
                self._conn.increment_flow_control_window(event.flow_controlled_length)
            else:
                self._conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded) and stream:
            stream.ended = True
        elif isinstance(event, h2.events.StreamReset) and stream:
            stream.ended = stream.reset = True
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.closed = True
            for each in self.streams.values():
                each.ended = True

    async def read_until(self, predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
        """Read until ``predicate()`` holds or the connection closes; bounded."""
        async with asyncio.timeout(timeout_s):
            while not predicate() and not self.closed:
                await self._pump_once()

    async def read_to_end(self, timeout_s: float = 10.0) -> None:
        """Read until every stream ended (or the connection closed); bounded."""
        await self.read_until(lambda: all(s.ended for s in self.streams.values()), timeout_s)

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Send GOAWAY, close the socket and wait (bounded) until it is closed."""
        with contextlib.suppress(Exception):
            self._conn.close_connection()
            self._flush()
        self._writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._writer.wait_closed(), timeout_s)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
