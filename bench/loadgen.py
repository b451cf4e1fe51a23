"""Load generator: SSE subscribers on raw asyncio sockets, in a process of their own.

``python -m bench.loadgen '<spec as JSON>'`` prints one JSON line with the results (see
:func:`main` for the spec). Every wait is bounded by the spec's ``timeout_s``.

The client is deliberately cheap so that it is not the bottleneck: an
``asyncio.Protocol`` per subscriber, an incremental HTTP/1.1 chunked decoder, and frames
split on ``b"\\n\\n"``. That splitter is correct here because every contender writes
LF-only frames whose ``data`` is one line of JSON (qwenweb: EB-18; django-eventstream's
JSON has no newline; the floor writes qwenweb's framing). To prove it on every run, the
first subscriber's decoded body is kept (up to 16 MiB) and re-parsed afterwards with the
project's WHATWG parser (``sessions.wire.SSEParser``); the two counts must agree
(``parser_check``).

Transports (spec ``transport``): ``h1`` (plain HTTP/1.1, one connection per subscriber, the
default), ``h1-tls`` (the same over TLS, ALPN ``http/1.1``) and ``h2`` (every subscriber a
stream of one TLS connection, :mod:`bench.h2client`). The events are published by a POST
to the server (``trigger``) or by a command (``trigger_argv``: Nchan's publisher,
:mod:`bench.nchan`).

Each bench event carries ``seq`` and ``t`` (publish ``monotonic_ns``). Per subscriber the
generator counts unique, duplicated and out-of-range sequence numbers, and classifies
missing ones: after a ``client_evicted`` terminal frame they are *announced* (the contract
told the client); anywhere else they are *lost silently* (a correctness failure).
"""

from __future__ import annotations

import asyncio
import json
import re
import resource
import socket
import sys
import time
import zlib
from array import array
from collections import Counter
from pathlib import Path
from typing import Any

from bench import h2client
from bench.nchan import parse_id
from sessions.wire import ServerSentEvent, SSEParser

SEQ_RE = re.compile(rb'"seq": ?(\d+), ?"t": ?(\d+)')
TYPE_RE = re.compile(rb"(?:^|\n)event: ?([^\n]*)")
DROPPED_RE = re.compile(rb'"droppedAfter": ?(\d+)')
ID_RE = re.compile(rb"(?:^|\n)id: ?([^\n]*)")
TERMINAL_TYPES = frozenset({"client_evicted", "stream_error", "stream-error"})
RAW_LIMIT = 16 * 1024 * 1024


class Subscriber(asyncio.Protocol):
    """One SSE stream: decodes HTTP, splits frames, counts sequence numbers."""

    def __init__(
        self, index: int, n: int, stalled: bool, record: bool, request: bytes, nchan_ids: bool
    ) -> None:
        self.index = index
        self.nchan_ids = nchan_ids  # check that Nchan's ``time:seq`` ids only go up
        self.last_id: tuple[int, int] = (0, -1)
        self.id_disorder = 0
        self.n = n
        self.stalled = stalled
        self.request = request
        self.raw: bytearray | None = bytearray() if record else None
        self.head = bytearray()
        self.in_body = False
        self.chunked = False
        self.inflate: Any = None  # a gzipped body (``accept_encoding``): its decoder
        self.cbuf = bytearray()
        self.cstate = 0  # 0: size line, 1: data, 2: CRLF after data
        self.need = 0
        self.sse = bytearray()
        self.seen = bytearray(n + 1)
        self.unique = 0
        self.dups = 0
        self.out_of_range = 0
        self.max_seq = 0
        self.first_t = 0
        self.last_recv = 0
        self.lat: array[int] = array("q")
        self.types: Counter[str] = Counter()
        self.terminal: str | None = None
        self.dropped_after: int | None = None
        self.replay_complete_ns = 0
        self.status = 0
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        if not self.in_body:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.head[:end]).decode("latin-1").lower()
            rest = bytes(self.head[end + 4 :])
            self.head = bytearray()
            self.in_body = True
            self.status = int(head.split(" ", 2)[1])
            self.chunked = "transfer-encoding: chunked" in head
            if "content-encoding: gzip" in head:
                self.inflate = zlib.decompressobj(31)
            if self.stalled and self.transport is not None:
                self.transport.pause_reading()
                self.ready.set_result(None)  # a stalled reader is ready once it has headers
            data = rest
            if not data:
                return
        if self.chunked:
            data = self._dechunk(data)
        if self.inflate is not None and data:
            data = self.inflate.decompress(data)
        if data:
            # Ready at the first body bytes: every contender has registered the
            # subscriber by then (django-eventstream only once its generator runs).
            if not self.ready.done():
                self.ready.set_result(None)
            self.body_received(data, now)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.terminal is None:
            self.terminal = "connection_closed"
        for future in (self.ready, self.done):
            if not future.done():
                future.set_result(None)

    # -- decoding -----------------------------------------------------------------------

    def _dechunk(self, data: bytes) -> bytes:
        buf = self.cbuf
        buf += data
        pos, end, out = 0, len(buf), []
        while pos < end:
            if self.cstate == 0:
                line_end = buf.find(b"\r\n", pos)
                if line_end < 0:
                    break
                size = int(bytes(buf[pos:line_end]).split(b";", 1)[0], 16)
                pos = line_end + 2
                if size == 0:
                    self.terminal = self.terminal or "end_of_stream"
                    pos = end
                    break
                self.cstate, self.need = 1, size
            elif self.cstate == 1:
                take = min(self.need, end - pos)
                out.append(bytes(buf[pos : pos + take]))
                pos += take
                self.need -= take
                if self.need == 0:
                    self.cstate, self.need = 2, 2
            else:
                take = min(self.need, end - pos)
                pos += take
                self.need -= take
                if self.need == 0:
                    self.cstate = 0
        del buf[:pos]
        return b"".join(out)

    def body_received(self, data: bytes, now: int) -> None:
        if self.raw is not None and len(self.raw) < RAW_LIMIT:
            self.raw += data
        sse = self.sse
        sse += data
        cut = sse.rfind(b"\n\n")
        if cut < 0:
            return
        block = bytes(sse[:cut])
        del sse[: cut + 2]
        seen, n, lat, stalled = self.seen, self.n, self.lat, self.stalled
        for frame in block.split(b"\n\n"):
            match = SEQ_RE.search(frame)
            if match is None:
                self._other(frame, now)
                continue
            seq = int(match[1])
            if self.nchan_ids:
                self._check_id(frame)
            if not 1 <= seq <= n:
                self.out_of_range += 1
                continue
            if seen[seq]:
                self.dups += 1
                continue
            seen[seq] = 1
            self.unique += 1
            self.max_seq = max(self.max_seq, seq)
            t = int(match[2])
            if not self.first_t or t < self.first_t:
                self.first_t = t
            if not stalled:
                lat.append(now - t)
        self.last_recv = now
        if self.unique == n and not self.done.done():
            self.done.set_result(None)

    def _check_id(self, frame: bytes) -> None:
        match = ID_RE.search(frame)
        try:
            event_id = parse_id(match[1].decode()) if match else None
        except ValueError:
            event_id = None
        if event_id is None or event_id <= self.last_id:
            self.id_disorder += 1
        else:
            self.last_id = event_id

    def _other(self, frame: bytes, now: int) -> None:
        match = TYPE_RE.search(frame)
        if match is None:
            return  # retry, comments, padding
        kind = match[1].decode("utf-8", "replace")
        self.types[kind] += 1
        if kind == "replay_complete":
            self.replay_complete_ns = now
        if kind in TERMINAL_TYPES:
            self.terminal = kind
            dropped = DROPPED_RE.search(frame)
            if dropped is not None:
                self.dropped_after = int(dropped[1])
            if not self.done.done():
                self.done.set_result(None)

    # -- results ------------------------------------------------------------------------

    def missing(self) -> tuple[int, int]:
        """Return (lost silently, announced by an eviction frame) counts."""
        missing_total = self.n - self.unique
        if self.terminal != "client_evicted":
            return missing_total, 0
        announced = self.n - self.max_seq  # everything after the last delivered event
        return missing_total - announced, announced

    def parser_check(self) -> str:
        """Re-parse the recorded body with SSEParser; compare bench-event counts."""
        if self.raw is None or len(self.raw) >= RAW_LIMIT:
            return "skipped"
        events: list[ServerSentEvent] = []
        parser = SSEParser(events.append)
        parser.feed_bytes(bytes(self.raw))
        bench = sum(1 for e in events if SEQ_RE.search(e.data.encode()) is not None)
        fast = self.unique + self.dups + self.out_of_range
        return "ok" if bench == fast else f"MISMATCH parser={bench} splitter={fast}"


def _port_of(spec: dict[str, Any], index: int) -> int:
    """Subscriber ``index``'s server port: ``ports`` round-robin (several processes of one
    deployment), else ``port``."""
    ports = spec.get("ports")
    return int(ports[index % len(ports)]) if ports else int(spec["port"])


def _request(
    spec: dict[str, Any], last_event_id: str | None, port: int | None = None, index: int = 0
) -> bytes:
    """Subscriber ``index``'s request: ``path`` and ``headers``, or with ``streams`` (a list
    of ``[path, bearer token]``, one per session) the stream ``index`` modulo its length."""
    streams = spec.get("streams")
    path, headers = spec.get("path"), spec.get("headers", [])
    if streams:
        path, token = streams[index % len(streams)]
        headers = [["Authorization", f"Bearer {token}"]]
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port if port is not None else spec['port']}",
        "Accept: text/event-stream",
    ]
    if spec.get("accept_encoding"):
        lines.append(f"Accept-Encoding: {spec['accept_encoding']}")
    lines += [f"{k}: {v}" for k, v in headers]
    if last_event_id is not None:
        lines.append(f"Last-Event-ID: {last_event_id}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _connect(spec: dict[str, Any], sub: Subscriber, gate: asyncio.Semaphore) -> None:
    loop = asyncio.get_running_loop()
    tls = spec.get("transport") == "h1-tls"
    context = h2client.client_context(["http/1.1"]) if tls else None
    async with gate:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if sub.stalled:
            # A small receive buffer, so the server's socket fills after tens of KiB.
            rcvbuf = int(spec.get("stall_rcvbuf", 4096))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        try:
            port = _port_of(spec, sub.index)
            await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", port)), 10)
            await loop.create_connection(
                lambda: sub, sock=sock, ssl=context, server_hostname="127.0.0.1" if tls else None
            )
            await asyncio.wait_for(asyncio.shield(sub.ready), 20)
        except (OSError, TimeoutError):
            sub.terminal = "connect_failed"
            sock.close()
            for future in (sub.ready, sub.done):
                if not future.done():
                    future.set_result(None)


async def _trigger(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Publish the events: run ``trigger_argv`` (its last stdout line is JSON), or POST
    ``trigger`` to ``trigger_port`` (default ``port``; TLS with ``trigger_tls``)."""
    argv = spec.get("trigger_argv")
    if argv:
        process = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
        try:
            out, _ = await asyncio.wait_for(process.communicate(), timeout_s)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise
        result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
        return result
    port = int(spec.get("trigger_port") or spec["port"])
    return await _http_post(port, spec["trigger"], timeout_s, bool(spec.get("trigger_tls")))


async def _http_post(port: int, target: str, timeout_s: float, tls: bool = False) -> dict[str, Any]:
    context = h2client.client_context(["http/1.1"]) if tls else None
    async with asyncio.timeout(timeout_s):
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1" if tls else None
        )
        writer.write(
            f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        raw = await reader.read()
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        body = _dechunk_all(body)
    result: dict[str, Any] = json.loads(body) if body.strip() else {}
    if status != 200:
        raise RuntimeError(f"POST {target}: {status} {body[:200]!r}")
    return result


def _dechunk_all(body: bytes) -> bytes:
    out: list[bytes] = []
    pos = 0
    while True:
        line_end = body.index(b"\r\n", pos)
        size = int(body[pos:line_end].split(b";", 1)[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(body[line_end + 2 : line_end + 2 + size])
        pos = line_end + 4 + size


def _percentile(sorted_values: list[int], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index] / 1e6


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one measurement described by ``spec``; return its results."""
    started = time.monotonic()
    timeout_s = float(spec.get("timeout_s", 60))
    n = int(spec.get("n", 0))
    count = int(spec.get("subscribers", 1))
    stalled = int(spec.get("stalled", 0))
    mode = spec.get("mode", "stream")
    cursor = spec.get("last_event_id")
    nchan_ids = spec.get("id_format") == "nchan"
    subs = [
        Subscriber(
            i,
            n,
            i >= count - stalled,
            i == 0 and mode != "idle",
            _request(spec, cursor, _port_of(spec, i), i),
            nchan_ids,
        )
        for i in range(count)
    ]
    gate = asyncio.Semaphore(int(spec.get("connect_concurrency", 64)))
    t_connect = time.monotonic_ns()
    shared: h2client.H2Streams | None = None
    if spec.get("transport") == "h2":
        shared = await asyncio.wait_for(h2client.connect(spec, subs), timeout_s)
    else:
        gathered = asyncio.gather(*(_connect(spec, sub, gate) for sub in subs))
        await asyncio.wait_for(gathered, timeout_s)
    connected_s = (time.monotonic_ns() - t_connect) / 1e9
    statuses = Counter(sub.status for sub in subs)
    result: dict[str, Any] = {"mode": mode, "subscribers": count, "stalled": stalled, "n": n}
    result["statuses"] = {str(k): v for k, v in statuses.items()}
    result["connect_s"] = connected_s
    result["transport"] = spec.get("transport", "h1")
    if mode == "idle":
        print(json.dumps({"ready": statuses.get(200, 0), "statuses": result["statuses"]}))
        sys.stdout.flush()
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(loop.run_in_executor(None, sys.stdin.readline), timeout_s)
        _close(subs, shared)
        result["still_open"] = sum(1 for sub in subs if not sub.done.done())
        return result
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_start = usage.ru_utime + usage.ru_stime
    measure_start = time.monotonic()
    healthy = [sub for sub in subs if not sub.stalled]
    if spec.get("trigger") or spec.get("trigger_argv"):
        # Once the last event is published, subscribers get `settle_s` more to receive it.
        try:
            result["trigger"] = await _trigger(spec, timeout_s)
        except Exception as exc:
            result["trigger"] = {"error": repr(exc)}
        remaining = min(float(spec.get("settle_s", 20)), timeout_s - (time.monotonic() - started))
    else:
        remaining = timeout_s - (time.monotonic() - started)
    pending: set[Any] = set()
    if healthy:
        _done, pending = await asyncio.wait(
            [sub.done for sub in healthy], timeout=max(0.1, remaining)
        )
    result["timed_out_subs"] = len(pending)
    stalled_subs = [sub for sub in subs if sub.stalled]
    for sub in stalled_subs:
        if sub.transport is not None:
            sub.transport.resume_reading()
    if stalled_subs:
        await asyncio.wait(
            [sub.done for sub in stalled_subs], timeout=float(spec.get("stall_drain_s", 10))
        )
    _close(subs, shared)
    _summarize(result, subs, healthy, stalled_subs, t_connect)
    result["wall_s"] = time.monotonic() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["client_cpu_s"] = usage.ru_utime + usage.ru_stime - cpu_start
    result["client_busy"] = result["client_cpu_s"] / max(1e-9, time.monotonic() - measure_start)
    return result


def _close(subs: list[Subscriber], shared: h2client.H2Streams | None) -> None:
    for sub in subs:
        if sub.transport is not None:
            sub.transport.close()
    if shared is not None:
        shared.close()


def _summarize(
    result: dict[str, Any],
    subs: list[Subscriber],
    healthy: list[Subscriber],
    stalled_subs: list[Subscriber],
    t_connect: int,
) -> None:
    lost = announced = 0
    for sub in subs:
        silent, told = sub.missing()
        lost += silent
        announced += told
    result["lost_silent"] = lost
    result["announced_undelivered"] = announced
    result["dup"] = sum(sub.dups for sub in subs)
    result["out_of_range"] = sum(sub.out_of_range for sub in subs)
    result["id_disorder"] = sum(sub.id_disorder for sub in subs)
    result["complete_subs"] = sum(1 for sub in subs if sub.unique == sub.n)
    # What really reached the subscribers: per-delivery costs divide by this, never by
    # n × subscribers (an evicted subscriber costs nothing more and would flatter them).
    result["delivered"] = sum(sub.unique for sub in subs)
    result["gzipped_subs"] = sum(1 for sub in subs if sub.inflate is not None)
    result["evicted_subs"] = sum(1 for sub in subs if sub.terminal == "client_evicted")
    result["terminals"] = dict(Counter(sub.terminal or "open" for sub in subs))
    result["frame_types"] = dict(sum((sub.types for sub in subs), Counter()))
    result["parser_check"] = subs[0].parser_check() if subs else "skipped"
    first_t = min((sub.first_t for sub in healthy if sub.first_t), default=0)
    last = max((sub.last_recv for sub in healthy), default=0)
    result["elapsed_s"] = (last - first_t) / 1e9 if first_t and last else None
    result["since_connect_s"] = (last - t_connect) / 1e9 if last else None
    replay_done = [sub.replay_complete_ns for sub in healthy if sub.replay_complete_ns]
    result["replay_complete_s"] = (max(replay_done) - t_connect) / 1e9 if replay_done else None
    latencies = sorted(value for sub in healthy for value in sub.lat)
    result["latency_ms"] = {
        "p50": _percentile(latencies, 0.50),
        "p99": _percentile(latencies, 0.99),
        "max": _percentile(latencies, 1.0),
        "count": len(latencies),
    }
    result["stalled_detail"] = [
        {
            "received": sub.unique,
            "max_seq": sub.max_seq,
            "terminal": sub.terminal,
            "dropped_after": sub.dropped_after,
            "warnings": sub.types.get("slow_client_warning", 0),
        }
        for sub in stalled_subs
    ]


def main(argv: list[str] | None = None) -> None:
    """Spec keys: ``port`` (or ``ports``: subscribers spread round-robin), ``path``,
    ``headers`` ([[name, value]]), ``streams`` ([[path, token]]: subscriber i reads stream
    i modulo their count, instead of ``path`` and ``headers``), ``transport`` (``h1``,
    ``h1-tls``, ``h2``), ``mode`` (``stream``,
    ``idle``), ``subscribers``, ``stalled`` (how many of them never read until the end),
    ``n`` (events expected), ``trigger`` (a POST target fired once all are connected),
    ``trigger_argv`` (a command that publishes instead), ``trigger_port``, ``trigger_tls``,
    ``id_format`` (``nchan``: check its ids), ``accept_encoding`` (sent as
    ``Accept-Encoding``; a gzipped answer is decoded), ``last_event_id``, ``timeout_s``,
    ``stall_drain_s``, ``connect_concurrency``."""
    args = sys.argv[1:] if argv is None else argv
    if args[0].startswith("@"):  # a spec file of bench.measure.spawn_loadgen: read, remove
        spec_file = Path(args[0][1:])
        spec = json.loads(spec_file.read_text())
        spec_file.unlink()
    else:
        spec = json.loads(args[0])
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 10,000 idle streams
    result = asyncio.run(run(spec))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
