"""Scenarios 9 and 10 (issue 23). 9: a fast reader of a burst is never evicted (EB-3, EB-4).

One subscriber with the default ``maxQueued`` (256) reads with the load generator (raw
sockets, faster than any contender writes); as soon as its stream's headers arrived the
server publishes 20,000 events of 200 B on its own loop, yielding after each
(``rate=0&batch=1``). Each contender runs it ``REPS`` times, alternated; the table counts
the runs with a warning or an eviction (the Done-when: 0 of 10 under the production entry
point) and gives events/s and server CPU per delivery (µs, the whole process tree).
Scenario 10 (:func:`llm_shaped`): many sessions at an agent's pace (issue 23, item 6).
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
from bench.servers import EVENTSTREAM, NCHAN, QW_GRANIAN

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


def llm_shaped(
    bench: BenchContext, sessions: int = 2000, duration_s: float = 30.0, rate: float = 10.0
) -> None:
    """Run scenario 10 (LLM-shaped traffic) on each qwenweb contender; append its table.

    ``sessions`` sessions with 2 subscribers each; every session gets ``rate`` token chunks
    per second (40-120 B of JSON ``data``) published in-process, spread evenly over each
    period, for ``duration_s`` seconds. One load generator process reads all the streams.
    """
    per_session = int(rate * duration_s)
    bench.log(
        f"S10 LLM-shaped: {sessions:,} sessions x 2 subscribers, {rate:g}/s for {duration_s:g} s"
    )
    names = tuple(n for n in bench.contenders if n.startswith("qwenweb") and n != QW_GRANIAN)
    rows = [
        "| contender | deliveries | deliveries/s | publish → receive p50 / p99 / max (ms) | "
        "server CPU µs per delivery | server RSS before → peak (MiB) | publisher behind "
        "schedule, max (ms) | loadgen CPU busy | lost / duplicated / evicted |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    raw: dict[str, Any] = {}
    for name in names:
        server = bench.servers[name]
        created = server.call(f"/bench/sessions?n={sessions}&group=llm", timeout_s=300)
        spec = {
            "port": server.port,
            "streams": created["streams"],
            "subscribers": 2 * sessions,
            "n": per_session,
            "timeout_s": duration_s + 180,
            "settle_s": 20,
            "trigger": f"/bench/paced?group=llm&rate={rate:g}&duration_s={duration_s:g}"
            "&min=40&max=120",
            "trigger_port": server.control_port,
        }
        rss_before = server.rss_kib()
        measured = run_loadgen(server, spec, sample_every_s=1.0)
        result = measured.result
        delivered = result.get("delivered") or 0
        peak = max((rss for _, rss in measured.rss_series), default=rss_before)
        lat = result.get("latency_ms", {})
        trigger = result.get("trigger", {})
        raw[name] = {**result, "server_cpu_s": measured.server_cpu_s, "rss_before_kib": rss_before,
                     "rss_peak_kib": peak}  # fmt: skip
        rows.append(
            f"| {name} | {delivered:,} of {2 * sessions * per_session:,} | "
            f"{fmt(delivered / duration_s)} | {fmt(lat.get('p50'))} / {fmt(lat.get('p99'))} / "
            f"{fmt(lat.get('max'))} | "
            f"{fmt(measured.server_cpu_s / delivered * 1e6 if delivered else None)} | "
            f"{rss_before / 1024:.0f} → {peak / 1024:.0f} | {fmt(trigger.get('behind_max_ms'))} | "
            f"{fmt(100 * (result.get('client_busy') or 0), 2)} % | {correctness(result)} |"
        )
        bench.log(f"  {name}: {rows[-1]}")
    bench.results["S10"] = raw
    bench.tables.append(
        f"### 10. LLM-shaped: {sessions:,} sessions × 2 subscribers, {rate:g} token chunks/s "
        f"each (40–120 B), {duration_s:g} s\n\n"
        f"{2 * sessions * rate:,.0f} deliveries/s planned, published in-process on the "
        "server's loop, each session's events spread evenly over the period. Latency is "
        "publish (`monotonic_ns` in the event) to receipt by the load generator; server CPU "
        "covers the whole measurement (connecting the streams included) over the server's "
        "process tree.\n\n" + "\n".join(rows) + "\n"
    )
