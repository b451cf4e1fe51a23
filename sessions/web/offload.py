"""Request-body work off the event loop, charged to the publisher (issue 26).

Parsing and validating a JSON body costs CPU in proportion to its number of JSON values,
not its bytes: 2 MiB of ``{},{},…`` holds about 700,000 of them. Done on the server's
event loop, that work stalls every stream of the process. So:

- :func:`json_values_bound` counts, at C speed and before anything is parsed, an upper
  bound of a body's JSON values, which the publish quota ``PUBLISH_VALUES_PER_S`` (per
  session) and ``PUBLISH_USER_VALUES_PER_S`` (per user) charge
  (:meth:`sessions.backends.base.Backend.check_values_quota`);
- :func:`off_loop` runs the parse and the validation on a small pool of
  :data:`BODY_WORKERS` threads, so the loop keeps serving while one runs (the threads
  share the GIL with the loop, which gets it back every ``sys.getswitchinterval()``);
- :func:`off_loop_if_heavy` keeps a small body (at most :data:`INLINE_MAX_VALUES` values
  and :data:`INLINE_MAX_BYTES` bytes: a typical event) on the loop: parsing it costs less
  than handing it to a thread, and it never waits in the pool's queue behind another
  publisher's large bodies.

Concurrency: :func:`off_loop` is awaited on the loop; the function it runs must not touch
a bus or the database (EB-11).
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final, ParamSpec, TypeVar

__all__ = [
    "BODY_WORKERS",
    "BYTES_HEADROOM",
    "INLINE_MAX_BYTES",
    "INLINE_MAX_VALUES",
    "json_values_bound",
    "off_loop",
    "off_loop_if_heavy",
    "parse_cost",
]

BODY_WORKERS: Final = 2
"""Threads that parse and validate request bodies: few, since each competes with the loop
for the GIL; requests beyond them wait their turn (bounded by the values quotas)."""

INLINE_MAX_VALUES: Final = 256
"""Bodies of at most this many JSON values (by :func:`json_values_bound`) and at most
:data:`INLINE_MAX_BYTES` are parsed and validated on the loop. Measured
(``validate_publish_body(parse_json(...))``): 256 values of ``{}``, the costliest kind per
value, about 20 µs; a typical event of 7 values 4 µs; handing a call to a worker thread and
back about 54 µs median, 340 µs p99. Larger bodies go to the workers, where a healthy
session's publish used to queue behind an attacker's (issue 26: the other stream's largest
inter-event delay was 97–134 ms)."""

INLINE_MAX_BYTES: Final = 4096
"""The byte bound of a body parsed on the loop (:data:`INLINE_MAX_VALUES`): a few values
can still cost in proportion to their bytes. Measured on 2 MiB bodies of 3 values: a
string 2.0 ms, ``\\u`` escapes 2.7 ms (16 and 18 ms while the long-digit check was a
regular expression). At 4 KiB the worst measured is about 0.1 ms (one integer of 4,095
digits, read exactly by ``json``)."""

BYTES_HEADROOM: Final = 2
"""How many times the bytes quota's rate the values quota admits of bodies of few values
(:func:`parse_cost`): the bytes quota still binds first on the events it admits, and the
values quota on bodies refused after their count, which spend no bytes quota."""

_P = ParamSpec("_P")
_T = TypeVar("_T")


@functools.cache
def _executor() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=BODY_WORKERS, thread_name_prefix="qwenweb-body")


async def off_loop(fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
    """Return ``fn(*args, **kwargs)`` run on the body workers; raise what it raises.

    Never blocks the loop; at most :data:`BODY_WORKERS` such calls run at once.
    """
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_executor(), functools.partial(fn, *args, **kwargs))


async def off_loop_if_heavy(
    body: bytes, values: int, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs
) -> _T:
    """Return ``fn(*args, **kwargs)``: called here, on the loop, when ``body``, the body it
    works on, has at most :data:`INLINE_MAX_BYTES` bytes and :data:`INLINE_MAX_VALUES` JSON
    values (``values``, from :func:`json_values_bound`), else run by :func:`off_loop`.
    Raises what ``fn`` raises."""
    if values <= INLINE_MAX_VALUES and len(body) <= INLINE_MAX_BYTES:
        return fn(*args, **kwargs)
    return await off_loop(fn, *args, **kwargs)


def json_values_bound(body: bytes) -> int:
    """Return an upper bound of the number of JSON values in ``body`` (>= 1).

    Every value is the whole text, the first item after ``[``, the first member after
    ``{`` or an item after ``,``; so ``1 + count("[") + count("{") + count(",")`` bounds
    it (those characters inside strings count too: the bound, never below the truth, is
    what the quota charges). O(len(body)) at C speed: about 3 ms for 2 MiB.
    """
    return 1 + body.count(b"[") + body.count(b"{") + body.count(b",")


def parse_cost(body: bytes, values: int, values_per_s: float, bytes_per_s: float) -> int:
    """The JSON values ``body`` is charged against the values quotas: its values
    (``values``, from :func:`json_values_bound`), or, if that is more, its bytes at
    ``values_per_s`` / (:data:`BYTES_HEADROOM` × ``bytes_per_s``) values per byte (the
    session's ``PUBLISH_VALUES_PER_S`` and ``PUBLISH_BYTES_PER_S``).

    Reading a large body of few values (one long string) costs milliseconds whatever its
    values (``orjson`` 1.1 ms and the long-digit scan 1.3 ms for 2 MiB), and a body
    refused 400 spends no bytes quota: this charges it. Never raises."""
    return max(values, math.ceil(len(body) * values_per_s / (BYTES_HEADROOM * bytes_per_s)))
