"""Cross-check the bench's CPU per delivery with an outside measurement (issue 23).

``python -m bench.crosscheck [--subscribers 64] [--events 2000] [--reps 3]`` starts
``python -m qwenweb.serve`` (the bench routes on) and alternates, repetition by repetition:

- **bench**: the load generator (``bench.loadgen``) as scenario 3 runs it, server CPU from
  :meth:`bench.servers.Server.cpu_s`, divided by the events the subscribers really got;
- **outside**: ``subscribers`` independent ``curl -N`` processes writing the stream to
  files, the server's CPU read here from ``/proc`` over its whole process tree (every
  process below it, found through ``/proc/<pid>/task/<tid>/children``: code of its own,
  not the bench's), from just before the burst until every file holds its ``n`` events
  (``id:`` lines counted), divided by the events counted.

It prints one markdown table: µs of server CPU per delivery by each method and their ratio.
Every wait is bounded; only the processes started here are stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.measure import fmt, run_loadgen, stream_spec
from bench.servers import QW_SERVE, Server, collect_static, migrate_template

ID_LINE = re.compile(rb"(?m)^id: ")
TICKS = os.sysconf("SC_CLK_TCK")


def process_tree(root: int) -> list[int]:
    """``root`` and its descendants, through the kernel's per-thread ``children`` lists."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                text = Path(f"/proc/{pid}/task/{task}/children").read_text()
                todo.extend(int(child) for child in text.split())
        except OSError:
            continue  # gone meanwhile
    return found


def tree_cpu_s(root: int) -> float:
    """User + system CPU seconds of every live process in ``root``'s tree (all threads)."""
    total = 0
    for pid in process_tree(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (stat fields 14, 15)
    return total / TICKS


def subscriber_count(server: Server, channel: dict[str, Any]) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/session/{channel['channel']}",
        headers={"Authorization": f"Bearer {channel['token']}", "Accept": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(json.loads(response.read())["subscriberCount"])


def outside(server: Server, subscribers: int, events: int, workdir: Path) -> dict[str, Any]:
    """One repetition with ``curl -N`` readers; returns CPU, deliveries and µs per delivery."""
    assert server.process is not None
    curl = shutil.which("curl")
    if curl is None:
        raise SystemExit("curl is not installed")
    channel = server.new_channel()
    url = f"http://127.0.0.1:{server.port}{channel['path']}"
    files = [workdir / f"curl-{index}.out" for index in range(subscribers)]
    auth = f"Authorization: Bearer {channel['token']}"
    argv = [curl, "-N", "-sS", "--max-time", "120", "-H", "Accept: text/event-stream", "-H", auth]
    readers = [
        subprocess.Popen([*argv, "-o", str(path), url], stderr=subprocess.DEVNULL) for path in files
    ]
    try:
        deadline = time.monotonic() + 30
        while subscriber_count(server, channel) < subscribers:
            if time.monotonic() > deadline:
                raise RuntimeError("curl readers did not all connect within 30 s")
            time.sleep(0.05)
        cpu_before = tree_cpu_s(server.process.pid)
        started = time.monotonic()
        server.publish_now(channel, f"n={events}&size=200&rate=0")
        counts = [0] * subscribers
        deadline = time.monotonic() + 120
        while sum(counts) < events * subscribers and time.monotonic() < deadline:
            time.sleep(0.02)
            counts = [len(ID_LINE.findall(path.read_bytes())) for path in files]
        cpu = tree_cpu_s(server.process.pid) - cpu_before
        elapsed = time.monotonic() - started
    finally:
        for reader in readers:
            reader.terminate()
        for reader in readers:
            reader.wait(10)
    delivered = sum(counts)
    return {
        "cpu_s": cpu,
        "delivered": delivered,
        "elapsed_s": elapsed,
        "us_per_delivery": cpu / delivered * 1e6 if delivered else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.crosscheck")
    parser.add_argument("--subscribers", type=int, default=64)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="qwenweb-crosscheck-") as tmp:
        workdir = Path(tmp)
        server = Server(
            QW_SERVE, workdir, migrate_template(workdir), static_root=collect_static(workdir)
        ).start()
        rows = []
        try:
            for rep in range(args.reps):
                channel = server.new_channel()
                spec = stream_spec(
                    server, channel, args.events, args.subscribers, "size=200&rate=0"
                )
                measured = run_loadgen(server, spec)
                delivered = measured.result.get("delivered") or 0
                ours = measured.server_cpu_s / delivered * 1e6 if delivered else None
                theirs = outside(server, args.subscribers, args.events, workdir)
                rows.append((rep, ours, delivered, theirs))
                print(f"rep {rep}: bench {fmt(ours)} µs, curl {fmt(theirs['us_per_delivery'])} µs",
                      file=sys.stderr, flush=True)  # fmt: skip
        finally:
            server.stop()
    load = os.getloadavg()[0]
    print(
        f"{args.subscribers} subscribers × {args.events:,} events of 200 B, load average "
        f"{load:.2f} at the end\n\n| repetition | bench: µs per delivery (deliveries) | "
        "curl -N + /proc: µs per delivery (deliveries) | curl ÷ bench |\n| ---: | ---: | ---: "
        "| ---: |"
    )
    for rep, ours, delivered, theirs in rows:
        ratio = theirs["us_per_delivery"] / ours if ours and theirs["us_per_delivery"] else None
        print(
            f"| {rep} | {fmt(ours)} ({delivered:,}) | {fmt(theirs['us_per_delivery'])} "
            f"({theirs['delivered']:,}) | {fmt(ratio)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
