"""What RSS does after idle streams close: is the memory returned to the system?

``python -m bench.rss_after_close [--streams 2000] [--rounds 2]`` starts
``python -m qwenweb.serve`` (default settings), warms it with 8 idle streams, then, per
round, opens ``--streams`` idle streams on one session with the load generator, closes
them, and samples the RSS of the server's whole process tree (``/proc``) before, while
open, and after the close once it has settled (sampled every 0.5 s for at most 10 s,
until two samples agree within 1 %), then asks the server to call glibc's
``malloc_trim(0)`` (``POST /bench/malloc_trim``) and samples once more. Prints one line
per round: the four figures in KiB and the share of the growth still held after the
close and after the trim. Memory, not time: nothing
here is a limit.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.idle import _hold_idle, _idle_spec
from bench.servers import QW_SERVE, Server, collect_static, migrate_template, raise_nofile


def _settled_rss(server: Server) -> int:
    """The tree's RSS once two samples 0.5 s apart agree within 1 % (at most 10 s)."""
    last = server.rss_kib()
    for _ in range(20):
        time.sleep(0.5)
        now = server.rss_kib()
        if abs(now - last) <= last / 100:
            return now
        last = now
    return last


def main() -> None:
    """Print RSS before, with the streams open, and after their close, per round."""
    parser = argparse.ArgumentParser(prog="python -m bench.rss_after_close")
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    raise_nofile()
    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(prefix="qwenweb-rss-", dir=shm) as tmp:
        workdir = Path(tmp)
        server = Server(
            QW_SERVE, workdir, migrate_template(workdir), static_root=collect_static(workdir)
        )
        server.start()
        try:
            channel = server.new_channel()
            _hold_idle(server, _idle_spec(server, channel, 8))  # first-stream imports, caches
            for round_no in range(1, args.rounds + 1):
                before = server.rss_kib() if round_no > 1 else _settled_rss(server)
                during, _, ready = _hold_idle(server, _idle_spec(server, channel, args.streams))
                after = _settled_rss(server)
                trimmed = server.call("/bench/malloc_trim").get("trimmed")
                time.sleep(0.5)
                after_trim = server.rss_kib()
                grown = max(1, during - before)
                print(
                    f"round {round_no}: {ready} streams; RSS before {before} KiB, open "
                    f"{during} KiB (+{(during - before) / max(1, ready):.1f} KiB per stream), "
                    f"after close {after} KiB: {100 * (after - before) / grown:.0f} % of the "
                    f"growth still held; after malloc_trim(0) (released: {trimmed}) "
                    f"{after_trim} KiB: {100 * (after_trim - before) / grown:.0f} %",
                    flush=True,
                )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
