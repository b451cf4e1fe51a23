"""Scenario 1, in-process: ``EventBus.publish`` cost and serializations per event.

``python -m bench.inprocess [--quick]`` prints one JSON line. No server, no sockets:

- publish cost (µs per event) versus subscriber count (0, 1, 64; ring 8000) and versus
  ring size (100, 8000, 1,000,000; 0 subscribers), each ring filled to capacity first, so
  every timed publish also evicts the ring's oldest event. Contenders are alternated
  (A B C A B C ...) and each repetition times batches of 100 publishes; subscriber queues
  are drained between batches, outside the timed region (100 < the 75 % warning mark of a
  256-frame queue, so no warning frame is ever built).
- serializations: ``sessions.bus.eventbus._dumps`` (the publish-time JSON encoding) and
  every ``orjson.dumps`` made by the stream writer's framing (``sessions.wire.framing``)
  are counted while real events go through ``publish`` and ``pump_frames`` into a fake
  ``send`` for 0, 1 and 64 subscribers. ``encode_frame`` calls (the SSE framing copy, not
  a JSON serialization) are counted too.
- ring memory: what ``publish`` allocates and keeps per event in a full ring of 8000
  (tracemalloc), and how much of that one event's serialized JSON occupies.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import statistics
import sys
import time
import tracemalloc
from typing import Any

import django

BATCH = 100


def _datas(count: int, size: int) -> list[dict[str, Any]]:
    from bench.common import make_data

    pads: dict[int, str] = {}
    return [make_data(i + 1, size, pads) for i in range(count)]


def _publish_cost(quick: bool) -> dict[str, Any]:
    from sessions.bus import EventBus

    timed = 5_000 if quick else 20_000
    reps = 3 if quick else 5
    datas = _datas(BATCH, 200)
    cases: dict[str, tuple[EventBus, list[Any]]] = {}
    plan = [("subs", 0, 8000), ("subs", 1, 8000), ("subs", 64, 8000)]
    plan += [("ring", 0, 100), ("ring", 0, 1_000_000)]
    fill_s: dict[str, float] = {}
    for kind, subs, ring in plan:
        key = f"{kind}:{subs}:{ring}"
        bus = EventBus(ring_size=ring, max_subscribers=100, max_queued_bytes=2**40)
        started = time.perf_counter()
        shared = {"type": "bench", "data": datas[0]}
        gc.disable()  # filling a 1,000,000-event ring is otherwise quadratic in GC passes
        for _ in range(ring):  # fill to capacity: every timed publish evicts one
            bus.publish(shared)
        gc.enable()
        fill_s[key] = time.perf_counter() - started
        cases[key] = (bus, [bus.subscribe() for _ in range(subs)])
    events = [{"type": "bench", "data": d} for d in datas]
    samples: dict[str, list[float]] = {key: [] for key in cases}
    gc.collect()
    for rep in range(reps):
        keys = list(cases)
        keys = keys[rep % len(keys) :] + keys[: rep % len(keys)]
        for key in keys:
            bus, subscriptions = cases[key]
            total_ns = 0
            for _ in range(timed // BATCH):
                start = time.perf_counter_ns()
                for event in events:
                    bus.publish(event)
                total_ns += time.perf_counter_ns() - start
                for sub in subscriptions:
                    while sub.next_nowait() is not None:
                        pass
            samples[key].append(total_ns / timed / 1000)
    rows = []
    for kind, subs, ring in plan:
        key = f"{kind}:{subs}:{ring}"
        bus = cases[key][0]
        values = samples[key]
        rows.append(
            {
                "subscribers": subs,
                "ring_size": ring,
                "ring_length": bus.stats().ring_length,
                "us_per_publish": statistics.median(values),
                "min": min(values),
                "max": max(values),
                "samples": values,
                "evictions": dict(bus.stats().evictions),
                "fill_s": fill_s[key],
            }
        )
    return {"timed_events_per_rep": timed, "reps": reps, "rows": rows}


class _CountingOrjson:
    """Stands in for the ``orjson`` module inside ``sessions.wire.framing``; counts ``dumps``."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.dumps_calls = 0
        self.Fragment = real.Fragment

    def dumps(self, *args: Any, **kwargs: Any) -> bytes:
        self.dumps_calls += 1
        result: bytes = self.real.dumps(*args, **kwargs)
        return result


async def _serializations(subscribers: int, events: int) -> dict[str, Any]:
    import orjson

    from sessions.bus import EventBus, eventbus
    from sessions.transport import pump as stream
    from sessions.wire import framing

    counts = {"publish_dumps": 0, "encode_frame": 0}
    real_dumps = getattr(eventbus, "_dumps")  # noqa: B009 - from bus.frame, not re-exported
    real_encode = framing.encode_frame

    def counting_dumps(fields: Any) -> bytes | None:
        counts["publish_dumps"] += 1
        return real_dumps(fields)

    def counting_encode(**kwargs: Any) -> bytes:
        counts["encode_frame"] += 1
        return real_encode(**kwargs)

    shim = _CountingOrjson(orjson)
    setattr(eventbus, "_dumps", counting_dumps)  # noqa: B010
    setattr(framing, "encode_frame", counting_encode)  # noqa: B010
    setattr(framing, "orjson", shim)  # noqa: B010
    wire = [0]

    async def send(message: Any) -> None:
        wire[0] += len(message.get("body", b""))

    try:
        bus = EventBus(max_subscribers=100)
        subs = [bus.subscribe(max_queued=2048) for _ in range(subscribers)]
        pumps = [asyncio.create_task(stream.pump_frames(sub, send, 60.0)) for sub in subs]
        for data in _datas(events, 200):
            bus.publish({"type": "bench", "data": data})
            await asyncio.sleep(0)
        bus.close()
        async with asyncio.timeout(30):
            await asyncio.gather(*pumps)
    finally:
        setattr(eventbus, "_dumps", real_dumps)  # noqa: B010
        setattr(framing, "encode_frame", real_encode)  # noqa: B010
        setattr(framing, "orjson", orjson)  # noqa: B010
    return {
        "subscribers": subscribers,
        "events": events,
        "json_serializations_per_event": (counts["publish_dumps"] + shim.dumps_calls) / events,
        "publish_dumps": counts["publish_dumps"],
        "writer_dumps": shim.dumps_calls,
        "encode_frame_per_event": counts["encode_frame"] / events,
        "wire_bytes": wire[0],
    }


def _ring_memory(events: int = 8000) -> dict[str, Any]:
    """Bytes the bus keeps per ring event (tracemalloc), and how much of it is the JSON.

    The events' ``data`` dicts are made before tracing starts: they belong to the
    publisher, so only what ``publish`` itself allocates and keeps is counted.
    """
    from sessions.bus import EventBus, eventbus

    datas = _datas(events, 200)
    bus = EventBus(ring_size=events)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for data in datas:
        bus.publish({"type": "bench", "data": data})
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    ring = bus.ring_snapshot()
    json_len = statistics.mean(len(frame.json or b"") for frame in ring)
    fields = dict(ring[-1])
    dumps = getattr(eventbus, "_dumps")  # noqa: B009 - the bus's own encoder
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    held = [dumps(fields) for _ in range(1000)]
    json_alloc = (tracemalloc.get_traced_memory()[0] - before) / len(held)
    tracemalloc.stop()
    return {
        "events": events,
        "bytes_per_event": kept / events,
        "json_bytes_mean": json_len,
        "json_allocated_bytes": json_alloc,
    }


def main() -> None:
    """Print scenario 1's results as one JSON line."""
    quick = "--quick" in sys.argv[1:]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.qwenweb_bench_settings")
    django.setup()
    result: dict[str, Any] = {"ring_memory": _ring_memory()}
    result["publish_cost"] = _publish_cost(quick)
    result["serializations"] = [asyncio.run(_serializations(subs, 500)) for subs in (0, 1, 64)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
