"""Scale-out: delivery throughput of 1 vs 2 server processes sharing sessions via Redis.

``python -m bench.scaleout [--quick] [--reps N] [--subscribers S] [--events N]``
prints a markdown table. Contenders, alternated per repetition on the same machine:

- ``memory ×1``: one ``python -m qwenweb.serve`` with the in-memory bus (the baseline);
- ``redis ×1``: one process with the Redis backend (what Redis costs);
- ``redis ×2``: two processes with the Redis backend, the subscribers split evenly
  between them (what a second process buys).

Workload: ``S`` subscribers of one session (spread round-robin over the processes by one
load-generator process, ``bench.loadgen`` with ``ports``), then ``N`` events of 200 B
published as fast as the server takes them through the in-process burst route of the
first process (``/bench/burst``; under Redis each publish is one round-trip). Throughput
is deliveries per second (events × subscribers) from the first event received to the
last; lost and duplicated events are counted per subscriber and printed loudly.

Everything binds to 127.0.0.1; Redis is the machine's (``$QWENWEB_TEST_REDIS_URL``,
default ``redis://127.0.0.1:6379/0``) under a key prefix of this run, deleted at the end.
Machines here have 2 cores shared by the servers, Redis and the load generator: read the
ratio as what this machine gives, not as a law.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from bench.measure import (
    correctness,
    fmt,
    med,
    merge_correctness,
    paired,
    ratio_cell,
    rotations,
    run_loadgen,
    spread,
)
from bench.servers import QW_SERVE, Server, collect_static, migrate_template

REDIS_URL = os.environ.get("QWENWEB_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
MEMORY_1 = "memory ×1"
REDIS_1 = "redis ×1"
REDIS_2 = "redis ×2"
CONTENDERS = (MEMORY_1, REDIS_1, REDIS_2)


@contextmanager
def deployment(name: str, workdir: Path, template: Path, prefix: str) -> Iterator[list[Server]]:
    """Start the contender's processes (one shared database each deployment); stop them."""
    processes = 2 if name == REDIS_2 else 1
    env = {"QWENWEB_MAX_SUBSCRIBERS": "2000"}
    if name != MEMORY_1:
        env |= {
            "QWENWEB_BACKEND": "redis",
            "QWENWEB_REDIS_URL": REDIS_URL,
            "QWENWEB_REDIS_KEY_PREFIX": prefix,
        }
    database = workdir / f"{prefix}-{name.split()[0]}-{processes}.sqlite3"
    database.write_bytes(template.read_bytes())
    servers = [
        Server(QW_SERVE, workdir, template, extra_env=env, shared_db=database)
        for _ in range(processes)
    ]
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()


def measure(servers: list[Server], subscribers: int, n: int) -> tuple[dict[str, Any], float]:
    """One burst of ``n`` events to ``subscribers`` spread over ``servers``.

    Returns the load generator's result and the servers' CPU seconds.
    """
    first = servers[0]
    channel = first.new_channel()
    spec = {
        "ports": [server.port for server in servers],
        "path": channel["path"],
        "headers": first.stream_headers(channel),
        "subscribers": subscribers,
        "n": n,
        "trigger": f"/bench/burst?channel={channel['channel']}&n={n}&size=200&rate=0",
        "timeout_s": 120,
        "settle_s": 60,
    }
    cpu_before = [server.cpu_s() for server in servers]
    measured = run_loadgen(first, spec)
    cpu = sum(server.cpu_s() - before for server, before in zip(servers, cpu_before, strict=True))
    return measured.result, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer events and repetitions")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--subscribers", type=int, default=200)
    parser.add_argument("--events", type=int, default=None)
    args = parser.parse_args(argv)
    reps = args.reps or (2 if args.quick else 3)
    n = args.events or (500 if args.quick else 2000)
    subscribers = args.subscribers
    prefix = f"qwbench-{secrets.token_hex(4)}"
    per_rep: dict[str, dict[int, float | None]] = {}
    cpu: dict[str, list[float]] = {}
    cells: dict[str, list[str]] = {}
    busy: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="qwenweb-scaleout-") as tmp:
        workdir = Path(tmp)
        template = migrate_template(workdir)
        static = collect_static(workdir)  # the servers inherit this process's environment
        if static is not None:
            os.environ["DJANGO_STATIC_ROOT"] = str(static)
        try:
            for rep, name in rotations(CONTENDERS, reps):
                with deployment(name, workdir, template, prefix) as servers:
                    result, server_cpu = measure(servers, subscribers, n)
                elapsed = result.get("elapsed_s")
                rate = n * subscribers / elapsed if elapsed else None
                per_rep.setdefault(name, {})[rep] = rate
                cpu.setdefault(name, []).append(server_cpu / (n * subscribers) * 1e6)
                busy.setdefault(name, []).append(result.get("client_busy", 0))
                cells.setdefault(name, []).append(correctness(result))
                print(
                    f"rep {rep} {name}: {fmt(rate)} deliveries/s {cells[name][-1]}",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            _delete_prefix(prefix)
    rows = [
        f"### Scale-out: {subscribers} subscribers, {n:,} events of 200 B, 1 vs 2 processes",
        "",
        f"{reps} alternated repetitions; subscribers split evenly over the processes; "
        "ratios paired per repetition.",
        "",
        "| contender | deliveries/s, median | spread | × memory ×1 | × redis ×1 | "
        "server CPU µs per delivery (all processes) | loadgen CPU busy | lost / duplicated |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name in CONTENDERS:
        values = list(per_rep[name].values())
        rows.append(
            f"| {name} | {fmt(med(values))} | {spread(values)} | "
            f"{ratio_cell(paired(per_rep, name, MEMORY_1))} | "
            f"{ratio_cell(paired(per_rep, name, REDIS_1))} | {fmt(med(cpu[name]))} | "
            f"{fmt(100 * (med(busy[name]) or 0), 2)} % | {merge_correctness(cells[name])} |"
        )
    print("\n".join(rows))
    return 0


def _delete_prefix(prefix: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


if __name__ == "__main__":
    raise SystemExit(main())
