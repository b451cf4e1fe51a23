"""An HTTP/2 SSE client over TLS (the ``h2`` library) that can stop reading one stream.

One TCP connection, several streams. Flow control is the client's to grant: data received
on a stream is acknowledged (its stream window and the connection's window reopened) only
while the stream is *reading*; a stream marked stalled has its bytes returned to the
connection window only, so its own window closes after the initial 64 KiB while the
other streams on the connection keep flowing — a browser tab whose reader stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from sessions.wire import ServerSentEvent, SSEParser

CONNECTION_WINDOW = 16 * 1024 * 1024
"""The connection-level window the client opens at once (so one stream's 64 KiB never
blocks the others)."""


@dataclass
class H2Stream:
    """One request's response as it arrives: status, SSE events, and how it ended."""

    stream_id: int
    status: int = 0
    events: list[ServerSentEvent] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)
    ended: bool = False
    reset: int | None = None
    """The RST_STREAM error code, when the server reset the stream."""
    stalled: bool = False
    unacknowledged: int = 0
    """Bytes received while stalled, not yet returned to the stream's window."""

    def __post_init__(self) -> None:
        self._parser = SSEParser(self.events.append)

    def feed(self, data: bytes) -> None:
        self.body += data
        self._parser.feed_bytes(data)


class H2Client:
    """One HTTP/2 connection over TLS (ALPN ``h2``) to ``host``:``port``."""

    def __init__(self, host: str, port: int, ca_file: Path) -> None:
        self.host = host
        self.port = port
        self.ca_file = ca_file
        self.streams: dict[int, H2Stream] = {}
        self.terminated: h2.events.ConnectionTerminated | None = None
        self.closed = False
        self._changed = asyncio.Event()

    async def connect(self, timeout_s: float = 10.0) -> H2Client:
        context = ssl.create_default_context(cafile=str(self.ca_file))
        context.set_alpn_protocols(["h2"])
        async with asyncio.timeout(timeout_s):
            self._reader, self._writer = await asyncio.open_connection(
                self.host, self.port, ssl=context
            )
        ssl_object = self._writer.get_extra_info("ssl_object")
        protocol = ssl_object.selected_alpn_protocol() if ssl_object else None
        if protocol != "h2":
            raise ConnectionError(f"the server chose {protocol!r} by ALPN, not h2")
        self._conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self._conn.initiate_connection()
        self._conn.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        self._flush()
        self._task = asyncio.create_task(self._read_loop())
        return self

    @property
    def sockname(self) -> tuple[str, int]:
        """The client end of the one TCP connection (to find it with ``ss``)."""
        name = self._writer.get_extra_info("sockname")
        return str(name[0]), int(name[1])

    def _flush(self) -> None:
        data = self._conn.data_to_send()
        if data:
            self._writer.write(data)

    async def _read_loop(self) -> None:
        try:
            while data := await self._reader.read(65536):
                for event in self._conn.receive_data(data):
                    self._handle(event)
                self._flush()
                self._changed.set()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            self.closed = True
            self._changed.set()

    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ConnectionTerminated):
            self.terminated = event
            return
        stream_id = getattr(event, "stream_id", None)
        stream = self.streams.get(stream_id) if stream_id is not None else None
        if stream is None:
            return
        if isinstance(event, h2.events.ResponseReceived):
            stream.status = int(dict(event.headers)[b":status"])
        elif isinstance(event, h2.events.DataReceived):
            stream.feed(event.data)
            size = event.flow_controlled_length
            if stream.stalled:
                stream.unacknowledged += size
                if size:  # the connection's window only: the others keep flowing
                    self._conn.increment_flow_control_window(size)
            else:
                self._conn.acknowledge_received_data(size, stream.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            stream.ended = True
        elif isinstance(event, h2.events.StreamReset):
            stream.ended = True
            stream.reset = int(event.error_code)

    def get(self, path: str, headers: Sequence[tuple[str, str]] = ()) -> H2Stream:
        """Send ``GET path`` on a new stream of this connection; returns the stream."""
        stream_id = self._conn.get_next_available_stream_id()
        self.streams[stream_id] = stream = H2Stream(stream_id)
        self._conn.send_headers(
            stream_id,
            [
                (":method", "GET"),
                (":scheme", "https"),
                (":authority", f"{self.host}:{self.port}"),
                (":path", path),
                *headers,
            ],
            end_stream=True,
        )
        self._flush()
        return stream

    def stall(self, stream: H2Stream) -> None:
        """Stop granting ``stream`` window: its reader stopped reading."""
        stream.stalled = True

    def resume(self, stream: H2Stream) -> None:
        """Read ``stream`` again: return every byte held back to its window."""
        stream.stalled = False
        if stream.unacknowledged and not stream.ended:
            with contextlib.suppress(h2.exceptions.StreamClosedError):
                self._conn.increment_flow_control_window(stream.unacknowledged, stream.stream_id)
        stream.unacknowledged = 0
        self._flush()

    async def wait_for(self, predicate: Callable[[], bool], timeout_s: float) -> None:
        """Until ``predicate()`` holds (checked after each read); bounded; raises
        ``ConnectionError`` if the connection closes first."""
        async with asyncio.timeout(timeout_s):
            while not predicate():
                if self.closed:
                    raise ConnectionError("the HTTP/2 connection closed")
                self._changed.clear()
                await self._changed.wait()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.close_connection()
            self._flush()
        self._writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._writer.wait_closed(), 5)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
