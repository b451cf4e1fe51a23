"""Unit tests for the per-session registry: one bus per session, built lazily (EB-1, EB-11).

The contract says little about the registry beyond "one bus per session" (EB-1) and "one
event loop owns it" (EB-11); the rest follows its docstrings. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from sessions.bus import EventBus, Registry

pytestmark = pytest.mark.asyncio


def counting_factory(
    gate: asyncio.Event | None = None, result: str = "bus"
) -> tuple[list[int], Callable[[], Awaitable[EventBus | None]]]:
    """A factory that counts its calls and, given a gate, waits for it before building."""
    calls: list[int] = []

    async def factory() -> EventBus | None:
        calls.append(1)
        if gate is not None:
            await gate.wait()
        if result == "error":
            raise RuntimeError("cannot load session")
        return EventBus(3) if result == "bus" else None

    return calls, factory


async def test_get_returns_none_for_unknown_key():  # EB-1
    registry: Registry[EventBus] = Registry()
    assert registry.get("s") is None
    assert len(registry) == 0


async def test_get_or_create_builds_once_and_caches():  # EB-1
    registry: Registry[EventBus] = Registry()
    calls, factory = counting_factory()
    async with asyncio.timeout(1):
        first = await registry.get_or_create("s", factory)
        second = await registry.get_or_create("s", factory)
    assert first is second is registry.get("s")
    assert len(calls) == 1


async def test_concurrent_get_or_create_shares_one_factory_call():  # EB-1: one bus per session
    registry: Registry[EventBus] = Registry()
    gate = asyncio.Event()
    calls, factory = counting_factory(gate)
    tasks = [asyncio.create_task(registry.get_or_create("s", factory)) for _ in range(3)]
    await asyncio.sleep(0)  # one step: every task starts and blocks on the build
    gate.set()
    async with asyncio.timeout(1):
        first, second, third = await asyncio.gather(*tasks)
    assert first is second is third is registry.get("s")
    assert len(calls) == 1


async def test_different_keys_build_independently():  # EB-1
    registry: Registry[EventBus] = Registry()
    _, blocked = counting_factory(asyncio.Event())  # never released
    _, ready = counting_factory()
    pending = asyncio.create_task(registry.get_or_create("a", blocked))
    async with asyncio.timeout(1):
        assert await registry.get_or_create("b", ready) is registry.get("b")
    pending.cancel()
    async with asyncio.timeout(1):
        with pytest.raises(asyncio.CancelledError):
            await pending
    assert registry.get("a") is None


async def test_factory_returning_none_is_not_cached():  # EB-1
    registry: Registry[EventBus] = Registry()
    calls, factory = counting_factory(result="none")
    async with asyncio.timeout(1):
        assert await registry.get_or_create("s", factory) is None
        assert await registry.get_or_create("s", factory) is None
    assert len(calls) == 2
    assert len(registry) == 0


async def test_concurrent_callers_share_a_none_answer():  # EB-1
    registry: Registry[EventBus] = Registry()
    gate = asyncio.Event()
    calls, factory = counting_factory(gate, result="none")
    tasks = [asyncio.create_task(registry.get_or_create("s", factory)) for _ in range(2)]
    await asyncio.sleep(0)  # one step: both tasks start and block on the build
    gate.set()
    async with asyncio.timeout(1):
        assert await asyncio.gather(*tasks) == [None, None]
    assert len(calls) == 1


async def test_factory_error_reaches_every_caller_and_nothing_is_stored():  # EB-1
    registry: Registry[EventBus] = Registry()
    gate = asyncio.Event()
    calls, factory = counting_factory(gate, result="error")
    tasks = [asyncio.create_task(registry.get_or_create("s", factory)) for _ in range(2)]
    await asyncio.sleep(0)  # one step: both tasks start and block on the build
    gate.set()
    async with asyncio.timeout(1):
        results = await asyncio.gather(*tasks, return_exceptions=True)
    assert [type(r) for r in results] == [RuntimeError, RuntimeError]
    assert (len(calls), registry.get("s")) == (1, None)


async def test_after_factory_error_next_call_builds_again():  # EB-1
    registry: Registry[EventBus] = Registry()
    _, failing = counting_factory(result="error")
    _, working = counting_factory()
    async with asyncio.timeout(1):
        with pytest.raises(RuntimeError, match="cannot load session"):
            await registry.get_or_create("s", failing)
        bus = await registry.get_or_create("s", working)
    assert bus is not None
    assert registry.get("s") is bus


async def test_cancelled_waiter_does_not_cancel_the_build():  # EB-1
    registry: Registry[EventBus] = Registry()
    gate = asyncio.Event()
    calls, factory = counting_factory(gate)
    builder = asyncio.create_task(registry.get_or_create("s", factory))
    waiter = asyncio.create_task(registry.get_or_create("s", factory))
    await asyncio.sleep(0)  # one step: both tasks start and block on the build
    waiter.cancel()
    gate.set()
    async with asyncio.timeout(1):
        assert await builder is registry.get("s") is not None
        with pytest.raises(asyncio.CancelledError):
            await waiter
    assert len(calls) == 1


async def test_cancelled_caller_does_not_cancel_the_shared_build():  # EB-1
    registry: Registry[EventBus] = Registry()
    release = asyncio.Event()
    calls, factory = counting_factory(release)
    first = asyncio.create_task(registry.get_or_create("s", factory))
    await asyncio.sleep(0)  # one step: the task starts and blocks on the build
    first.cancel()
    async with asyncio.timeout(1):
        with pytest.raises(asyncio.CancelledError):
            await first
        second = asyncio.create_task(registry.get_or_create("s", counting_factory()[1]))
        release.set()
        bus = await second
    assert registry.get("s") is bus is not None
    assert len(calls) == 1


async def test_pop_forgets_and_returns_the_entry():  # EB-1
    registry: Registry[EventBus] = Registry()
    _, factory = counting_factory()
    async with asyncio.timeout(1):
        bus = await registry.get_or_create("s", factory)
    assert registry.pop("s") is bus
    assert (registry.get("s"), registry.pop("s"), len(registry)) == (None, None, 0)


async def test_values_is_a_snapshot_and_clear_forgets_everything():  # EB-1
    registry: Registry[EventBus] = Registry()
    _, factory = counting_factory()
    async with asyncio.timeout(1):
        for key in ("a", "b"):
            await registry.get_or_create(key, factory)
    seen = []
    for bus in registry.values():
        registry.pop("a")  # changing the registry while iterating is allowed
        seen.append(bus)
    assert len(seen) == 2
    registry.clear()
    assert (len(registry), list(registry.values())) == (0, [])
