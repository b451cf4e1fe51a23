"""Scenario 8: 64 SSE streams over one HTTP/2 connection vs 64 HTTP/1.1 connections.

Both sides over TLS, against the same server process started with a self-signed
certificate (``trustme``): HTTP/1.1 with ALPN ``http/1.1`` on 64 connections, HTTP/2 with
ALPN ``h2`` on one connection carrying 64 streams (:mod:`bench.h2client`). Only the
contenders that speak HTTP/2 run it: ``qwenweb-granian``, ``qwenweb-serve`` when its
entry point takes ``--certfile``/``--keyfile``, and ``nchan`` (``listen ... ssl http2``,
publishing on a plain-HTTP port of the same nginx).
"""

from __future__ import annotations

from typing import Any

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
    stream_spec,
)
from bench.plan import BenchContext
from bench.servers import HTTP2_CONTENDERS, QW_SERVE, Server, make_certificate, serve_takes

TRANSPORTS = ("h1-tls", "h2")
SUBSCRIBERS = 64


def http2_fanout(bench: BenchContext) -> None:
    """Run scenario 8 and append its table to ``bench.tables``."""
    bench.log("S8 HTTP/2: 64 streams on one connection vs 64 HTTP/1.1 connections (TLS)")
    tls = make_certificate(bench.workdir)
    names = tuple(
        name
        for name in HTTP2_CONTENDERS
        if name in bench.contenders and (name != QW_SERVE or serve_takes("--certfile"))
    )
    skipped = [name for name in HTTP2_CONTENDERS if name in bench.contenders and name not in names]
    n = bench.plan.fanout_n
    servers = {
        name: Server(name, bench.workdir, bench.template, tls=tls, static_root=bench.static_root)
        for name in names
    }
    rate: dict[str, dict[str, dict[int, float | None]]] = {}
    cpu: dict[str, dict[str, list[float]]] = {}
    busy: dict[str, dict[str, list[float]]] = {}
    cells: dict[str, dict[str, list[str]]] = {}
    raw: list[dict[str, Any]] = []
    try:
        for server in servers.values():
            server.start()
        for rep, name in rotations(names, bench.plan.reps):
            server = servers[name]
            for transport in TRANSPORTS if rep % 2 == 0 else TRANSPORTS[::-1]:
                channel = server.new_channel()
                spec = stream_spec(
                    server, channel, n, SUBSCRIBERS, "size=200&rate=0", transport=transport
                )
                measured = run_loadgen(server, spec)
                result = measured.result
                elapsed = result.get("elapsed_s")
                value = n * SUBSCRIBERS / elapsed if elapsed else None
                rate.setdefault(transport, {}).setdefault(name, {})[rep] = value
                per = cpu.setdefault(transport, {}).setdefault(name, [])
                per.append(measured.server_cpu_s / (n * SUBSCRIBERS) * 1e6)
                busy.setdefault(transport, {}).setdefault(name, []).append(
                    result.get("client_busy", 0)
                )
                cells.setdefault(transport, {}).setdefault(name, []).append(correctness(result))
                raw.append({"rep": rep, "contender": name, "transport": transport, **result,
                            "server_cpu_s": measured.server_cpu_s})  # fmt: skip
                bench.log(f"  rep {rep} {name} {transport}: {fmt(value)} deliveries/s "
                          f"{cells[transport][name][-1]}")  # fmt: skip
    finally:
        for server in servers.values():
            server.stop()
    rows = [
        "| contender | transport | deliveries/s, median | spread | HTTP/2 ÷ HTTP/1.1 "
        "(paired) | server CPU µs per delivery | loadgen CPU busy | lost / duplicated |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name in names:
        h2_vs_h1 = ratio_cell(
            paired({"h2": rate["h2"][name], "h1": rate["h1-tls"][name]}, "h2", "h1")
        )
        for transport in TRANSPORTS:
            values = list(rate[transport][name].values())
            label = "HTTP/2, 1 connection" if transport == "h2" else "HTTP/1.1, 64 connections"
            rows.append(
                f"| {name} | {label} | {fmt(med(values))} | {spread(values)} | "
                f"{h2_vs_h1 if transport == 'h2' else ''} | {fmt(med(cpu[transport][name]))} | "
                f"{fmt(100 * (med(busy[transport][name]) or 0), 2)} % | "
                f"{merge_correctness(cells[transport][name])} |"
            )
    bench.results["S8"] = {"rate": rate, "cpu_us": cpu, "runs": raw, "skipped": skipped}
    note = (
        f" Not run: {', '.join(skipped)} (its entry point takes no `--certfile` in this checkout)."
        if skipped
        else ""
    )
    bench.tables.append(
        f"### 8. HTTP/2: {SUBSCRIBERS} streams over one connection vs {SUBSCRIBERS} HTTP/1.1 "
        "connections (both TLS)\n\n"
        f"{n:,} events of 200 B published as fast as possible to {SUBSCRIBERS} subscribers "
        f"of one session, {bench.plan.reps} alternated repetitions; the same server process "
        "answers both (ALPN). The HTTP/2 client is the `h2` library (pure Python, every DATA "
        "frame parsed and acknowledged), so its CPU, shown as loadgen busy, can cap the "
        "HTTP/2 rate: the server CPU per delivery is the column the client cannot cap."
        f"{note}\n\n" + "\n".join(rows) + "\n"
    )
