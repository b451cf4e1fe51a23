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

import random
import time
from typing import Any

import orjson

from bench.common import make_data
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
from sessions.wire import encode_frame
from sessions.wire.compression import GzipStream

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


BROWSER_ACCEPT = "gzip, deflate, br, zstd"
"""What a browser's ``fetch`` sends: S10's gzip runs ask for it (EB-17)."""


def llm_shaped(
    bench: BenchContext,
    sessions: int = 2000,
    duration_s: float = 30.0,
    rate: float = 10.0,
    reps: int = 1,
) -> None:
    """Run scenario 10 (LLM-shaped traffic) on each qwenweb contender; append its table.

    ``sessions`` sessions with 2 subscribers each; every session gets ``rate`` token chunks
    per second (40-120 B of JSON ``data``) published in-process, spread evenly over each
    period, for ``duration_s`` seconds. One load generator process reads all the streams.
    Each contender runs ``reps`` times plain and ``reps`` times with a browser's
    ``Accept-Encoding`` (gzipped streams, issue 28), alternated, on new sessions each time;
    the summary gives what gzip adds to the server's CPU per delivery (the medians'
    difference, and each gzip run against the plain run before it).
    """
    per_session = int(rate * duration_s)
    bench.log(
        f"S10 LLM-shaped: {sessions:,} sessions x 2 subscribers, {rate:g}/s for {duration_s:g} s, "
        f"{reps} x plain and gzip"
    )
    names = tuple(n for n in bench.contenders if n.startswith("qwenweb") and n != QW_GRANIAN)
    rows = [
        "| contender | run | deliveries | deliveries/s | publish → receive p50 / p99 / max (ms) | "
        "server CPU µs per delivery | server RSS before → peak (MiB) | publisher behind "
        "schedule, max (ms) | loadgen CPU busy | lost / duplicated / evicted |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    raw: dict[str, Any] = {}
    summary: list[str] = []
    for name in names:
        server = bench.servers[name]
        cpu: dict[str, list[float]] = {"plain": [], "gzip": []}
        for rep in range(1, reps + 1):
            # ABBA: the server's CPU per delivery drifts over a run (sessions accumulate)
            for codec in ("plain", "gzip") if rep % 2 else ("gzip", "plain"):
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
                    **({"accept_encoding": BROWSER_ACCEPT} if codec == "gzip" else {}),
                }
                rss_before = server.rss_kib()
                measured = run_loadgen(server, spec, sample_every_s=1.0)
                result = measured.result
                delivered = result.get("delivered") or 0
                gzipped = result.get("gzipped_subs", 0)
                expected = 2 * sessions if codec == "gzip" else 0
                # A run whose streams did not all answer as asked (an overloaded server's
                # streams that never opened) says so and stays out of the medians.
                encoded = (
                    "" if gzipped == expected else f"; **{gzipped:,} of {expected:,} gzipped**"
                )
                per_delivery = measured.server_cpu_s / delivered * 1e6 if delivered else None
                if per_delivery is not None and not encoded:
                    cpu[codec].append(per_delivery)
                peak = max((rss for _, rss in measured.rss_series), default=rss_before)
                lat = result.get("latency_ms", {})
                trigger = result.get("trigger", {})
                run = {"codec": codec, "rep": rep, "server_cpu_s": measured.server_cpu_s}
                run.update(rss_before_kib=rss_before, rss_peak_kib=peak)
                raw.setdefault(name, []).append({**result, **run})
                rows.append(
                    f"| {name} | {codec} {rep} | {delivered:,} of {2 * sessions * per_session:,} | "
                    f"{fmt(delivered / duration_s)} | {fmt(lat.get('p50'))} / "
                    f"{fmt(lat.get('p99'))} / {fmt(lat.get('max'))} | {fmt(per_delivery)} | "
                    f"{rss_before / 1024:.0f} → {peak / 1024:.0f} | "
                    f"{fmt(trigger.get('behind_max_ms'))} | "
                    f"{fmt(100 * (result.get('client_busy') or 0), 2)} % | "
                    f"{correctness(result)}{encoded} |"
                )
                bench.log(f"  {name}: {rows[-1]}")
        pairs = [g - p for p, g in zip(cpu["plain"], cpu["gzip"], strict=False)]
        plain, gzip = med(cpu["plain"]), med(cpu["gzip"])
        if plain is not None and gzip is not None:
            summary.append(
                f"- {name}: server CPU per delivery, median plain {fmt(plain)} µs, gzip "
                f"{fmt(gzip)} µs (gzip ÷ plain {gzip / plain:.2f}); gzip adds "
                f"{fmt(gzip - plain)} µs (gzip minus plain of each repetition: "
                f"{', '.join(fmt(d) for d in pairs)} µs)"
            )
    frames, per_write = gzip_cost_us(sessions * 2, per_session)
    summary.append(
        f"- In this process, the same run: one `GzipStream` per stream ({2 * sessions} "
        f"streams × {per_session} frames of S10's shape, {frames:.0f} B on average, written "
        f"interleaved as the server writes them): {per_write:.2f} µs of CPU per write"
    )
    bench.results["S10"] = raw
    bench.tables.append(
        f"### 10. LLM-shaped: {sessions:,} sessions × 2 subscribers, {rate:g} token chunks/s "
        f"each (40–120 B), {duration_s:g} s\n\n"
        f"{2 * sessions * rate:,.0f} deliveries/s planned, published in-process on the "
        "server's loop, each session's events spread evenly over the period. Latency is "
        "publish (`monotonic_ns` in the event) to receipt by the load generator; server CPU "
        "covers the whole measurement (connecting the streams included) over the server's "
        "process tree. Runs alternate plain and gzip (`Accept-Encoding: "
        f"{BROWSER_ACCEPT}`, decoded by the load generator).\n\n"
        + "\n".join(rows)
        + "\n\n"
        + "\n".join(summary)
        + "\n"
    )


def gzip_cost_us(streams: int, per_stream: int) -> tuple[float, float]:
    """CPU of gzipping S10's frames in this process: ``(mean frame bytes, µs per write)``.

    One :class:`GzipStream` per stream, written round-robin (each stream's context goes
    cold between its writes, as on the server), a context released after the ``retry:``
    line as the server does; frames are what the server writes for S10's events (an
    envelope around 40-120 B of ``data``, the same seed).
    """
    rng = random.Random(23)
    pads: dict[int, str] = {}
    gzips = [GzipStream() for _ in range(streams)]
    for stream in gzips:
        stream.write(b"retry: 3000\n\n")
        stream.release()
    frames = []
    for seq in range(1, per_stream + 1):
        data = make_data(seq, rng.randint(40, 120), pads)
        envelope = {"id": seq, "v": 1, "type": "bench", "data": data,
                    "_meta": {"serverTimestamp": int(time.time() * 1000)}}  # fmt: skip
        body = encode_frame(event_type="bench", data_json=orjson.dumps(envelope), event_id=seq)
        frames.append(body)
    started = time.process_time()
    for frame in frames:
        for stream in gzips:
            stream.write(frame)
    spent = time.process_time() - started
    return sum(map(len, frames)) / len(frames), spent / (len(frames) * streams) * 1e6
