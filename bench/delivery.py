"""Scenario 9: a fast reader of a 20,000-event burst is never evicted (issue 23, EB-3/EB-4).

One subscriber with the default ``maxQueued`` (256) reads with the load generator (raw
sockets, faster than any contender writes); as soon as its stream's headers arrived the
server publishes 20,000 events of 200 B on its own loop, yielding after each
(``rate=0&batch=1``). Each contender runs it ``REPS`` times, alternated; the table counts
the runs with a warning or an eviction (the Done-when: 0 of 10 under the production entry
point) and gives events/s and server CPU per delivery (µs, the whole process tree).
"""

from __future__ import annotations

from typing import Any

from bench.measure import (
    correctness,
    fmt,
    med,
    merge_correctness,
    rotations,
    run_loadgen,
    spread,
    stream_spec,
)
from bench.plan import BenchContext
from bench.servers import EVENTSTREAM, NCHAN

REPS = 10
EVENTS = 20_000


def fast_reader_burst(bench: BenchContext, reps: int = REPS, events: int = EVENTS) -> None:
    """Run scenario 9 on every contender but django-eventstream and Nchan; append its table."""
    bench.log(f"S9 fast reader of a {events:,}-event burst, {reps} runs each")
    names = tuple(name for name in bench.contenders if name not in (EVENTSTREAM, NCHAN))
    runs: dict[str, list[dict[str, Any]]] = {}
    for rep, name in rotations(names, reps):
        server = bench.servers[name]
        channel = server.new_channel()
        spec = stream_spec(server, channel, events, 1, "size=200&rate=0&batch=1")
        measured = run_loadgen(server, spec)
        result = measured.result
        runs.setdefault(name, []).append(
            {"rep": rep, **result, "server_cpu_s": measured.server_cpu_s}
        )
        bench.log(
            f"  rep {rep} {name}: evicted {result.get('evicted_subs')} "
            f"warnings {result.get('frame_types', {}).get('slow_client_warning', 0)} "
            f"{correctness(result)}"
        )
    rows = [
        "| contender | runs | runs with a warning | runs with an eviction | events/s, median "
        "(spread) | server CPU µs per delivery, median (spread) | lost / duplicated |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name in names:
        done = runs.get(name, [])
        warned = sum(1 for r in done if r.get("frame_types", {}).get("slow_client_warning"))
        evicted = sum(1 for r in done if r.get("evicted_subs"))
        rates = [events / r["elapsed_s"] if r.get("elapsed_s") else None for r in done]
        cpu = [r["server_cpu_s"] / events * 1e6 for r in done]
        rows.append(
            f"| {name} | {len(done)} | {warned} | {evicted} | {fmt(med(rates))} "
            f"({spread(rates)}) | {fmt(med(cpu))} ({spread(cpu)}) | "
            f"{merge_correctness([correctness(r) for r in done])} |"
        )
    bench.results["S9"] = runs
    bench.tables.append(
        f"### 9. A fast reader of a burst: {events:,} × 200 B, one subscriber, default "
        f"`maxQueued`\n\n{reps} alternated runs per contender; the burst starts once the "
        "stream's headers arrived and yields to the loop after each publish. A warning or "
        "an eviction here is the server's own latency blamed on a reader that keeps up "
        "(issue 23).\n\n" + "\n".join(rows) + "\n"
    )
