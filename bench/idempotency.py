"""What idempotency keys cost, and that the process budget bounds them (issue 26).

``python -m bench.idempotency [--budget N]`` writes 10,000 keys into each of 100
sessions' stores (the memory backend's ``IdempotencyStore``, all counting in one
``KeyBudget`` of ``IDEMPOTENCY_MAX_KEYS_TOTAL``, default 200,000), then lets their time
to live pass as for closed sessions, and prints the keys held, the Python memory
(``tracemalloc``) and this process's RSS at each step. In-process: the stores are what
the backend builds; no server, no bus.
"""

from __future__ import annotations

import argparse
import gc
import os
import tracemalloc
from pathlib import Path


class _Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    """Run the measurement; print one line per step."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--budget", type=int, default=200_000)
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument(
        "--rss", action="store_true", help="RSS only (tracemalloc's own records inflate it)"
    )
    args = parser.parse_args()
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.qwenweb_bench_settings")
    django.setup()
    from sessions.backends.idempotency import IdempotencyKey, IdempotencyStore, KeyBudget

    clock = _Clock()
    budget = KeyBudget(args.budget, clock=clock)
    gc.collect()
    if not args.rss:
        tracemalloc.start()
    base, rss0 = tracemalloc.get_traced_memory()[0], _rss_mib()

    def report(step: str) -> None:
        traced = (tracemalloc.get_traced_memory()[0] - base) / 2**20
        print(
            f"{step:<32} keys={budget.count:>9,} python={traced:8.1f} MiB "
            f"rss=+{_rss_mib() - rss0:7.1f} MiB"
        )

    stores = [
        IdempotencyStore(args.keys, 900, clock=clock, budget=budget) for _ in range(args.sessions)
    ]
    for n in range(args.sessions * args.keys):
        stores[n % args.sessions].remember(IdempotencyKey(f"{n:036d}", f"{n:064x}"), n, "E")
    report(f"{args.sessions} x {args.keys:,} keys written")
    clock.now += 900  # IDEMPOTENCY_TTL_S: the sessions closed, their keys expire
    for store in stores:
        store.expire()
    report("after the time to live")
    del stores
    gc.collect()
    report("stores dropped")
    if not args.rss:
        tracemalloc.stop()


if __name__ == "__main__":
    main()
