"""HTTP/2 for the load generator: many SSE streams over one TLS connection (``h2`` library).

:func:`connect` opens one TLS connection (ALPN ``h2``, the bench's self-signed certificate
accepted), sends one ``GET`` per :class:`bench.loadgen.Subscriber` on its own stream and
feeds each stream's DATA to its subscriber's frame splitter, so loss, duplicates and
latency are counted exactly as over HTTP/1.1. Flow control: the client's windows are large
(16 MiB per stream, 1 GiB for the connection) and every DATA frame is acknowledged, so the
client's reading speed, not a closed window, is what limits the server.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Sequence
from typing import Any, Protocol

import h2.config
import h2.connection
import h2.events
import h2.settings


class Subscriber(Protocol):
    """One stream's reader, as this module drives it (:class:`bench.loadgen.Subscriber`
    is one): its response status, its end, and its body bytes with the arrival time."""

    status: int
    in_body: bool
    terminal: str | None
    ready: asyncio.Future[None]
    done: asyncio.Future[None]

    def body_received(self, data: bytes, now: int) -> None: ...

    def connection_lost(self, exc: Exception | None) -> None: ...


STREAM_WINDOW = 16 * 1024 * 1024
CONNECTION_WINDOW = 1024 * 1024 * 1024


def client_context(alpn: list[str]) -> ssl.SSLContext:
    """A TLS client context offering ``alpn`` that accepts any certificate (the bench's
    own self-signed one; nothing here leaves 127.0.0.1)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(alpn)
    return context


class H2Streams(asyncio.Protocol):
    """One HTTP/2 connection carrying one SSE stream per subscriber."""

    def __init__(self, subs: Sequence[Subscriber], path: str, authority: str, headers: Any) -> None:
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.conn = h2.connection.H2Connection(config=config)
        self.subs = subs
        self.path = path
        self.authority = authority
        self.headers = [(str(k).lower(), str(v)) for k, v in headers]
        self.by_stream: dict[int, Subscriber] = {}
        self.transport: asyncio.Transport | None = None
        self.alpn: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        ssl_object = transport.get_extra_info("ssl_object")
        self.alpn = ssl_object.selected_alpn_protocol() if ssl_object else None
        self.conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
            },
        )
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        for sub in self.subs:
            stream_id = self.conn.get_next_available_stream_id()
            request = [
                (":method", "GET"),
                (":path", self.path),
                (":scheme", "https"),
                (":authority", self.authority),
                ("accept", "text/event-stream"),
                *self.headers,
            ]
            self.conn.send_headers(stream_id, request, end_stream=True)
            self.by_stream[stream_id] = sub
        transport.write(self.conn.data_to_send())

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        for event in self.conn.receive_data(data):
            sub = self.by_stream.get(getattr(event, "stream_id", 0) or 0)
            if isinstance(event, h2.events.ResponseReceived) and sub is not None:
                headers = {_text(k): _text(v) for k, v in event.headers or ()}
                sub.status = int(headers.get(":status", "0"))
                sub.in_body = True
            elif isinstance(event, h2.events.DataReceived) and sub is not None:
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                if event.data:
                    if not sub.ready.done():
                        sub.ready.set_result(None)
                    sub.body_received(event.data, now)
            elif isinstance(event, h2.events.StreamEnded | h2.events.StreamReset) and sub:
                sub.terminal = sub.terminal or (
                    "end_of_stream" if isinstance(event, h2.events.StreamEnded) else "reset"
                )
                _resolve(sub)
            elif isinstance(event, h2.events.ConnectionTerminated):
                for each in self.subs:
                    each.terminal = each.terminal or "goaway"
                    _resolve(each)
        out = self.conn.data_to_send()
        if out and self.transport is not None:
            self.transport.write(out)

    def connection_lost(self, exc: Exception | None) -> None:
        for sub in self.subs:
            sub.connection_lost(exc)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.conn.close_connection()
            self.transport.write(self.conn.data_to_send())
            self.transport.close()


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _resolve(sub: Subscriber) -> None:
    for future in (sub.ready, sub.done):
        if not future.done():
            future.set_result(None)


async def connect(spec: dict[str, Any], subs: Sequence[Subscriber]) -> H2Streams:
    """Open the connection and the streams; wait (bounded) until every stream is ready.

    Raises ``RuntimeError`` when the server did not choose ``h2`` by ALPN."""
    loop = asyncio.get_running_loop()
    port = int(spec["port"])
    protocol = H2Streams(subs, spec["path"], f"127.0.0.1:{port}", spec.get("headers", []))
    await asyncio.wait_for(
        loop.create_connection(
            lambda: protocol, "127.0.0.1", port, ssl=client_context(["h2"]),
            server_hostname="127.0.0.1",
        ),
        10,
    )  # fmt: skip
    if protocol.alpn != "h2":
        protocol.close()
        raise RuntimeError(f"the server chose {protocol.alpn!r} by ALPN, not h2")
    ready = [asyncio.shield(sub.ready) for sub in subs]
    await asyncio.wait(ready, timeout=20)
    for sub in subs:
        if not sub.ready.done():
            sub.terminal = "connect_failed"
            _resolve(sub)
    return protocol
