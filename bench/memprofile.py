"""Where an idle qwenweb stream's memory goes: top allocation sites per idle subscriber.

``python -m bench.memprofile [--server serve|uvicorn] [--streams 500] [--group lineno]
[--top 40] [--accept-encoding gzip]`` starts one qwenweb
server with ``BENCH_TRACEMALLOC=1`` (tracing is on only in this tool, never in
``bench.run``), opens ``--streams`` idle streams with the load generator, and prints the
Python allocation sites (by file) that grew, divided by the number of streams (code
imported meanwhile is left out). Kernel socket
buffers and allocator slack are not in tracemalloc's numbers, so the total is below the
RSS growth that ``bench.run`` reports.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.measure import spawn_loadgen
from bench.servers import (
    QW_SERVE,
    QW_UVICORN,
    REPO,
    Server,
    collect_static,
    migrate_template,
    post_json,
)


def main() -> None:
    """Print the per-stream allocation sites as a markdown table."""
    parser = argparse.ArgumentParser(prog="python -m bench.memprofile")
    parser.add_argument("--server", choices=("serve", "uvicorn"), default="uvicorn")
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument(
        "--group", choices=("filename", "lineno"), default="filename",
        help="one row per file (default) or per line",
    )  # fmt: skip
    parser.add_argument("--top", type=int, default=20, help="rows to print")
    parser.add_argument(
        "--accept-encoding", default="", help="the streams' Accept-Encoding (e.g. gzip)"
    )
    args = parser.parse_args()
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="qwenweb-memprofile-", dir=shm) as tmp:
        workdir = Path(tmp)
        name = QW_SERVE if args.server == "serve" else QW_UVICORN
        server = Server(
            name, workdir, migrate_template(workdir), static_root=collect_static(workdir)
        )
        server.extra_env["BENCH_TRACEMALLOC"] = "1"
        server.start()
        try:
            channel = server.new_channel()
            spec = {
                "port": server.port,
                "mode": "idle",
                "path": channel["path"],
                "headers": server.stream_headers(channel),
                "subscribers": 8,
                "timeout_s": 60,
            }
            if args.accept_encoding:
                spec["accept_encoding"] = args.accept_encoding
            _hold(spec)  # warm up: first-stream imports and caches
            post_json(server.port, "/bench/tracemalloc?action=mark&frames=1")
            rss0 = server.rss_kib()
            query = f"action=report&top={args.top}&group={args.group}"
            report, rss1 = _hold({**spec, "subscribers": args.streams}, server, query)
        finally:
            server.stop()
    per = args.streams
    traced_kib = float(report["total_diff"]) / per / 1024  # type: ignore[arg-type]
    print(
        f"{per} idle streams; RSS growth {(rss1 - rss0) / per:.1f} KiB per stream; "
        f"traced Python allocations {traced_kib:.1f} KiB per stream\n"
    )
    print("| allocation site | bytes per stream | objects per stream |")
    print("| --- | ---: | ---: |")
    for row in report["top"]:  # type: ignore[attr-defined]
        where = row["where"].replace(str(REPO) + "/", "").split("site-packages/")[-1]
        print(f"| `{where}` | {row['size_diff'] / per:,.0f} | {row['count'] / per:.1f} |")


def _hold(
    spec: dict[str, object], server: Server | None = None, query: str = ""
) -> tuple[dict[str, object], int]:
    """Open the idle streams; with ``server``, take the tracemalloc report while they are open."""
    process = spawn_loadgen(spec, interactive=True)
    assert process.stdin is not None
    assert process.stdout is not None
    report: dict[str, object] = {}
    rss = 0
    try:
        process.stdout.readline()
        if server is not None:
            time.sleep(1.0)
            rss = server.rss_kib()
            report = post_json(server.port, f"/bench/tracemalloc?{query}")
        process.stdin.write(b"close\n")
        process.stdin.flush()
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    return report, rss


if __name__ == "__main__":
    main()
