"""The durable backend against memory-only, in the same run (issue 24's Done-when).

    .venv/bin/python -m bench.durable --reps 3 --json bench-durable.json

Each repetition starts one ``python -m qwenweb.serve`` per backend (``durable``, the
default, and ``memory``) on a fresh database in a work directory on disk (not tmpfs: the
log's commits must reach a real file system), alternating which goes first, and measures:

- ``http_publish_per_s``: acknowledged ``POST /session/<id>/events`` per second, 32
  concurrent publishers (one keep-alive connection and one session each), ``--http-n``
  publishes in all;
- ``burst_per_s``: the in-process burst (``/bench/burst``, ``publish_nowait`` on the
  server's loop, ``--burst-n`` events of 200 bytes in batches of 500 per loop turn) as
  delivered to one subscriber: events ÷ (first to last receive);
- ``latency_ms``: publish-to-receive p50 / p99 at 1,000 events/s (``--latency-n`` events,
  one subscriber, stamped at publish on the server's clock);
- once per run (durable only): ``restart``: a log grown to ``--log-gib`` GiB (written
  directly with :class:`~sessions.backends.event_log.EventLog`, 10 KB events over 100
  sessions, plus one real session), then the time from spawning the server to its first
  answer and to the real session's snapshot; and a memory-only server's first answer on
  the same database (what starting a process costs anyway).

Ratios are durable ÷ memory per repetition, then their median. Every loop is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import loadgen
from bench.servers import PY, QW_SERVE, REPO, Server, collect_static, migrate_template

PUBLISHERS = 32
TIMEOUT_S = 120.0
QUOTAS = {"QWENWEB_PUBLISH_RATE_PER_S": "1000000", "QWENWEB_PUBLISH_BYTES_PER_S": str(1 << 40)}


async def _publisher(port: int, session: dict[str, Any], count: int) -> int:
    """POST ``count`` events over one keep-alive connection; how many got a 200."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    target = f"/session/{session['channel']}/events"
    body = b'{"type":"bench","data":{"pad":"' + b"x" * 150 + b'"}}'
    head = (
        f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {session['publish_token']}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    ok = 0
    try:
        for _ in range(count):
            writer.write(head + body)
            status_line = await reader.readline()
            length = 0
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b""):
                    break
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            await reader.readexactly(length)
            ok += status_line.split()[1:2] == [b"200"]
    finally:
        writer.close()
    return ok


async def http_publish(server: Server, total: int) -> dict[str, Any]:
    sessions = [server.new_channel() for _ in range(PUBLISHERS)]
    each = total // PUBLISHERS
    started = time.monotonic()
    oks = await asyncio.wait_for(
        asyncio.gather(*(_publisher(server.port, s, each) for s in sessions)), TIMEOUT_S
    )
    elapsed = time.monotonic() - started
    return {"acknowledged": sum(oks), "seconds": elapsed, "per_s": sum(oks) / elapsed}


async def stream_run(server: Server, n: int, query: str) -> dict[str, Any]:
    channel = server.new_channel()
    spec = {
        "port": server.port,
        "path": channel["path"],
        "headers": server.stream_headers(channel),
        "subscribers": 1,
        "n": n,
        "timeout_s": TIMEOUT_S,
        **server.trigger(channel, query),
    }
    return await loadgen.run(spec)


def _server(workdir: Path, template: Path, backend: str) -> Server:
    name_env = {"QWENWEB_BACKEND": backend, **QUOTAS}
    static = workdir / "static"
    return Server(
        QW_SERVE,
        workdir,
        template,
        extra_env=name_env,
        static_root=static if static.exists() else None,
    )


async def repetition(workdir: Path, template: Path, args: argparse.Namespace, rep: int) -> Any:
    order = ["durable", "memory"] if rep % 2 == 0 else ["memory", "durable"]
    out: dict[str, Any] = {}
    for backend in order:
        server = _server(workdir, template, backend).start()
        try:
            http = await http_publish(server, args.http_n)
            burst = await stream_run(server, args.burst_n, f"n={args.burst_n}&size=200&batch=500")
            latency = await stream_run(
                server, args.latency_n, f"n={args.latency_n}&size=200&rate=1000"
            )
        finally:
            server.stop()
        burst_s = burst.get("elapsed_s") or float("inf")
        out[backend] = {
            "http_publish_per_s": http["per_s"],
            "http_acknowledged": http["acknowledged"],
            "burst_per_s": args.burst_n / burst_s,
            "burst_complete": burst.get("complete_subs"),
            "burst_lost": burst.get("lost_silent"),
            "latency_ms": latency.get("latency_ms"),
            "latency_lost": latency.get("lost_silent"),
        }
        print(backend, json.dumps(out[backend]), flush=True)
    return out


def restart_time(workdir: Path, template: Path, log_gib: float) -> dict[str, Any]:
    """Grow a durable server's log to ``log_gib`` GiB, then time its restart."""
    server = _server(workdir, template, "durable").start()
    try:
        channel = server.new_channel()
        for _ in range(10):
            server.call(f"/bench/burst?channel={channel['channel']}&n=100&size=200&batch=100")
    finally:
        server.stop()
    db = workdir / f"{QW_SERVE}-{server.port}.sqlite3"
    log_path = Path(f"{db}.events.sqlite3")
    grow = [PY, "-m", "bench.durable", "--grow", str(log_path), "--log-gib", str(log_gib)]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "qwenweb.settings"}
    subprocess.run(grow, cwd=REPO, env=env, check=True, timeout=1800)
    size = sum(p.stat().st_size for p in log_path.parent.glob(log_path.name + "*"))
    server.shared_db = db  # the same database and log
    baseline = _server(workdir, template, "memory")
    baseline.shared_db = db
    durable: list[tuple[float, float]] = []
    memory: list[float] = []
    events = 0
    for _ in range(3):  # alternating, on the same files
        spawned = time.monotonic()
        server.start()
        answered = time.monotonic() - spawned
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/session/{channel['channel']}?limit=5000",
            headers={"Authorization": f"Bearer {channel['token']}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                events = len(json.loads(response.read())["events"])
            durable.append((answered, time.monotonic() - spawned))
        finally:
            server.stop()
        spawned = time.monotonic()
        baseline.start()
        memory.append(time.monotonic() - spawned)
        baseline.stop()
    return {
        "log_bytes": size,
        "first_answer_s": [round(a, 3) for a, _ in durable],
        "snapshot_s": [round(b, 3) for _, b in durable],
        "snapshot_events": events,
        "memory_first_answer_s": [round(m, 3) for m in memory],
    }


def _db_bytes(path: Path) -> int:
    return path.stat().st_size


def grow(path: Path, log_gib: float) -> None:
    """Append 10 KB events over 100 sessions to the log at ``path`` until it holds
    ``log_gib`` GiB (run in a process of its own, with Django set up for the imports)."""
    import django

    django.setup()
    from sessions.backends.event_log import Append, EventLog, OpenSession

    async def fill() -> None:
        log = EventLog(path, asyncio.get_running_loop())
        log.open()
        body = b'{"v":1,"type":"bench","data":"' + b"x" * 10_000 + b'"}'
        sessions = [f"bench-fill-{n}" for n in range(100)]
        next_ids = {}
        for session in sessions:
            opened = await log.submit(OpenSession(session, 1, 8000, 1 << 30, 1, 1.0))
            next_ids[session] = opened.next_id
        target = int(log_gib * (1 << 30))
        while _db_bytes(path) < target:  # (the database file: the WAL repeats pages)
            futures = []
            for session in sessions:
                for _ in range(10):
                    futures.append(log.submit(Append(session, next_ids[session], "bench", body)))
                    next_ids[session] += 1
            await asyncio.gather(*futures)
        log.close()

    asyncio.run(fill())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--http-n", type=int, default=6400)
    parser.add_argument("--burst-n", type=int, default=5000)
    parser.add_argument("--latency-n", type=int, default=3000)
    parser.add_argument("--log-gib", type=float, default=1.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--grow", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.grow:
        grow(args.grow, args.log_gib)
        return
    with tempfile.TemporaryDirectory(prefix="qwenweb-bench-durable-", dir="/var/tmp") as tmp:
        workdir = Path(tmp)
        template = migrate_template(workdir)
        collect_static(workdir)
        reps = [asyncio.run(repetition(workdir, template, args, rep)) for rep in range(args.reps)]
        restart = restart_time(workdir, template, args.log_gib) if args.log_gib > 0 else None
    summary = _summary(reps) if reps else {}
    summary["restart"] = restart
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"reps": reps, "summary": summary}, indent=2))


def _summary(reps: list[dict[str, Any]]) -> dict[str, Any]:
    def ratios(key: str, sub: str | None = None) -> list[float]:
        values = []
        for rep in reps:
            durable, memory = rep["durable"][key], rep["memory"][key]
            if sub is not None:
                durable, memory = durable[sub], memory[sub]
            values.append(durable / memory)
        return values

    def median_of(backend: str, key: str, sub: str) -> float:
        return statistics.median(rep[backend][key][sub] for rep in reps)

    out: dict[str, Any] = {}
    for key, target in (("http_publish_per_s", 0.8), ("burst_per_s", 0.3)):
        values = ratios(key)
        out[key] = {
            "durable": statistics.median(rep["durable"][key] for rep in reps),
            "memory": statistics.median(rep["memory"][key] for rep in reps),
            "ratio_per_rep": [round(v, 3) for v in values],
            "median_ratio": round(statistics.median(values), 3),
            "target": f">= {target}",
        }
    p50 = (median_of("durable", "latency_ms", "p50"), median_of("memory", "latency_ms", "p50"))
    p99 = (median_of("durable", "latency_ms", "p99"), median_of("memory", "latency_ms", "p99"))
    out["latency_ms"] = {
        "p50": {"durable": p50[0], "memory": p50[1], "target": "durable <= memory + 1 ms"},
        "p99": {"durable": p99[0], "memory": p99[1], "target": "durable <= 2 x memory"},
    }
    return out


if __name__ == "__main__":
    main()
