"""CPU of one delivery through the pump when every event is its own ``send`` (issue 23).

``python -m bench.pumpcost [--baseline-tree PATH] [--reps 7] [--events 20000]`` publishes
events one at a time into a bus whose one subscriber is pumped by
:func:`sessions.transport.pump.pump_frames` into a ``send`` that returns on the next loop
turn (as a server's does), letting the loop turn three times per event so that each event
is written alone. It prints the process CPU per event (µs, median of alternated
repetitions) with the writer idle timeout on (30 s, as in production) and off, and the
same for the pump of ``--baseline-tree`` when given: the difference is what the timeout
costs per ``send``. In-process: no server, no socket.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from sessions.bus import EventBus

HERE = Path(__file__).resolve().parents[1]


def load_pump(tree: Path, name: str) -> ModuleType:
    """Import ``sessions/transport/pump.py`` of ``tree`` as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, tree / "sessions/transport/pump.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def cpu_per_event_us(pump: ModuleType, events: int, idle_s: float | None) -> float:
    bus = EventBus(100)
    sub = bus.subscribe(max_queued=events + 1)

    async def send(message: Any) -> None:
        await asyncio.sleep(0)

    task = asyncio.create_task(pump.pump_frames(sub, send, 60, writer_idle_timeout_s=idle_s))
    await asyncio.sleep(0)
    started = time.process_time()
    for index in range(events):
        bus.publish({"type": "t", "data": index})
        for _ in range(3):  # the pump takes it, sends it, comes back: one event per send
            await asyncio.sleep(0)
    bus.close()
    await asyncio.wait_for(task, 60)
    return (time.process_time() - started) / events * 1e6


async def run(pumps: dict[str, ModuleType], reps: int, events: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}
    for _ in range(reps):
        for label, pump in pumps.items():
            for idle_s in (30.0, None):
                key = f"{label}, idle timeout {'on' if idle_s else 'off'}"
                results.setdefault(key, []).append(await cpu_per_event_us(pump, events, idle_s))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.pumpcost")
    parser.add_argument("--baseline-tree", type=Path)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--events", type=int, default=20_000)
    args = parser.parse_args(argv)
    pumps = {"this tree": load_pump(HERE, "pump_here")}
    if args.baseline_tree is not None:
        pumps["baseline"] = load_pump(args.baseline_tree, "pump_baseline")
    results = asyncio.run(run(pumps, args.reps, args.events))
    print("| pump | CPU µs per event, median | spread |\n| --- | ---: | ---: |")
    for key, values in results.items():
        print(f"| {key} | {statistics.median(values):.1f} | {min(values):.1f}–{max(values):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
