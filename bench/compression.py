"""Stream compression (EB-17), measured: the codec's window, the server's CPU, the wire.

``python -m bench.compression [--quick] [--json out.json]``

1. **Window** (in process): 600 demo-agent frames (one-word ``agent_message_chunk``
   events, a tool call) through :class:`sessions.wire.compression.GzipStream` at several
   zlib settings, and through a fresh compressor per frame: bytes kept, µs per frame,
   KiB per held context (``tracemalloc`` sees zlib's allocations).
2. **CPU per delivery** (``python -m qwenweb.serve``): ``readers`` streams of one session,
   all plain or all gzipped, ``events`` one-word ``agent_message_chunk`` events of about
   200 bytes on the wire published in one burst (``/bench/burst?shape=token``); the
   server's CPU seconds divided by the deliveries. Plain and gzip alternate,
   ``reps`` times, and the extra µs is taken per repetition (same run).
3. **Side by side** (``python -m qwenweb.serve``): a token-shaped stream (600 one-word
   ``agent_message_chunk`` events with a few tool calls, ``rate``/s, published over HTTP)
   read by a plain reader and by one sending a browser's ``Accept-Encoding``: body bytes
   after de-chunking, the events each got, and for every frame how much later it became
   decodable from the gzipped bytes received so far than from the plain ones. Then the
   session's snapshot at ``limit=500``, plain and ``compact=1``: bytes of each.

Every loop is bounded in count and time; servers are stopped at the end.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import tempfile
import threading
import time
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

from bench.servers import QW_SERVE, Server, collect_static, migrate_template
from sessions.bus.frame import encode_envelope, envelope_fields
from sessions.scripted_agent import agent_turns
from sessions.wire import ServerSentEvent, SSEParser, encode_frame
from sessions.wire.compression import GzipStream

BROWSER_ACCEPT = "gzip, deflate, br, zstd"
WAIT_S = 60.0

SETTINGS = (  # (level, window bits, memLevel)
    (6, 15, 8),
    (6, 12, 4),
    (6, 10, 2),
    (6, 9, 1),
    (1, 9, 1),
    (9, 9, 1),
)


def token_events(count: int) -> list[dict[str, Any]]:
    """The demo agent's events, its script repeated to ``count``: ``{"type", "data"}``."""
    events: list[dict[str, Any]] = []
    while len(events) < count:  # the script again while it is too short (bounded: it is not empty)
        events += [{"type": kind, "data": data} for kind, data, _ in agent_turns()]
    return events[:count]


def token_frames(count: int) -> list[bytes]:
    """The wire bytes of :func:`token_events`, ids from 1, as the route writes them."""
    frames = []
    for event_id, event in enumerate(token_events(count), start=1):
        fields = envelope_fields(event, event_id)
        assert fields is not None
        payload = encode_envelope(fields)
        assert payload is not None
        frames.append(encode_frame(event_type=event["type"], data_json=payload, event_id=event_id))
    return frames


def window_table(frames: list[bytes], passes: int) -> list[dict[str, Any]]:
    """Bytes kept, µs per frame and KiB per context for each of :data:`SETTINGS`."""
    plain = sum(map(len, frames))
    rows = []
    for level, wbits, mem_level in SETTINGS:
        kept, best_s = 0, float("inf")
        for _ in range(passes):
            stream = GzipStream(level=level, window_bits=wbits, mem_level=mem_level)
            start = time.perf_counter()
            kept = sum(len(stream.write(frame)) for frame in frames)
            best_s = min(best_s, time.perf_counter() - start)
        rows.append(
            {
                "codec": f"gzip level {level}, wbits {wbits}, memLevel {mem_level}",
                "kept": kept / plain,
                "us_per_frame": best_s / len(frames) * 1e6,
                "kib_per_context": _context_kib(level, wbits, mem_level, frames[0]),
            }
        )
    start = time.perf_counter()
    fresh = sum(len(zlib.compress(frame, 6, -15)) + 18 for frame in frames)
    rows.append(
        {
            "codec": "a fresh gzip per frame (no context)",
            "kept": fresh / plain,
            "us_per_frame": (time.perf_counter() - start) / len(frames) * 1e6,
            "kib_per_context": 0.0,
        }
    )
    return rows


def _context_kib(level: int, wbits: int, mem_level: int, frame: bytes) -> float:
    count = 200
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    streams = [
        GzipStream(level=level, window_bits=wbits, mem_level=mem_level) for _ in range(count)
    ]
    for stream in streams:
        stream.write(frame)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held / count / 1024


# -- readers against a real server --------------------------------------------------------


class Reader(threading.Thread):
    """One stream read with http.client (it de-chunks) until ``last_id`` events with an id
    arrived: body bytes, and when each id became decodable."""

    def __init__(self, port: int, path: str, token: str, gzip: bool, last_id: int) -> None:
        super().__init__(daemon=True)
        self.port, self.path, self.token, self.gzip, self.last_id = port, path, token, gzip, last_id
        self.body_bytes = 0
        self.decoded: dict[str, float] = {}  # id -> monotonic time it was decodable
        self.events: list[ServerSentEvent] = []
        self.ready = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        try:
            self._read()
        except Exception as exc:  # reported, never hidden
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.ready.set()

    def _read(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=WAIT_S)
        headers = {"Authorization": f"Bearer {self.token}"}
        if self.gzip:
            headers["Accept-Encoding"] = BROWSER_ACCEPT
        connection.request("GET", self.path, headers=headers)
        response = connection.getresponse()
        encoding = response.getheader("content-encoding")
        assert (encoding == "gzip") == self.gzip, encoding
        inflate = zlib.decompressobj(31) if self.gzip else None
        parser = SSEParser(self._dispatched)
        self.ready.set()
        deadline = time.monotonic() + WAIT_S
        while not self.done and time.monotonic() < deadline:
            chunk = response.read1(65536)
            if not chunk:
                break
            self.body_bytes += len(chunk)
            self._now = time.monotonic()
            parser.feed_bytes(inflate.decompress(chunk) if inflate else chunk)
        connection.close()

    @property
    def done(self) -> bool:
        """Whether ``last_id`` events with an id were read."""
        return len(self.decoded) - ("" in self.decoded) >= self.last_id

    def _dispatched(self, event: ServerSentEvent) -> None:
        self.events.append(event)
        self.decoded.setdefault(event.last_event_id, self._now)


def _publish_tokens(
    port: int, sid: str, token: str, events: list[dict[str, Any]], rate: float
) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    start = time.monotonic()
    for n, event in enumerate(events):
        pause = start + n / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # the pace of an LLM, not a wait for a cause
        connection.request("POST", f"/session/{sid}/events", json.dumps(event), headers)
        answer = connection.getresponse()
        answer.read()
        assert answer.status == 200, answer.status
    connection.close()


def _get(port: int, target: str, token: str) -> bytes:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    connection.request("GET", target, headers={"Authorization": f"Bearer {token}"})
    answer = connection.getresponse()
    body = answer.read()
    connection.close()
    assert answer.status == 200, answer.status
    return body


def side_by_side(server: Server, count: int, rate: float) -> dict[str, Any]:
    """A token stream read plain and gzipped at once; see the module docstring (3)."""
    channel = server.call("/bench/session?scope=read,publish")
    sid, token, path = channel["channel"], channel["token"], channel["path"]
    readers = [Reader(server.port, path, token, gzip, count) for gzip in (False, True)]
    for reader in readers:
        reader.start()
        assert reader.ready.wait(WAIT_S), "a reader did not open"
    _publish_tokens(server.port, sid, token, token_events(count), rate)
    for reader in readers:
        reader.join(WAIT_S)
    plain, gzipped = readers
    assert plain.error is None, plain.error
    assert gzipped.error is None, gzipped.error
    delays = [(gzipped.decoded[i] - plain.decoded[i]) * 1000 for i in plain.decoded if i]
    snapshot = _get(server.port, f"/session/{sid}?limit=500", token)
    compacted = _get(server.port, f"/session/{sid}?limit=500&compact=1", token)
    return {
        "snapshot_limit_500_bytes": len(snapshot),
        "compacted_bytes": len(compacted),
        "compacted_kept": len(compacted) / len(snapshot),
        "compacted_entries": len(json.loads(compacted)["events"]),
        "events": count,
        "rate_per_s": rate,
        "plain_bytes": plain.body_bytes,
        "gzip_bytes": gzipped.body_bytes,
        "kept": gzipped.body_bytes / plain.body_bytes,
        "same_events": [(e.type, e.last_event_id, e.data) for e in plain.events]
        == [(e.type, e.last_event_id, e.data) for e in gzipped.events],
        "frames_compared": len(delays),
        "plain_events": len(plain.events),
        "extra_delay_ms_median": statistics.median(delays),
        "extra_delay_ms_max": max(delays),
    }


def cpu_per_delivery(server: Server, readers: int, events: int, gzip: bool) -> float:
    """Server CPU µs per delivered token event (~200 bytes), ``readers`` streams, one codec."""
    channel = server.call("/bench/session")
    path = channel["path"] + "?maxQueued=2048"  # the burst is queued whole, never evicted
    group = [Reader(server.port, path, channel["token"], gzip, events) for _ in range(readers)]
    for reader in group:
        reader.start()
        assert reader.ready.wait(WAIT_S), "a reader did not open"
    before = server.cpu_s()
    server.call(f"/bench/burst?channel={channel['channel']}&n={events}&shape=token&rate=0")
    for reader in group:
        reader.join(WAIT_S)
        assert reader.error is None, reader.error
        assert reader.done, (len(reader.decoded), [e.data[:300] for e in reader.events[-1:]])
    return (server.cpu_s() - before) / (readers * events) * 1e6


def _open_idle(port: int, path: str, token: str, gzip: bool) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    accept = f"Accept-Encoding: {BROWSER_ACCEPT}\r\n" if gzip else ""
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
    sock.sendall((request + accept + "\r\n").encode())
    assert b" 200 " in sock.recv(65536)  # the headers, maybe with the retry line
    return sock


def idle_memory(server: Server, streams: int, gzip: bool) -> dict[str, float]:
    """Traced bytes per stream (``/bench/tracemalloc``): ``streams`` idle streams just
    opened, after one token event (a context is held), after the next heartbeat."""
    channel = server.call("/bench/session")
    server.call("/bench/tracemalloc?action=mark")
    socks = [
        _open_idle(server.port, channel["path"], channel["token"], gzip) for _ in range(streams)
    ]
    sizes = {"opened": server.call("/bench/tracemalloc")["total_diff"]}
    server.call(f"/bench/burst?channel={channel['channel']}&n=1&shape=token&rate=0")
    for sock in socks:
        assert sock.recv(65536)  # the event
    sizes["after_event"] = server.call("/bench/tracemalloc")["total_diff"]
    for sock in socks:
        assert sock.recv(65536)  # the heartbeat: the stream was idle for its interval
    sizes["after_heartbeat"] = server.call("/bench/tracemalloc")["total_diff"]
    for sock in socks:
        sock.close()
    return {stage: size / streams / 1024 for stage, size in sizes.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer events and repetitions")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--rate", type=float, default=150.0, help="token events per second")
    args = parser.parse_args(argv)
    reps, readers, events = (2, 10, 1000) if args.quick else (4, 20, 2000)
    events = min(events, 2000)  # within maxQueued=2048
    results: dict[str, Any] = {"window": window_table(token_frames(600), 3 if args.quick else 10)}
    print("| codec | bytes kept | µs per frame | KiB per held context |")
    print("| --- | --- | --- | --- |")
    for row in results["window"]:
        cells = (
            f"{row['kept']:.1%}",
            f"{row['us_per_frame']:.2f}",
            f"{row['kib_per_context']:.1f}",
        )
        print(f"| {row['codec']} | {' | '.join(cells)} |")
    with tempfile.TemporaryDirectory() as workdir:
        work = Path(workdir)
        server = Server(QW_SERVE, work, migrate_template(work), static_root=collect_static(work))
        server.start()
        try:
            results["side_by_side"] = side_by_side(server, 600, args.rate)
            cpu: dict[str, list[float]] = {"plain": [], "gzip": [], "extra": []}
            for rep in range(reps):
                order = (False, True) if rep % 2 == 0 else (True, False)
                measured = {gz: cpu_per_delivery(server, readers, events, gz) for gz in order}
                cpu["plain"].append(measured[False])
                cpu["gzip"].append(measured[True])
                cpu["extra"].append(measured[True] - measured[False])
            results["cpu_us_per_delivery"] = cpu
        finally:
            server.stop()
        server.extra_env.update(BENCH_TRACEMALLOC="1", QWENWEB_HEARTBEAT_INTERVAL_S="2")
        server.start()
        try:
            idle_memory(server, 20, False)  # warm-up: the process's first streams allocate more
            results["idle_kib_per_stream"] = {
                codec: idle_memory(server, 200, codec == "gzip") for codec in ("plain", "gzip")
            }
        finally:
            server.stop()
    print(json.dumps({k: v for k, v in results.items() if k != "window"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
