"""The floor: a minimal raw-asyncio SSE server writing pre-serialized frames.

What Python itself can do on this box, with the same two endpoints as the contenders and
the same HTTP/1.1 chunked framing on the wire:

- ``GET /stream/<channel>`` (optional ``Last-Event-ID: N``: replays the channel's ring after
  N, then a ``replay_complete`` frame, then live);
- ``POST /bench/burst?channel=&n=&size=&rate=&batch=``: publish in-process;
- ``POST /bench/session``: a new channel name; ``GET /bench/ping``: readiness.

Each event is serialized once (``orjson``) into its chunk-encoded frame; every subscriber
gets the same bytes with ``transport.write``. A ring of 8000 frames per channel serves
replay. A subscriber whose transport buffers more than 256 KiB is dropped after a
terminal ``client_evicted`` frame (the floor's version of bounded memory). No
authentication, no heartbeats, no database. Usage: ``python -m bench.floor_server PORT``.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
from collections import deque
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import orjson

from bench.common import burst_params, run_burst

RING_SIZE = 8000
MAX_BUFFERED_BYTES = 256 * 1024
_HEADERS = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _synthetic(event_type: str, data: Any) -> bytes:
    body = orjson.dumps({"v": 1, "type": event_type, "data": data})
    return _chunk(b"event: %s\ndata: %s\n\n" % (event_type.encode(), body))


class Channel:
    """One channel: its ring of chunk-encoded frames and its subscribers."""

    def __init__(self) -> None:
        self.ring: deque[tuple[int, bytes]] = deque(maxlen=RING_SIZE)
        self.subscribers: set[asyncio.StreamWriter] = set()
        self.next_id = 1

    def publish(self, data: dict[str, Any]) -> bool:
        event_id = self.next_id
        self.next_id += 1
        body = orjson.dumps({"id": event_id, "v": 1, "type": "bench", "data": data})
        chunk = _chunk(b"id: %d\nevent: bench\ndata: %s\n\n" % (event_id, body))
        self.ring.append((event_id, chunk))
        evicted = []
        for writer in self.subscribers:
            if writer.transport.get_write_buffer_size() > MAX_BUFFERED_BYTES:
                evicted.append(writer)
            else:
                writer.write(chunk)
        for writer in evicted:
            self.subscribers.discard(writer)
            writer.write(_synthetic("client_evicted", {"droppedAfter": event_id}))
            writer.write(b"0\r\n\r\n")
            writer.close()
        return True


channels: dict[str, Channel] = {}


def _channel(name: str) -> Channel:
    channel = channels.get(name)
    if channel is None:
        channel = channels[name] = Channel()
    return channel


async def _respond_json(writer: asyncio.StreamWriter, status: int, body: Any) -> None:
    payload = orjson.dumps(body)
    writer.write(
        b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n\r\n%s" % (status, len(payload), payload)
    )
    await writer.drain()
    writer.close()


async def _stream(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str, headers: dict[str, str]
) -> None:
    channel = _channel(name)
    out = [_HEADERS, _chunk(b"retry: 3000\n\n")]
    cursor = headers.get("last-event-id")
    if cursor is not None and cursor.isdigit():
        after = int(cursor)
        replayed = [chunk for event_id, chunk in channel.ring if event_id > after]
        out.extend(replayed)
        out.append(_synthetic("replay_complete", {"replayedCount": len(replayed)}))
    writer.write(b"".join(out))
    channel.subscribers.add(writer)
    try:
        while await reader.read(65536):
            pass
    except OSError:
        pass
    finally:
        channel.subscribers.discard(writer)
        writer.close()


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Serve one connection: one request (the stream, or one bench call)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
        writer.close()
        return
    lines = head.decode("latin-1").split("\r\n")
    method, target, _version = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            key, value = line.split(":", 1)
            headers[key.strip().lower()] = value.strip()
    url = urlsplit(target)
    query = dict(parse_qsl(url.query))
    if method == "GET" and url.path.startswith("/stream/"):
        await _stream(reader, writer, url.path[len("/stream/") :], headers)
    elif url.path == "/bench/burst":
        n, size, rate, batch = burst_params(query)
        result = await run_burst(_channel(query["channel"]).publish, n, size, rate, batch)
        await _respond_json(writer, 200, result)
    elif url.path == "/bench/session":
        name = "bench-" + secrets.token_hex(8)
        await _respond_json(writer, 200, {"channel": name, "token": "", "path": f"/stream/{name}"})
    elif url.path == "/bench/ping":
        await _respond_json(writer, 200, {"ok": True})
    else:
        await _respond_json(writer, 404, {"error": "not found"})


async def main(port: int) -> None:
    """Serve on 127.0.0.1:``port`` until killed."""
    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=2048)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
