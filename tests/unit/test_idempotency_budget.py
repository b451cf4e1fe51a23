"""The process budget of the memory backend's idempotency keys (issue 26, point 2)."""

from __future__ import annotations

import gc
import tracemalloc

from sessions.backends.idempotency import IdempotencyKey, IdempotencyStore, KeyBudget


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _key(name: str) -> IdempotencyKey:
    return IdempotencyKey(name, "d" * 64)


def test_keys_expire_as_new_ones_are_written_not_only_when_read() -> None:
    clock = Clock()
    budget = KeyBudget(100, clock=clock)
    store = IdempotencyStore(10, 60, clock=clock, budget=budget)
    for name in ("a", "b"):
        store.remember(_key(name), 1, "E")
    clock.now += 60
    store.remember(_key("c"), 2, "E")
    assert budget.count == 1


def test_past_the_budget_a_store_drops_its_own_oldest_keys_never_anothers() -> None:
    budget = KeyBudget(3)
    busy, quiet = (IdempotencyStore(10, 60, budget=budget) for _ in range(2))
    quiet.remember(_key("q"), 1, "E")
    for n in range(5):
        busy.remember(_key(f"b{n}"), n, "E")
    assert (budget.count, quiet.recall(_key("q")) is not None) == (3, True)
    assert [busy.recall(_key(f"b{n}")) is not None for n in range(5)] == [False] * 3 + [True] * 2


def test_the_budget_expires_every_stores_old_keys_before_dropping_live_ones() -> None:
    clock = Clock()
    budget = KeyBudget(2, clock=clock)
    idle, busy = (IdempotencyStore(10, 60, clock=clock, budget=budget) for _ in range(2))
    idle.remember(_key("old"), 1, "E")
    busy.remember(_key("b0"), 1, "E")
    clock.now += 60
    busy.remember(_key("b1"), 2, "E")  # over: the sweep drops idle's expired key first
    assert budget.count == 2
    assert busy.recall(_key("b0")) is None  # (expired too)


def test_a_store_dropped_with_its_session_gives_its_keys_back() -> None:
    budget = KeyBudget(100)
    store = IdempotencyStore(10, 60, budget=budget)
    store.remember(_key("a"), 1, "E")
    del store
    gc.collect()
    assert budget.count == 0


def test_keys_of_100_sessions_stay_within_the_budget_and_leave_when_they_expire() -> None:
    # Scaled down ten times for speed under tracemalloc (the full 10,000 keys into each of
    # 100 sessions against the default budget: ``python -m bench.idempotency``).
    clock = Clock()
    budget = KeyBudget(20_000, clock=clock)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        stores = [IdempotencyStore(1000, 900, clock=clock, budget=budget) for _ in range(100)]
        for n in range(100_000):
            stores[n % 100].remember(IdempotencyKey(f"{n:036d}", f"{n:064x}"), n, "E")
        full = tracemalloc.get_traced_memory()[0] - before
        clock.now += 900  # the sessions closed; their keys' time to live passes
        for store in stores:
            store.expire()
        after = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    print(f"keys={budget.count} full={full / 2**20:.1f} MiB after={after / 2**20:.2f} MiB")
    assert budget.count == 0
    assert full <= 20_100 * 500  # the budget (+1 a store) of keys, ~480 B each
    assert after <= 256 * 1024  # (the 100 empty stores themselves)
