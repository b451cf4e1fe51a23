"""Run every benchmark scenario and print markdown tables; ``--json`` writes the same data.

``python -m bench.run [--quick] [--json out.json] [--only S2,S4] [--reps N]
[--baseline-tree PATH]``

Contenders: see :mod:`bench.servers` (``qwenweb-serve``, ``qwenweb-granian``,
``qwenweb-daphne``, ``qwenweb-uvicorn``, ``eventstream``, ``nchan``, ``floor``, and
``qwenweb-serve@baseline`` with ``--baseline-tree PATH``: ``python -m qwenweb.serve`` run
from another checkout, so a change is measured against the code before it in the same
run). ``--contenders a,b`` runs a subset (``floor`` is always in: the ratios need it).
The qwenweb contenders run the unchanged ``qwenweb.asgi`` application with
``DJANGO_SETTINGS_MODULE=bench.qwenweb_bench_settings`` (adds ``/bench/*`` routes).
Every measurement is a load generator process (``bench.loadgen``); contenders are
alternated (rotating order, several repetitions) and every comparison is a ratio of two
measurements taken in the same repetition of the same run. Every loop is bounded in count
and time; a measurement that times out is reported, never waited for.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import nchan
from bench.delivery import fast_reader_burst, llm_shaped
from bench.h2bench import http2_fanout
from bench.idle import idle_memory
from bench.measure import (
    correctness,
    cpu_ratio,
    fate,
    fmt,
    max_over_min,
    med,
    median_ratio_line,
    merge_correctness,
    paired,
    ratio_cell,
    rotations,
    run_loadgen,
    spread,
    stream_spec,
)
from bench.plan import Plan
from bench.servers import (
    CONTENDERS,
    EVENTSTREAM,
    FLOOR,
    NCHAN,
    PY,
    QW_BASELINE,
    QW_GRANIAN,
    QW_SERVE,
    REPO,
    Server,
    collect_static,
    migrate_template,
    raise_nofile,
)

# Scenario 7's events: big enough that a stalled reader's kernel buffers (a few MiB on
# loopback) fill within the run, so the server's own policy is what is measured.
SLOW_EVENT_BYTES = 4096


# -- scenarios --------------------------------------------------------------------------


class Bench:
    """Owns the servers and runs the scenarios; collects results and markdown tables."""

    def __init__(
        self,
        plan: Plan,
        workdir: Path,
        log: Callable[[str], None],
        baseline_tree: Path | None = None,
        contenders: tuple[str, ...] = CONTENDERS,
    ) -> None:
        self.plan = plan
        self.workdir = workdir
        self.log = log
        self.template = migrate_template(workdir)
        self.contenders = contenders + ((QW_BASELINE,) if baseline_tree else ())
        if NCHAN in self.contenders:
            nchan.ensure_installed(log)
        self.static_root = collect_static(workdir)
        self.servers = {
            name: Server(name, workdir, self.template, static_root=self.static_root)
            for name in self.contenders
        }
        if baseline_tree is not None:
            baseline = self.servers[QW_BASELINE]
            baseline.tree = baseline_tree
            baseline.template_db = migrate_template(workdir, baseline_tree, "baseline")
            baseline.static_root = collect_static(workdir, baseline_tree, "baseline-static")
        self.results: dict[str, Any] = {}
        self.tables: list[str] = []

    def start_all(self) -> None:
        for server in self.servers.values():
            server.start()

    def stop_all(self) -> None:
        for server in self.servers.values():
            server.stop()

    def n_for(self, name: str, n: int, n_es: int) -> int:
        return n_es if name == EVENTSTREAM else n

    # S1 ------------------------------------------------------------------------------

    def s1_inprocess(self, quick: bool) -> None:
        self.log("S1 in-process publish cost")
        argv = [PY, "-m", "bench.inprocess", *(["--quick"] if quick else [])]
        done = subprocess.run(argv, cwd=REPO, capture_output=True, timeout=300, check=False)
        if done.returncode != 0:
            self.results["S1"] = {"error": done.stderr.decode(errors="replace")[-1500:]}
            self.tables.append("### 1. In-process publish cost\n\n**failed**\n")
            return
        data = json.loads(done.stdout.decode().strip().splitlines()[-1])
        self.results["S1"] = data
        rows = [
            "| subscribers | ring size (full) | µs per publish, median | spread | "
            "× 0 subscribers, ring 8000 |",
            "| ---: | ---: | ---: | ---: | ---: |",
        ]
        cost = data["publish_cost"]["rows"]
        base = next(r for r in cost if r["subscribers"] == 0 and r["ring_size"] == 8000)
        for row in cost:
            rows.append(
                f"| {row['subscribers']} | {row['ring_size']:,} | {fmt(row['us_per_publish'])} | "
                f"{fmt(row['min'])}–{fmt(row['max'])} | "
                f"{row['us_per_publish'] / base['us_per_publish']:.2f}× |"
            )
        rows += [
            "",
            "| subscribers | JSON serializations per event | of which in the writer | "
            "SSE framing copies per event |",
            "| ---: | ---: | ---: | ---: |",
        ]
        for row in data["serializations"]:
            rows.append(
                f"| {row['subscribers']} | {row['json_serializations_per_event']:g} | "
                f"{row['writer_dumps']} | {row['encode_frame_per_event']:g} |"
            )
        memory = data["ring_memory"]
        rows += [
            "",
            "| ring events (200 B, full ring) | bytes kept per event | serialized JSON per "
            "event | memory one serialized JSON occupies |",
            "| ---: | ---: | ---: | ---: |",
            f"| {memory['events']:,} | {memory['bytes_per_event']:,.0f} | "
            f"{memory['json_bytes_mean']:,.0f} | {memory['json_allocated_bytes']:,.0f} |",
        ]
        per_rep = data["publish_cost"]["timed_events_per_rep"]
        reps = data["publish_cost"]["reps"]
        self.tables.append(
            "### 1. In-process: publish cost and serializations\n\n"
            f"{reps} alternated repetitions of {per_rep:,} timed publishes of 200 B events; "
            "each ring is full, so every publish also drops the ring's oldest event.\n\n"
            + "\n".join(rows)
            + "\n"
        )

    # S2, S3 --------------------------------------------------------------------------

    def throughput(self, key: str, title: str, subscribers: int, n: int, n_es: int) -> None:
        self.log(f"{key} {title}")
        per_rep: dict[str, dict[int, float | None]] = {}
        cpu: dict[str, list[float | None]] = {}
        cells: dict[str, list[str]] = {}
        raw: dict[str, list[Any]] = {}
        client_cpu: dict[str, list[float]] = {}
        cpu_per_rep: dict[str, dict[int, float | None]] = {}
        for rep, name in rotations(self.contenders, self.plan.reps):
            server = self.servers[name]
            count = self.n_for(name, n, n_es)
            channel = server.new_channel()
            measured = run_loadgen(
                server, stream_spec(server, channel, count, subscribers, "size=200&rate=0")
            )
            result = measured.result
            elapsed = result.get("elapsed_s")
            delivered = result.get("delivered", 0)
            rate = delivered / elapsed if elapsed else None
            per_rep.setdefault(name, {})[rep] = rate
            cpu_us = measured.server_cpu_s / delivered * 1e6 if delivered else None
            cpu.setdefault(name, []).append(cpu_us)
            cpu_per_rep.setdefault(name, {})[rep] = cpu_us
            client_cpu.setdefault(name, []).append(result.get("client_busy", 0))
            cells.setdefault(name, []).append(correctness(result))
            raw.setdefault(name, []).append(
                {"rep": rep, **result, "server_cpu_s": measured.server_cpu_s}
            )
            self.log(f"  rep {rep} {name}: {fmt(rate)} deliveries/s {cells[name][-1]}")
        unit = "events/s" if subscribers == 1 else "deliveries/s (events × subscribers)"
        rows = [
            f"| contender | events × subscribers | {unit}, median | spread | × floor | "
            "× django-eventstream | server CPU µs per delivery | CPU spread (max ÷ min) | "
            "× floor by CPU | loadgen CPU busy | lost / duplicated |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        floor_cpu = med(cpu[FLOOR])
        for name in self.contenders:
            values = list(per_rep[name].values())
            count = self.n_for(name, n, n_es)
            rows.append(
                f"| {name} | {count:,} × {subscribers} | {fmt(med(values))} | {spread(values)} | "
                f"{ratio_cell(paired(per_rep, name, FLOOR))} | "
                f"{ratio_cell(paired(per_rep, name, EVENTSTREAM))} | {fmt(med(cpu[name]))} | "
                f"{spread(cpu[name])} ({max_over_min(cpu[name])}) | "
                f"{cpu_ratio(floor_cpu, med(cpu[name]))} | "
                f"{fmt(100 * (med(client_cpu[name]) or 0), 2)} % | "
                f"{merge_correctness(cells[name])} |"
            )
        targets = {1: 1.5, 64: 0.9}  # issue 12's Done-when (quick run, 3 repetitions)
        checks = [
            median_ratio_line(name, FLOOR, paired(per_rep, name, FLOOR), targets.get(subscribers))
            for name in (QW_SERVE, QW_GRANIAN, NCHAN)
            if name in self.contenders
        ]
        if NCHAN in self.contenders:
            checks += [
                median_ratio_line(name, NCHAN, paired(per_rep, name, NCHAN))
                for name in (QW_SERVE, QW_GRANIAN)
                if name in self.contenders
            ]
        for line in checks:
            self.log(f"  {key} {line}")
        baseline = "\n" + "\n\n".join(checks) + "\n" if checks else ""
        if QW_BASELINE in self.contenders:
            by_cpu = paired(cpu_per_rep, QW_SERVE, QW_BASELINE)
            by_rate = paired(per_rep, QW_SERVE, QW_BASELINE)
            baseline += (
                f"\n`{QW_SERVE}` against `{QW_BASELINE}` (the same server from the baseline "
                f"checkout), per repetition: CPU per delivery {ratio_cell(by_cpu)}, "
                f"deliveries/s {ratio_cell(by_rate)}.\n"
            )
        self.results[key] = {"per_rep": per_rep, "cpu_per_rep": cpu_per_rep, "runs": raw}
        self.tables.append(
            f"### {title}\n\n{self.plan.reps} alternated repetitions, 200 B events published "
            "as fast as possible (one per event-loop turn). django-eventstream publishes "
            f"fewer events ({n_es:,}): each `send_event` is a database write, so its rate is "
            "the rate of that write.\n\n" + "\n".join(rows) + "\n" + baseline
        )

    # S4 ------------------------------------------------------------------------------

    def latency(self) -> None:
        self.log("S4 latency")
        duration = self.plan.latency_s
        n = int(200 * duration)
        p50: dict[str, dict[int, float | None]] = {}
        p99: dict[str, dict[int, float | None]] = {}
        cells: dict[str, list[str]] = {}
        raw: dict[str, list[Any]] = {}
        for rep, name in rotations(self.contenders, self.plan.reps):
            server = self.servers[name]
            channel = server.new_channel()
            spec = stream_spec(server, channel, n, 64, "size=200&rate=200")
            spec["timeout_s"] = duration + 60
            result = run_loadgen(server, spec).result
            latency = result.get("latency_ms", {})
            p50.setdefault(name, {})[rep] = latency.get("p50")
            p99.setdefault(name, {})[rep] = latency.get("p99")
            cells.setdefault(name, []).append(correctness(result))
            raw.setdefault(name, []).append({"rep": rep, **result})
            self.log(f"  rep {rep} {name}: p50 {fmt(latency.get('p50'))} ms p99 "
                     f"{fmt(latency.get('p99'))} ms {cells[name][-1]}")  # fmt: skip
        rows = [
            "| contender | p50 ms, median | p99 ms, median | p99 spread | p99 × floor | "
            "p50 × floor | publish rate reached | lost / duplicated |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for name in self.contenders:
            reached = [
                r["n"] / r["trigger"]["publish_s"]
                for r in raw[name]
                if isinstance(r.get("trigger"), dict) and r["trigger"].get("publish_s")
            ]
            rows.append(
                f"| {name} | {fmt(med(list(p50[name].values())))} | "
                f"{fmt(med(list(p99[name].values())))} | {spread(list(p99[name].values()))} | "
                f"{ratio_cell(paired(p99, name, FLOOR))} | "
                f"{ratio_cell(paired(p50, name, FLOOR))} | {fmt(med(reached))} ev/s | "
                f"{merge_correctness(cells[name])} |"
            )
        self.results["S4"] = {"p50": p50, "p99": p99, "runs": raw}
        self.tables.append(
            f"### 4. Latency: 64 subscribers, 200 events/s for {duration:g} s\n\n"
            "Publish → receive, measured per event per subscriber from the event's "
            "`monotonic_ns` stamp (one clock for both processes). "
            f"{self.plan.reps} alternated repetitions.\n\n" + "\n".join(rows) + "\n"
        )

    # S6 ------------------------------------------------------------------------------

    def replay(self) -> None:
        self.log("S6 replay vs live")
        replay_s: dict[str, dict[int, float | None]] = {}
        live_s: dict[str, dict[int, float | None]] = {}
        cells: dict[str, list[str]] = {}
        raw: dict[str, list[Any]] = {}
        for rep, name in rotations(self.contenders, self.plan.reps):
            server = self.servers[name]
            n = self.n_for(name, self.plan.replay_n, self.plan.replay_n_es)
            channel = server.new_channel()
            server.publish_now(channel, f"n={n}&size=200")
            replay = run_loadgen(
                server,
                {
                    "path": server.replay_path(channel),
                    "headers": server.stream_headers(channel),
                    "subscribers": 1,
                    "n": n,
                    "last_event_id": server.cursor(channel, 0),
                    "timeout_s": 90,
                    **({"id_format": "nchan"} if name == NCHAN else {}),
                },
            ).result
            live_channel = server.new_channel()
            live = run_loadgen(
                server, stream_spec(server, live_channel, n, 1, "size=200&rate=0")
            ).result
            replay_s.setdefault(name, {})[rep] = replay.get("since_connect_s")
            live_s.setdefault(name, {})[rep] = live.get("elapsed_s")
            cells.setdefault(name, []).extend([correctness(replay), correctness(live)])
            raw.setdefault(name, []).append({"rep": rep, "replay": replay, "live": live})
            self.log(f"  rep {rep} {name}: replay {fmt(replay.get('since_connect_s'))} s, "
                     f"live {fmt(live.get('elapsed_s'))} s")  # fmt: skip
        rows = [
            "| contender | events | replay s (request → last event), median | live s, median | "
            "replay ÷ live (paired) | replay × floor | lost / duplicated |",
            "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for name in self.contenders:
            ratios = [
                replay_s[name][rep] / live_s[name][rep]  # type: ignore[operator]
                if replay_s[name].get(rep) and live_s[name].get(rep)
                else None
                for rep in replay_s[name]
            ]
            n = self.n_for(name, self.plan.replay_n, self.plan.replay_n_es)
            rows.append(
                f"| {name} | {n:,} | {fmt(med(list(replay_s[name].values())))} | "
                f"{fmt(med(list(live_s[name].values())))} | {ratio_cell(ratios)} | "
                f"{ratio_cell(paired(replay_s, name, FLOOR))} | "
                f"{merge_correctness(cells[name])} |"
            )
        self.results["S6"] = {"replay_s": replay_s, "live_s": live_s, "runs": raw}
        self.tables.append(
            "### 6. Replay: `Last-Event-ID: 0` against a full ring vs the same events live\n\n"
            "Replay: the events are published first (ring of 8,000 full), then one client "
            "connects with cursor 0; timed from the request to the last event (qwenweb and the "
            "floor then send `replay_complete`). Live: a fresh session, one subscriber, the "
            "same events published as fast as possible; timed from the first publish to the "
            "last event. django-eventstream replays from its database "
            f"(`Last-Event-ID: <channel>:0`) and uses {self.plan.replay_n_es:,} events.\n\n"
            + "\n".join(rows)
            + "\n"
        )

    # S7 ------------------------------------------------------------------------------

    def slow_client(self) -> None:
        self.log("S7 slow client")
        duration = self.plan.slow_s
        n = int(1000 * duration)
        p99: dict[str, dict[str, list[float | None]]] = {}
        cells: dict[str, list[str]] = {}
        fates: dict[str, list[str]] = {}
        rss: dict[str, dict[str, list[float | None]]] = {}
        raw: dict[str, list[Any]] = {}
        variants = ("no stall", "stall")
        for rep, name in rotations(self.contenders, self.plan.slow_reps):
            server = self.servers[name]
            for variant in variants if rep % 2 == 0 else variants[::-1]:
                stalled = 1 if variant == "stall" else 0
                channel = server.new_channel()
                spec = stream_spec(
                    server, channel, n, 9 + stalled, f"size={SLOW_EVENT_BYTES}&rate=1000"
                )
                spec.update(stalled=stalled, timeout_s=duration + 60, stall_drain_s=15)
                measured = run_loadgen(server, spec)
                result = measured.result
                p99.setdefault(name, {}).setdefault(variant, []).append(
                    result.get("latency_ms", {}).get("p99")
                )
                cells.setdefault(name, []).append(correctness(result))
                raw.setdefault(name, []).append(
                    {"rep": rep, "variant": variant, **result, "rss_series": measured.rss_series}
                )
                series = measured.rss_series
                growth = (series[-1][1] - series[0][1]) / 1024 if series else None
                rss.setdefault(name, {}).setdefault(variant, []).append(growth)
                if stalled:
                    fates.setdefault(name, []).append(fate(result))
                self.log(f"  rep {rep} {name} {variant}: p99 "
                         f"{fmt(p99[name][variant][-1])} ms {cells[name][-1]}")  # fmt: skip
        rows = [
            "| contender | healthy p99 ms, no stalled reader | with one stalled | "
            "with ÷ without | stalled reader | server RSS growth MiB, without / with the "
            "stalled reader | lost / duplicated |",
            "| --- | ---: | ---: | ---: | --- | --- | --- |",
        ]
        for name in self.contenders:
            base = p99[name]["no stall"]
            stall = p99[name]["stall"]
            ratios = [s / b if s and b else None for s, b in zip(stall, base, strict=True)]
            by_variant = rss[name]
            rows.append(
                f"| {name} | {fmt(med(base))} | {fmt(med(stall))} | {ratio_cell(ratios)} | "
                f"{fates[name][-1]} | {fmt(med(by_variant['no stall']))} / "
                f"{fmt(med(by_variant['stall']))} | {merge_correctness(cells[name])} |"
            )
        self.results["S7"] = {"p99": p99, "fates": fates, "rss_growth_mib": rss, "runs": raw}
        self.tables.append(
            f"### 7. Slow client: 9 healthy readers + 1 stalled, 1,000 events/s of "
            f"{SLOW_EVENT_BYTES:,} B for {duration:g} s\n\n"
            "The stalled reader connects with a 4 KiB receive buffer and stops reading after "
            "the response headers; it resumes only after publishing ends, to collect what "
            "the server kept for it. qwenweb uses the default `maxQueued` (256). Healthy p99 "
            "is compared with a run without the stalled reader, paired per repetition "
            f"({self.plan.slow_reps} repetitions). RSS growth is the server's over the whole "
            "measurement (sampled every 0.25 s, series in the JSON); the run without the "
            "stalled reader grows too (the ring fills with new events), so the difference "
            "between the two is what the stalled reader costs.\n\n" + "\n".join(rows) + "\n"
        )

    # burst ---------------------------------------------------------------------------

    def burst(self) -> None:
        self.log("Burst: 1,000 events in one event-loop turn")
        n = self.plan.burst_n
        cases: list[tuple[str, dict[str, str], str, str]] = []
        for name in self.contenders:
            if name == EVENTSTREAM:
                cases += [
                    (name, {}, "", "with storage"),
                    (name, {"nostore": "1"}, "", "without storage"),
                ]
            elif name == NCHAN:
                cases.append((name, {}, "", f"{n:,} POSTs pipelined on one connection"))
            elif name == FLOOR:
                cases.append((name, {}, "", ""))
            else:
                cases += [
                    (name, {}, "", "default maxQueued (256)"),
                    (name, {}, "?maxQueued=2048", "maxQueued=2048"),
                ]
        rows = [
            "| contender | configuration | subscribers | delivered per subscriber | "
            "announced by `client_evicted` | lost silently | duplicated | verdict |",
            "| --- | --- | ---: | --- | ---: | ---: | ---: | --- |",
        ]
        raw = []
        for name, channel_query, suffix, label in cases:
            server = self.servers[name]
            channel = server.new_channel(**channel_query)
            spec = stream_spec(
                server, channel, n, 8, f"size=200&rate=0&batch={n}", path_suffix=suffix
            )
            spec.update(timeout_s=30, stall_drain_s=0, settle_s=3)
            result = run_loadgen(server, spec).result
            raw.append({"contender": name, "configuration": label, **result})
            delivered = result.get("complete_subs", 0)
            evicted = result.get("evicted_subs", 0)
            verdict = correctness(result)
            if verdict == "OK" and evicted:
                verdict = "OK (evictions announced)"
            rows.append(
                f"| {name} | {label} | 8 | {delivered} complete, {evicted} evicted | "
                f"{result.get('announced_undelivered', '-')} | {result.get('lost_silent', '-')} | "
                f"{result.get('dup', '-')} | {verdict} |"
            )
            self.log(f"  {name} {label}: {verdict}")
        self.results["burst"] = raw
        self.tables.append(
            f"### Burst: {n:,} events published in one event-loop turn, 8 subscribers\n\n"
            "The contract (EB-2 ... EB-5): every event is delivered, or the subscriber is told "
            "with `client_evicted` and may resume from its cursor; nothing is dropped "
            'silently. (django-eventstream publishes from a thread, so "one turn" means '
            "back to back.)\n\n" + "\n".join(rows) + "\n"
        )


# -- machine and main -------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    return {
        "nproc": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "cpu": cpu,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "loadavg_start": os.getloadavg(),
        "git": _git("rev-parse", "--short", "HEAD"),
        "uncommitted_files": len(_git("status", "--porcelain").splitlines()),
    }


def _git(*args: str) -> str:
    """Read-only git query (the commit the numbers belong to); "" when git is missing."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, timeout=10, check=False
        )
    except OSError:
        return ""
    return done.stdout.decode(errors="replace").strip()


SCENARIOS = ("S1", "S2", "S3", "S4", "S5", "S6", "S7", "S8", "S9", "S10", "burst")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run",
        description="Benchmark qwenweb (its production entry point, granian, daphne + flow "
        "control, uvicorn) against django-eventstream (daphne), nginx + Nchan and a "
        "raw-asyncio floor; prints markdown tables.",
    )
    parser.add_argument("--quick", action="store_true", help="smaller counts (< 2 minutes)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--markdown", type=Path, help="also write the tables to this file")
    parser.add_argument(
        "--only", help=f"comma-separated subset of {','.join(SCENARIOS)} (default: all)"
    )
    parser.add_argument("--reps", type=int, help="repetitions per comparison (default 3; 2 quick)")
    parser.add_argument(
        "--contenders",
        help=f"comma-separated subset of {','.join(CONTENDERS)} (default: all; {FLOOR} "
        "is always in)",
    )
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="also run `python -m qwenweb.serve` from this checkout (contender "
        f"{QW_BASELINE}), to compare a change with the code before it in one run",
    )
    args = parser.parse_args(argv)
    given = [shlex.quote(arg) for arg in (sys.argv[1:] if argv is None else argv)]
    if args.baseline_tree is not None and not (args.baseline_tree / "qwenweb").is_dir():
        parser.error(f"--baseline-tree {args.baseline_tree}: no qwenweb/ package there")
    only = set(args.only.split(",")) if args.only else set(SCENARIOS)
    if only - set(SCENARIOS):
        parser.error(f"--only: unknown {','.join(sorted(only - set(SCENARIOS)))}")
    contenders: tuple[str, ...] = CONTENDERS
    if args.contenders:
        wanted = set(args.contenders.split(",")) | {FLOOR}
        if wanted - set(CONTENDERS):
            parser.error(f"--contenders: unknown {','.join(sorted(wanted - set(CONTENDERS)))}")
        contenders = tuple(name for name in CONTENDERS if name in wanted)
    raise_nofile()  # the servers and load generators inherit it (10,000 idle streams)
    plan = Plan.make(args.quick, args.reps)
    started = time.monotonic()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {message}", file=sys.stderr, flush=True)

    info = machine()
    log(f"machine: {info}")
    root = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="qwenweb-bench-", dir=root) as tmp:
        bench = Bench(plan, Path(tmp), log, args.baseline_tree, contenders)
        try:
            if "S1" in only:
                bench.s1_inprocess(args.quick)
            bench.start_all()
            if "S2" in only:
                bench.throughput(
                    "S2", "2. Throughput: 1 subscriber", 1, plan.throughput_n, plan.throughput_n_es
                )
            if "S3" in only:
                bench.throughput(
                    "S3", "3. Fan-out: 64 subscribers", 64, plan.fanout_n, plan.fanout_n_es
                )
            if "S4" in only:
                bench.latency()
            if "S6" in only:
                bench.replay()
            if "S7" in only:
                bench.slow_client()
            if "S8" in only:
                http2_fanout(bench)
            if "S9" in only:
                fast_reader_burst(bench, 3 if args.quick else 10)
            if "S10" in only:
                llm_shaped(bench, *((200, 10.0) if args.quick else (2000, 30.0)), reps=plan.reps)
            if "burst" in only:
                bench.burst()
            if "S5" in only:
                idle_memory(bench)  # last: it restarts every server
        finally:
            bench.stop_all()
            logs = {name: server.log_tail() for name, server in bench.servers.items()}
    elapsed = time.monotonic() - started
    info["loadavg_end"] = os.getloadavg()
    header = (
        f"Run: `{' '.join(['python -m bench.run', *given])}` in {elapsed:.0f} s; "
        f"{info['nproc']} CPUs ({info['cpu']}), {info['memory_gib']} GiB, Python "
        f"{info['python']}; load average {info['loadavg_start'][0]:.2f} at start, "
        f"{info['loadavg_end'][0]:.2f} at end; commit {info['git']} with "
        f"{info['uncommitted_files']} uncommitted files in the tree.\n"
    )
    markdown = header + "\n" + "\n".join(bench.tables)
    print(markdown)
    payload = {
        "quick": args.quick,
        "plan": plan.__dict__,
        "machine": info,
        "elapsed_s": elapsed,
        "results": bench.results,
        "markdown": markdown,
        "server_log_tails": logs,
    }
    if args.json:
        args.json.write_text(json.dumps(payload, indent=1, default=str))
    if args.markdown:
        args.markdown.write_text(markdown)
    log(f"done in {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
