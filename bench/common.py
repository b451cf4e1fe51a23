"""What every contender shares: the bench payload and the burst loop.

A bench event's ``data`` is ``{"seq": <1..n>, "t": <time.monotonic_ns() at publish>,
"pad": "xxx..."}`` padded so that its compact JSON is ``size`` bytes. ``CLOCK_MONOTONIC``
is one clock for every process on a Linux host, so the load generator (another process)
subtracts ``t`` from its own ``monotonic_ns()`` at receive time to get the latency.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

# `{"seq":` + `,"t":` + `,"pad":""}`: the bytes around the two numbers and the pad.
_FIXED_BYTES = 22

MIN_SLEEP_S = 0.001
"""The shortest sleep of a paced publisher. uvloop counts timers in whole milliseconds: a
sleep under 0.5 ms returns at once, so a publisher that slept until each due time spun the
server's loop whenever events were due less than 0.5 ms apart (100 % of a CPU at 2,000
events/s, 855,000 wake-ups in 2 s, all charged to the server as delivery cost). Events that
fall due during the sleep go out together on waking, each stamped when really published."""


def make_data(seq: int, size: int, pads: dict[int, str]) -> dict[str, Any]:
    """Return the bench ``data`` for ``seq``, stamped now, ``size`` bytes of compact JSON.

    ``pads`` caches pad strings by length. The JSON is never smaller than the two numbers.
    """
    now = time.monotonic_ns()
    pad_len = max(0, size - _FIXED_BYTES - len(str(seq)) - len(str(now)))
    pad = pads.get(pad_len)
    if pad is None:
        pad = pads[pad_len] = "x" * pad_len
    return {"seq": seq, "t": now, "pad": pad}


def burst_params(query: dict[str, str]) -> tuple[int, int, float, int]:
    """Parse ``n``, ``size`` (bytes), ``rate`` (events/s, 0 = as fast as possible) and
    ``batch`` (events per event-loop turn when ``rate`` is 0) from a query dict."""
    n = int(query.get("n", "1000"))
    size = int(query.get("size", "200"))
    rate = float(query.get("rate", "0"))
    batch = int(query.get("batch", "1"))
    if not (0 < n <= 10_000_000 and 0 < size <= 10_000_000 and rate >= 0 and batch >= 1):
        raise ValueError("bad burst parameters")
    return n, size, rate, batch


async def run_burst(
    publish: Callable[[dict[str, Any]], bool | Awaitable[bool]],
    n: int,
    size: int,
    rate: float,
    batch: int,
) -> dict[str, Any]:
    """Publish ``n`` bench events on the running loop; return timings as a JSON-able dict.

    ``rate`` > 0 paces publishes on a schedule (events that fell behind it go out together,
    each stamped when it is really published); ``rate`` == 0 publishes ``batch`` events per
    loop turn, then yields (``asyncio.sleep(0)``), so ``batch=n`` is "all in one turn".
    ``publish`` returns False for an event the server refused (or an awaitable of it).
    """
    pads: dict[int, str] = {}
    start = time.monotonic_ns()
    refused = 0
    seq = 1
    period_ns = 1e9 / rate if rate > 0 else 0.0
    while seq <= n:
        if rate > 0:
            due = start + (seq - 1) * period_ns
            now = time.monotonic_ns()
            if due > now:
                await asyncio.sleep(max(MIN_SLEEP_S, (due - now) / 1e9))
                now = time.monotonic_ns()
            count = max(1, min(n - seq + 1, int((now - start) / period_ns) + 1 - (seq - 1)))
        else:
            count = min(batch, n - seq + 1)
        for _ in range(count):
            accepted = publish(make_data(seq, size, pads))
            if inspect.isawaitable(accepted):  # the Redis backend: a round-trip per event
                accepted = await accepted
            if not accepted:
                refused += 1
            seq += 1
        if rate == 0:
            await asyncio.sleep(0)
    end = time.monotonic_ns()
    return {"published": n - refused, "refused": refused, "publish_s": (end - start) / 1e9}


def run_burst_sync(
    publish: Callable[[dict[str, Any]], bool], n: int, size: int, rate: float
) -> dict[str, Any]:
    """Like :func:`run_burst` for a publisher that runs on a thread (django-eventstream)."""
    pads: dict[int, str] = {}
    start = time.monotonic_ns()
    refused = 0
    for seq in range(1, n + 1):
        if rate > 0:
            due = start + (seq - 1) * 1e9 / rate
            delay = due - time.monotonic_ns()
            if delay > 0:
                time.sleep(delay / 1e9)
        if not publish(make_data(seq, size, pads)):
            refused += 1
    end = time.monotonic_ns()
    return {"published": n - refused, "refused": refused, "publish_s": (end - start) / 1e9}


async def run_paced_sessions(
    publishers: Sequence[Callable[[dict[str, Any]], bool]],
    rate: float,
    duration_s: float,
    sizes: tuple[int, int],
    seed: int = 23,
) -> dict[str, Any]:
    """Publish ``rate`` events/s into each of many sessions for ``duration_s`` seconds.

    ``publishers[i]`` publishes into session ``i``. Session ``i``'s ``k``-th event (``seq``
    ``k + 1``) is due at ``start + (k + i / len(publishers)) / rate``: the sessions are
    spread evenly over each period, as independent agents would be. Sizes (compact JSON
    of ``data``) are drawn uniformly from ``sizes`` (bytes, inclusive) with a fixed seed.
    Events that fell behind go out together, at most 500 per loop turn. Returns counts,
    the publishing time and how far behind the schedule it fell at most (ms).
    """
    count = len(publishers)
    per_session = int(rate * duration_s)
    total = per_session * count
    period_s = 1.0 / rate
    rng = random.Random(seed)
    pads: dict[int, str] = {}
    start = time.monotonic()
    refused = index = 0
    behind_s = 0.0
    while index < total:
        now = time.monotonic()
        burst = 0
        while index < total and burst < 500:
            k, i = divmod(index, count)
            due = start + (k + i / count) * period_s
            if due > now:
                break
            behind_s = max(behind_s, now - due)
            if not publishers[i](make_data(k + 1, rng.randint(*sizes), pads)):
                refused += 1
            index += 1
            burst += 1
        if index < total:
            k, i = divmod(index, count)
            due = start + (k + i / count) * period_s
            await asyncio.sleep(max(MIN_SLEEP_S, due - time.monotonic()))
    return {
        "published": total - refused,
        "refused": refused,
        "publish_s": time.monotonic() - start,
        "behind_max_ms": behind_s * 1e3,
    }
