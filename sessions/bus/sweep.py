"""Coarse deadlines of many streams on one timer per event loop.

Every open stream waits on up to three deadlines: its next heartbeat (EB-18), the writer
idle bound of a pending ``send`` and its token's expiry. A loop timer handle for each
(uvloop's with its libuv timer) was about 0.5 KiB per deadline, the largest part of an
idle stream's Python memory after the server's own objects (issue 23,
docs/benchmarks.md). A :class:`Sweeper` keeps each deadline as one entry of a dict and
runs one timer that, every ``period`` seconds while it has entries, calls the callbacks
whose deadline has passed.

Precision: a callback runs between its deadline and ``slack`` seconds after it (the
smallest ``slack`` asked for on a loop sets the period, :data:`MIN_PERIOD_S` at least),
never before. Cost: one dict store and one removal per deadline, and per period a pass
over the entries (about 0.1 µs each).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Hashable
from typing import Any, Final

__all__ = ["MAX_PERIOD_S", "MIN_PERIOD_S", "Sweeper", "sweeper"]

logger = logging.getLogger("qwenweb.bus")

MAX_PERIOD_S: Final = 1.0
"""The sweep period at most (seconds): no deadline runs later than this past its time."""
MIN_PERIOD_S: Final = 0.005
"""The sweep period at least (seconds), however small a ``slack`` is asked for."""


class Sweeper:
    """One event loop's coarse deadlines (module docstring). Use :func:`sweeper`.

    Not thread-safe: the loop's thread only.
    """

    __slots__ = ("__weakref__", "_entries", "_handle", "_loop", "_period")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # (weakly: the registry's values must not keep their loops alive)
        self._loop = weakref.ref(loop)
        self._entries: dict[Hashable, tuple[float, Callable[[Any], None]]] = {}
        self._period = MAX_PERIOD_S
        self._handle: asyncio.TimerHandle | None = None

    def call_at(
        self, key: Hashable, when: float, callback: Callable[[Any], None], slack: float
    ) -> None:
        """Call ``callback(key)`` once, on the loop, ``when`` (loop time, seconds) or up to
        ``slack`` seconds later (at most :data:`MAX_PERIOD_S`); replaces ``key``'s earlier
        deadline. ``callback`` should not raise (what it raises is logged)."""
        self._entries[key] = (when, callback)
        period = max(MIN_PERIOD_S, min(slack, self._period))
        handle = self._handle
        if period < self._period:
            self._period = period
            loop = self._loop()
            if handle is not None and loop is not None and handle.when() > loop.time() + period:
                handle.cancel()  # (a sweep due sooner than the new period stays as it is)
                self._handle = handle = None
        if handle is None:
            loop = self._loop()
            if loop is not None:
                self._handle = loop.call_later(self._period, self._sweep)

    def cancel(self, key: Hashable) -> None:
        """Forget ``key``'s deadline, if any. Never raises."""
        self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)

    def _sweep(self) -> None:
        self._handle = None
        loop = self._loop()
        if loop is None:
            return
        now = loop.time()
        entries = self._entries
        due = [key for key, (when, _) in entries.items() if when <= now]
        try:
            for key in due:
                entry = entries.get(key)
                if entry is None or entry[0] > now:  # (cancelled or moved by a callback)
                    continue
                del entries[key]
                try:
                    entry[1](key)
                except Exception:
                    logger.exception("sweep_callback_failed")
        finally:  # (even past a BaseException: the other deadlines keep their timer)
            if entries and self._handle is None:
                self._handle = loop.call_later(self._period, self._sweep)


_SWEEPERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.ref[Sweeper]] = (
    weakref.WeakKeyDictionary()
)
"""Each loop's sweeper, weakly: a sweeper with deadlines is kept by its pending timer
(which holds the loop), one without is made again when needed, so the registry never keeps
a loop alive."""


def sweeper(loop: asyncio.AbstractEventLoop | None = None) -> Sweeper:
    """The :class:`Sweeper` of ``loop`` (default: the running loop; RuntimeError without
    one)."""
    if loop is None:
        loop = asyncio.get_running_loop()
    ref = _SWEEPERS.get(loop)
    found = ref() if ref is not None else None
    if found is None:
        found = Sweeper(loop)
        _SWEEPERS[loop] = weakref.ref(found)
    return found
