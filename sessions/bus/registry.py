"""A process-wide registry of per-session objects (one bus per session), created lazily.

Concurrency model: like the bus (EB-11), a registry belongs to one event loop. Creation is
single-flight: concurrent ``get_or_create`` calls for one key await the same factory call,
so a session never gets two buses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Map a session id to its one live object, built on first use."""

    def __init__(self) -> None:
        self._entries: dict[str, T] = {}
        self._pending: dict[str, asyncio.Task[T | None]] = {}

    def get(self, key: str) -> T | None:
        """Return the entry for ``key`` if it is loaded. Never awaits, never raises."""
        return self._entries.get(key)

    async def get_or_create(self, key: str, factory: Callable[[], Awaitable[T | None]]) -> T | None:
        """Return the entry for ``key``, building it with ``factory`` if absent.

        ``factory`` returns None when there is nothing to build (unknown session); that
        answer is not cached. Concurrent callers share one factory call, which runs in
        its own task: a caller that is cancelled (a client that went away) cancels
        neither the build nor the other callers. An exception from ``factory`` reaches
        every caller and nothing is stored.
        """
        entry = self._entries.get(key)
        if entry is not None:
            return entry
        task = self._pending.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._build(key, factory))
            # Mark the outcome retrieved even if every caller went away before it ended.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._pending[key] = task
        return await asyncio.shield(task)

    async def _build(self, key: str, factory: Callable[[], Awaitable[T | None]]) -> T | None:
        try:
            entry = await factory()
            if entry is not None:
                self._entries[key] = entry
            return entry
        finally:
            self._pending.pop(key, None)

    def pop(self, key: str) -> T | None:
        """Forget ``key`` and return what was stored. Never raises."""
        return self._entries.pop(key, None)

    def values(self) -> Iterator[T]:
        """Iterate over a snapshot of the loaded entries."""
        return iter(list(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget every entry (tests, shutdown)."""
        self._entries.clear()
