"""What a scenario module gets from the runner (``bench.run``): the sizes of a run
(:class:`Plan`) and the runner's face (:class:`BenchContext`), so scenario modules
(``bench.idle``, ``bench.h2bench``) need not import the runner that imports them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bench.servers import Server


@dataclass(frozen=True)
class Plan:
    """How big each scenario is; ``quick`` shrinks counts and durations, not the shape."""

    reps: int
    throughput_n: int
    throughput_n_es: int  # django-eventstream publishes ~400 events/s (a DB write each)
    fanout_n: int
    fanout_n_es: int
    latency_s: float
    idle_counts: tuple[int, ...]
    idle_reps: int
    replay_n: int
    replay_n_es: int
    slow_s: float
    slow_reps: int
    burst_n: int = 1000

    @classmethod
    def make(cls, quick: bool, reps: int | None) -> Plan:
        if quick:
            # Fan-out keeps the full run's 2,000 events: 500 × 64 deliveries took ~0.1 s,
            # and the per-repetition ratio to the floor swung 0.3-3x on that alone.
            return cls(reps or 2, 5000, 500, 2000, 200, 1.5, (1000,), 1, 8000, 500, 2.0, 1)
        return cls(reps or 3, 20_000, 2000, 2000, 500, 10.0, (1000, 10_000), 2, 8000, 2000, 5.0, 3)


class BenchContext(Protocol):
    """What a scenario reads and appends to (:class:`bench.run.Bench` is one)."""

    plan: Plan
    workdir: Path
    log: Callable[[str], None]
    template: Path
    static_root: Path | None
    contenders: tuple[str, ...]
    servers: dict[str, Server]
    results: dict[str, Any]
    tables: list[str]
