"""Scenario 5: idle memory per stream at 1,000 and 10,000 streams (full run).

Each repetition restarts the server (RSS deltas are then its own), opens 8 streams to warm
it up, samples the RSS and threads of its process tree, opens the given number of idle
streams on one session, samples again, then closes them. Every wait is bounded (the load
generator gets 60 s + count / 50 to open its streams).
"""

from __future__ import annotations

import json
import time
from typing import Any

from bench.measure import fmt, med, readline_bounded, rotations, spawn_loadgen, spread
from bench.plan import BenchContext
from bench.servers import FLOOR, Server


def idle_memory(bench: BenchContext) -> None:
    """Run scenario 5 at each of the plan's stream counts; append its table."""
    bench.log("S5 idle memory")
    counts = bench.plan.idle_counts
    per_sub: dict[int, dict[str, list[float]]] = {}
    threads: dict[int, dict[str, list[float]]] = {}
    opened: dict[int, dict[str, list[int]]] = {}
    raw: dict[str, list[Any]] = {}
    for count in counts:
        for rep, name in rotations(bench.contenders, bench.plan.idle_reps):
            server = bench.servers[name].start()  # a fresh process: RSS deltas are its own
            channel = server.new_channel()
            warm = _hold_idle(server, _idle_spec(server, channel, 8))
            time.sleep(0.5)
            rss0, threads0 = server.rss_kib(), server.threads()
            rss1, threads1, ready = _hold_idle(server, _idle_spec(server, channel, count))
            per_sub.setdefault(count, {}).setdefault(name, []).append((rss1 - rss0) / max(1, ready))
            threads.setdefault(count, {}).setdefault(name, []).append(threads1 - threads0)
            opened.setdefault(count, {}).setdefault(name, []).append(ready)
            raw.setdefault(name, []).append(
                {"rep": rep, "streams": count, "rss0_kib": rss0, "rss1_kib": rss1,
                 "threads0": threads0, "threads1": threads1, "ready": ready,
                 "warmup_ready": warm[2], "processes": server.processes()}
            )  # fmt: skip
            bench.log(f"  {count} streams, rep {rep} {name}: {ready} open, "
                     f"{fmt(per_sub[count][name][-1])} KiB/sub, "
                     f"threads {threads0}->{threads1}")  # fmt: skip
    head = "| contender |"
    rule = "| --- |"
    for count in counts:
        head += f" {count:,}: streams open | KiB per idle stream, median | spread | × floor |"
        rule += " ---: | ---: | ---: | ---: |"
    rows = [head + " OS threads added |", rule + " ---: |"]
    for name in bench.contenders:
        row = f"| {name} |"
        for count in counts:
            values = per_sub[count][name]
            value, floor = med(values), med(per_sub[count][FLOOR])
            ratio = value / floor if value and floor else None
            row += (
                f" {min(opened[count][name]):,} | {fmt(value)} | {spread(values)} | {fmt(ratio)}× |"
            )
        row += f" {fmt(med(threads[counts[-1]][name]))} |"
        rows.append(row)
    bench.results["S5"] = {
        "per_sub_kib": {str(c): v for c, v in per_sub.items()},
        "threads_added": {str(c): v for c, v in threads.items()},
        "runs": raw,
    }
    bench.tables.append(
        f"### 5. Idle memory: {' and '.join(f'{c:,}' for c in counts)} idle streams\n\n"
        "Each repetition restarts the server, opens 8 streams to warm it up, then "
        "the given number more on one session (qwenweb's per-session limit is raised "
        "with `QWENWEB_MAX_SUBSCRIBERS` for this), and divides the growth of the RSS "
        "summed over the server's process tree by the streams open (the file-descriptor "
        "limit of the servers and of the load generator is raised to its hard limit). "
        f"{bench.plan.idle_reps} repetitions; threads added at the largest count.\n\n"
        + "\n".join(rows)
        + "\n"
    )


def _idle_spec(server: Server, channel: dict[str, Any], count: int) -> dict[str, Any]:
    return {
        "mode": "idle",
        "path": channel["path"],
        "headers": server.stream_headers(channel),
        "subscribers": count,
        "timeout_s": 60 + count / 50,  # 260 s for 10,000 streams
    }


def _hold_idle(server: Server, spec: dict[str, Any]) -> tuple[int, int, int]:
    """Open the idle streams, wait until RSS settles, sample, then close them."""
    process = spawn_loadgen({"port": server.port, **spec}, interactive=True)
    assert process.stdin is not None
    assert process.stdout is not None
    ready = 0
    try:
        line = readline_bounded(process, float(spec["timeout_s"]) + 30)
        ready = int(json.loads(line).get("ready", 0)) if line else 0
        time.sleep(1.0)  # let the server finish what the last connections started
        rss, threads = server.rss_kib(), server.threads()
        process.stdin.write(b"close\n")
        process.stdin.flush()
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    return rss, threads, ready
