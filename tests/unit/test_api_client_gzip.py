"""The terminal client asks for a gzipped stream and decodes it (EB-17), against a one-shot
HTTP server on 127.0.0.1 (a thread, one connection)."""

from __future__ import annotations

import socket
import threading

from sessions.api_client import EventStreamClient
from sessions.wire import ServerSentEvent
from sessions.wire.compression import GzipStream

FRAMES = (
    b"retry: 3000\n\n",
    b"id: 1\nevent: note\ndata: {}\n\n",
    b"id: 2\nevent: note\ndata: {}\n\n",
)


def _serve_once(listener: socket.socket, requests: list[bytes]) -> None:
    conn, _ = listener.accept()
    with conn:
        conn.settimeout(5)
        requests.append(conn.recv(65536))
        gzip = GzipStream()
        body = b"".join(gzip.write(frame) for frame in FRAMES) + gzip.end()
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        conn.sendall(head.encode() + body)


def test_tail_client_asks_for_gzip_and_dispatches_the_decoded_events():
    listener = socket.create_server(("127.0.0.1", 0))
    requests: list[bytes] = []
    server = threading.Thread(target=_serve_once, args=(listener, requests), daemon=True)
    server.start()
    events: list[ServerSentEvent] = []
    port = listener.getsockname()[1]
    client = EventStreamClient(
        url=f"http://127.0.0.1:{port}/session/x/events",
        token="t",
        on_event=events.append,
        max_events=2,
        read_timeout_s=5,
    )
    assert client.run() == 0
    server.join(5)
    listener.close()
    assert b"accept-encoding: gzip" in requests[0].lower()
    assert [e.last_event_id for e in events] == ["1", "2"]
