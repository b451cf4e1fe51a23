"""What a ring event, a session and a subscriber cost, per payload shape (docs/capacity.md).

``python -m bench.capacity`` publishes events of several shapes into buses in this
process and measures with ``tracemalloc`` what the bus keeps (the publisher's own data is
made before tracing starts), next to what the ring's byte limit counts for them
(``sessions.bus.held_bytes``). It prints markdown tables. Python allocations only:
allocator slack and the RSS of a real server are in ``tests/e2e/test_memory_bounds.py``.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

SHAPES: dict[str, tuple[int, Callable[[], Any]]] = {
    # name: (events, data factory)
    "200 B object": (8000, lambda: {"text": "x" * 160, "n": 1, "ok": True}),
    "4 KiB string": (2000, lambda: "s" * 4096),
    "1 MiB string": (20, lambda: "s" * 1024 * 1024),
    "256 KiB of empty objects": (10, lambda: [{} for _ in range(256 * 1024 // 3)]),
}


def _traced(work: Callable[[], Any]) -> tuple[Any, int]:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    result = work()
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return result, kept


def shapes() -> list[dict[str, Any]]:
    """Per shape: JSON bytes, counted bytes and kept bytes per ring event."""
    from sessions.bus import EventBus, held_bytes

    rows = []
    for name, (events, make) in SHAPES.items():
        datas = [make() for _ in range(events)]
        bus = EventBus(ring_size=events, ring_max_bytes=2**40)

        def publish_all(bus: EventBus = bus, datas: list[Any] = datas) -> None:
            for data in datas:
                bus.publish({"type": "bench", "data": data})

        _, kept = _traced(publish_all)
        ring = bus.ring_snapshot()
        rows.append(
            {
                "shape": name,
                "events": events,
                "json": statistics.mean(f.nbytes for f in ring),
                "counted": statistics.mean(held_bytes(f) for f in ring),
                "kept": kept / events,
                "parsed_python": _parsed_size(datas[0]),
            }
        )
    return rows


def _parsed_size(data: Any) -> int:
    """What the parsed ``data`` occupies as Python objects (what a ring no longer keeps)."""
    _, size = _traced(lambda: __import__("orjson").loads(__import__("orjson").dumps(data)))
    return size


def per_session_and_subscriber() -> dict[str, float]:
    """An idle bus with 3 small events, and one idle subscriber (its queue), in bytes."""
    from sessions.bus import EventBus

    def buses() -> list[EventBus]:
        made = []
        for n in range(1000):
            bus = EventBus(name=f"s{n}")
            for _ in range(3):
                bus.publish({"type": "note", "data": {"n": 1}})
            made.append(bus)
        return made

    kept_buses, per_bus = _traced(buses)
    bus = EventBus(max_subscribers=2000)

    async def subscribe() -> list[Any]:
        return [bus.subscribe() for _ in range(1000)]

    subs, per_sub = _traced(lambda: asyncio.run(subscribe()))
    del kept_buses, subs
    return {"session_bytes": per_bus / 1000, "subscriber_bytes": per_sub / 1000}


def main() -> None:
    """Print the tables."""
    import os

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.qwenweb_bench_settings")
    django.setup()
    print(
        "| payload (`data`) | events | JSON bytes per event | counted (`held_bytes`) | "
        "kept by the bus (tracemalloc) | kept ÷ counted | parsed as Python objects |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in shapes():
        print(
            f"| {row['shape']} | {row['events']:,} | {row['json']:,.0f} | {row['counted']:,.0f} | "
            f"{row['kept']:,.0f} | {row['kept'] / row['counted']:.2f} | "
            f"{row['parsed_python']:,.0f} |"
        )
    other = per_session_and_subscriber()
    print()
    print("| what | bytes (tracemalloc) |")
    print("| --- | ---: |")
    print(f"| an idle bus with 3 small events | {other['session_bytes']:,.0f} |")
    print(f"| an idle subscriber's queue (no socket) | {other['subscriber_bytes']:,.0f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
