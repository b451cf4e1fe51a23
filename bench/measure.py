"""Measuring one contender: run the load generator, sample the server, format the cells.

Every comparison in the tables is a ratio of two measurements of the same repetition
(:func:`paired`); every cell that reports loss, duplicates or a timeout is bold
(:func:`correctness`).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bench.servers import PY, REPO, Server


@dataclass
class Measured:
    """One load generator run against one server, with the server's resource use."""

    result: dict[str, Any]
    server_cpu_s: float
    rss_series: list[tuple[float, int]] = field(default_factory=list)


def spawn_loadgen(spec: dict[str, Any], *, interactive: bool = False) -> subprocess.Popen[bytes]:
    """Start ``python -m bench.loadgen <spec>``; ``interactive`` gives it a stdin to hold
    its streams open until told to close them (stderr is then discarded). A spec too long
    for a command line (``streams`` of thousands of sessions) goes through a file."""
    text = json.dumps(spec)
    if len(text) > 64 * 1024:  # one argument may hold at most 128 KiB on Linux
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as file:
            file.write(text)
        text = "@" + file.name
    return subprocess.Popen(
        [PY, "-m", "bench.loadgen", text],
        cwd=REPO,
        stdin=subprocess.PIPE if interactive else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if interactive else subprocess.PIPE,
    )


def run_loadgen(server: Server, spec: dict[str, Any], sample_every_s: float = 0.25) -> Measured:
    """Run ``bench.loadgen`` with ``spec`` against ``server``; sample the server meanwhile."""
    spec = {"port": server.port, **spec}
    cpu_before = server.cpu_s()
    started = time.monotonic()
    series: list[tuple[float, int]] = []
    limit_s = float(spec.get("timeout_s", 60)) + float(spec.get("stall_drain_s", 0)) + 30
    process = spawn_loadgen(spec)
    output: dict[str, bytes] = {}

    def communicate() -> None:
        output["out"], output["err"] = process.communicate()

    reader = threading.Thread(target=communicate)
    reader.start()
    while reader.is_alive() and time.monotonic() - started < limit_s:
        series.append((round(time.monotonic() - started, 3), server.rss_kib()))
        reader.join(sample_every_s)
    if reader.is_alive():
        process.kill()
        reader.join(10)
        return Measured({"error": "load generator timed out"}, server.cpu_s() - cpu_before, series)
    cpu = server.cpu_s() - cpu_before
    series.append((round(time.monotonic() - started, 3), server.rss_kib()))
    lines = output.get("out", b"").decode().strip().splitlines()
    if process.returncode != 0 or not lines:
        err = output.get("err", b"").decode(errors="replace")[-1500:]
        return Measured({"error": f"load generator failed: {err}"}, cpu, series)
    return Measured(json.loads(lines[-1]), cpu, series)


def rotations(names: tuple[str, ...], reps: int) -> Iterator[tuple[int, str]]:
    """Yield (repetition, contender) in a rotating order: A B C D, B C D A, ..."""
    for rep in range(reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            yield rep, name


def stream_spec(
    server: Server, channel: dict[str, Any], n: int, subscribers: int, query: str, **extra: Any
) -> dict[str, Any]:
    """The load generator's spec: ``subscribers`` streams of ``channel`` expecting ``n``
    events, published (``query``: ``size=&rate=&batch=``) once all are connected."""
    spec: dict[str, Any] = {
        "path": channel["path"] + extra.pop("path_suffix", ""),
        "headers": server.stream_headers(channel),
        "subscribers": subscribers,
        "n": n,
        "timeout_s": 90,
        **server.trigger(channel, f"n={n}&{query}"),
    }
    if server.name == "nchan":
        spec["id_format"] = "nchan"
    spec.update(extra)
    return spec


def correctness(result: dict[str, Any]) -> str:
    """One loud cell: OK, or what went wrong (loss, duplicates, parser disagreement)."""
    if "error" in result:
        return f"**{result['error'][:80]}**"
    problems = []
    if result.get("lost_silent"):
        problems.append(f"LOST {result['lost_silent']}")
    if result.get("dup"):
        problems.append(f"DUP {result['dup']}")
    if result.get("out_of_range"):
        problems.append(f"BAD SEQ {result['out_of_range']}")
    if result.get("id_disorder"):
        problems.append(f"BAD ID ORDER {result['id_disorder']}")
    if result.get("timed_out_subs"):
        problems.append(f"TIMEOUT {result['timed_out_subs']} subs")
    if result.get("evicted_subs") and not result.get("stalled"):
        # Announced, so not lost, but a healthy reader evicted is a failure of the server.
        problems.append(f"EVICTED {result['evicted_subs']} subs")
    check = result.get("parser_check", "ok")
    if check not in ("ok", "skipped"):
        problems.append(check)
    return "OK" if not problems else "**" + ", ".join(problems) + "**"


def merge_correctness(cells: list[str]) -> str:
    bad = [cell for cell in cells if cell != "OK"]
    return "OK" if not bad else " / ".join(dict.fromkeys(bad))


def med(values: list[float | None] | list[float]) -> float | None:
    clean = [v for v in values if v is not None and v == v]
    return statistics.median(clean) if clean else None


def spread(values: list[float | None] | list[float]) -> str:
    clean = [v for v in values if v is not None and v == v]
    if not clean:
        return "-"
    return f"{fmt(min(clean))}–{fmt(max(clean))}"


def max_over_min(values: list[float | None] | list[float]) -> str:
    """The largest value divided by the smallest (repetitions' stability), or ``-``."""
    clean = [v for v in values if v is not None and v == v and v > 0]
    return f"{max(clean) / min(clean):.2f}×" if len(clean) > 1 else "-"


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None or value != value:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def ratio_cell(values: list[float | None]) -> str:
    clean = [v for v in values if v is not None and v == v]
    if not clean:
        return "-"
    middle = statistics.median(clean)
    if len(clean) == 1:
        return f"{middle:.2f}×"
    return f"{middle:.2f}× ({min(clean):.2f}–{max(clean):.2f})"


def paired(per_rep: dict[str, dict[int, float | None]], name: str, base: str) -> list[float | None]:
    """Ratios ``name / base`` taken repetition by repetition (same run, adjacent in time)."""
    out: list[float | None] = []
    for rep, value in per_rep.get(name, {}).items():
        other = per_rep.get(base, {}).get(rep)
        out.append(value / other if value and other else None)
    return out


def cpu_ratio(floor_cpu: float | None, cpu: float | None) -> str:
    """Floor CPU per delivery ÷ this contender's: a throughput ratio that the load
    generator cannot cap (it is not busy-waiting on a saturated client)."""
    return f"{floor_cpu / cpu:.2f}×" if floor_cpu and cpu else "-"


def readline_bounded(process: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    box: list[bytes] = []
    assert process.stdout is not None
    stdout = process.stdout
    thread = threading.Thread(target=lambda: box.append(stdout.readline()), daemon=True)
    thread.start()
    thread.join(timeout_s)
    return box[0] if box else b""


def fate(result: dict[str, Any]) -> str:
    if "error" in result:
        return "error"
    detail = (result.get("stalled_detail") or [{}])[0]
    terminal = detail.get("terminal")
    got = detail.get("received", 0)
    if terminal == "client_evicted":
        return f"evicted after {got:,} events ({detail.get('warnings', 0)} warning)"
    return f"{terminal or 'open'}, got {got:,} of {result.get('n', 0):,}"


def median_ratio_line(
    name: str, base: str, ratios: list[float | None], target: float | None = None
) -> str:
    """One line that makes a Done-when check easy to read: the per-repetition ratios
    ``name ÷ base`` and their median, and whether the median meets ``target`` (≥)."""
    clean = [r for r in ratios if r is not None and r == r]
    if not clean:
        return f"median ratio {name} ÷ {base}: - (no paired repetition)"
    middle = statistics.median(clean)
    verdict = ""
    if target is not None:
        verdict = f"; target ≥ {target:g}: {'met' if middle >= target else 'MISSED'}"
    per_rep = ", ".join(f"{r:.2f}" for r in clean)
    return f"median ratio {name} ÷ {base}: **{middle:.2f}** (per repetition: {per_rep}{verdict})"
