"""``sessions.bus.sweep``: one timer per event loop running many coarse deadlines.

A callback must run no earlier than its ``when`` (loop time) and no later than ``when +
slack`` plus :data:`MARGIN_S`. Waits are on the callbacks themselves (or on a later
"witness" deadline, run by the same or a later sweep), bounded by ``asyncio.timeout``."""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
from collections.abc import Hashable
from typing import Any

import pytest

from sessions.bus.sweep import MAX_PERIOD_S, MIN_PERIOD_S, Sweeper, sweeper

MARGIN_S = 0.1
"""Scheduling margin past ``when + slack`` (well below :data:`MAX_PERIOD_S`)."""


class _Fired:
    """A callback recording ``(key, loop time)`` per call; ``wait()`` for the n-th call."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.calls: list[tuple[Hashable, float]] = []
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def __call__(self, key: Any) -> None:
        self.calls.append((key, self.loop.time()))
        for n, waiter in self._waiters:
            if len(self.calls) >= n and not waiter.done():
                waiter.set_result(None)

    async def wait(self, n: int = 1, timeout: float = 1.0) -> None:
        waiter = self.loop.create_future()
        self._waiters.append((n, waiter))
        if len(self.calls) >= n:
            waiter.set_result(None)
        async with asyncio.timeout(timeout):
            await waiter


def _live_sweeps(loop: asyncio.AbstractEventLoop, sweep: Sweeper) -> int:
    """How many uncancelled timers of ``sweep`` the loop holds (asyncio's own heap)."""
    scheduled: list[Any] = loop._scheduled  # type: ignore[attr-defined]
    return len([h for h in scheduled if not h.cancelled() and h._callback == sweep._sweep])


async def _until_idle(sweep: Sweeper) -> None:
    """Wait (bounded) until ``sweep`` holds no timer handle: its last sweep found nothing."""
    async with asyncio.timeout(2 * MAX_PERIOD_S):
        while sweep._handle is not None:
            await asyncio.sleep(MIN_PERIOD_S)  # (a poll of the condition, not a cause)


@pytest.mark.asyncio
async def test_callback_runs_with_its_key_between_when_and_when_plus_slack() -> None:
    loop = asyncio.get_running_loop()
    sweep, fired = Sweeper(loop), _Fired(loop)
    when, slack = loop.time() + 0.05, 0.02
    sweep.call_at(("stream", 7), when, fired, slack)
    assert len(sweep) == 1
    await fired.wait()
    [(key, at)] = fired.calls
    assert key == ("stream", 7)
    assert when <= at <= when + slack + MARGIN_S


@pytest.mark.asyncio
async def test_a_deadline_already_past_runs_within_slack() -> None:
    loop = asyncio.get_running_loop()
    sweep, fired = Sweeper(loop), _Fired(loop)
    asked = loop.time()
    sweep.call_at("late", asked - 5, fired, 0.02)
    await fired.wait()
    assert fired.calls[0][1] <= asked + 0.02 + MARGIN_S


@pytest.mark.asyncio
async def test_cancel_prevents_the_callback() -> None:
    loop = asyncio.get_running_loop()
    sweep, cancelled, witness = Sweeper(loop), _Fired(loop), _Fired(loop)
    when = loop.time() + 0.02
    sweep.call_at("gone", when, cancelled, 0.01)
    sweep.call_at("witness", when + 0.01, witness, 0.01)  # due in the same or a later sweep
    sweep.cancel("gone")
    sweep.cancel("never-there")  # never raises
    assert len(sweep) == 1
    await witness.wait()
    assert cancelled.calls == []


@pytest.mark.asyncio
async def test_a_second_call_at_with_the_same_key_replaces_the_first() -> None:
    loop = asyncio.get_running_loop()
    sweep, first, second, witness = Sweeper(loop), _Fired(loop), _Fired(loop), _Fired(loop)
    now = loop.time()
    sweep.call_at("k", now + 0.02, first, 0.01)
    sweep.call_at("k", now + 0.08, second, 0.01)  # moved later
    assert len(sweep) == 1
    await second.wait()
    assert second.calls[0][1] >= now + 0.08  # the new deadline, not the old one
    sweep.call_at("witness", loop.time() + 0.03, witness, 0.01)
    await witness.wait()
    assert first.calls == []
    assert [key for key, _ in second.calls] == ["k"]  # once


@pytest.mark.asyncio
async def test_a_replacement_may_move_a_deadline_earlier() -> None:
    loop = asyncio.get_running_loop()
    sweep, far, near = Sweeper(loop), _Fired(loop), _Fired(loop)
    now = loop.time()
    sweep.call_at("k", now + 60, far, 0.01)
    sweep.call_at("k", now + 0.02, near, 0.01)
    await near.wait()
    assert far.calls == []
    assert len(sweep) == 0  # the far deadline went with the replacement


@pytest.mark.asyncio
async def test_a_callback_moving_another_due_deadline_later_defers_it() -> None:
    loop = asyncio.get_running_loop()
    sweep, moved, later = Sweeper(loop), _Fired(loop), loop.time() + 0.08

    def mover(_key: Any) -> None:
        sweep.call_at("b", later, moved, 0.01)

    when = loop.time() + 0.02
    sweep.call_at("a", when, mover, 0.01)
    sweep.call_at("b", when, moved, 0.01)  # due in the same sweep as "a", swept after it
    await moved.wait()
    assert later <= moved.calls[0][1] <= later + 0.01 + MARGIN_S


@pytest.mark.asyncio
async def test_the_timer_stops_when_no_entries_remain() -> None:
    loop = asyncio.get_running_loop()
    sweep, fired = Sweeper(loop), _Fired(loop)
    assert sweep._handle is None  # nothing yet: no timer
    now = loop.time()
    for i in range(3):
        sweep.call_at(i, now + 0.01 * (i + 1), fired, 0.01)
    assert _live_sweeps(loop, sweep) == 1  # one timer for all of them
    await fired.wait(3)
    await _until_idle(sweep)
    assert len(sweep) == 0
    assert sweep._handle is None
    assert _live_sweeps(loop, sweep) == 0


@pytest.mark.asyncio
async def test_the_timer_stops_after_the_last_entry_is_cancelled() -> None:
    loop = asyncio.get_running_loop()
    sweep, fired = Sweeper(loop), _Fired(loop)
    sweep.call_at("k", loop.time() + 60, fired, 0.01)
    sweep.cancel("k")
    await _until_idle(sweep)
    assert len(sweep) == 0
    assert _live_sweeps(loop, sweep) == 0
    assert fired.calls == []


@pytest.mark.asyncio
async def test_a_shorter_slack_keeps_a_single_timer() -> None:
    loop = asyncio.get_running_loop()
    sweep, fired = Sweeper(loop), _Fired(loop)
    now = loop.time()
    for i, slack in enumerate((0.5, 0.2, 0.05, 0.01)):
        sweep.call_at(i, now + 0.02, fired, slack)
        assert _live_sweeps(loop, sweep) == 1
    await fired.wait(4)
    assert all(at <= now + 0.02 + 0.01 + MARGIN_S for _, at in fired.calls)


@pytest.mark.asyncio
async def test_a_later_shorter_slack_does_not_postpone_an_armed_sweep() -> None:
    # "A" asks for slack 0.4; just before the sweep that would run it, "B" asks for a
    # shorter slack (0.3). A must still run by its when + 0.4 (module docstring).
    loop = asyncio.get_running_loop()
    sweep, a, b = Sweeper(loop), _Fired(loop), _Fired(loop)
    when_a = loop.time()
    sweep.call_at("A", when_a, a, 0.4)
    assert sweep._handle is not None
    armed = sweep._handle.when()
    loop.call_at(armed - 0.03, lambda: sweep.call_at("B", loop.time() + 60, b, 0.3))
    await a.wait(timeout=2.0)
    sweep.cancel("B")
    assert a.calls[0][1] <= when_a + 0.4 + MARGIN_S


@pytest.mark.asyncio
async def test_a_raising_callback_is_logged_and_the_rest_of_its_sweep_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # (pytest attaches caplog's handler to non-propagating loggers such as "qwenweb" too)
    loop = asyncio.get_running_loop()
    sweep, fired = Sweeper(loop), _Fired(loop)
    after_raise: list[bool] = []  # set by a call_soon of the raising callback

    def boom(key: Any) -> None:
        loop.call_soon(after_raise.append, True)
        raise RuntimeError(f"boom {key}")

    def still_same_sweep(key: Any) -> None:
        assert not after_raise  # (not yet: same synchronous sweep as the raise)
        fired(key)

    when = loop.time() + 0.02
    sweep.call_at("boom", when, boom, 0.01)  # first in the dict: swept first
    sweep.call_at("b", when, still_same_sweep, 0.01)
    sweep.call_at("c", when, still_same_sweep, 0.01)
    await fired.wait(2)
    assert [key for key, _ in fired.calls] == ["b", "c"]
    failed = [r for r in caplog.records if r.getMessage() == "sweep_callback_failed"]
    assert len(failed) == 1
    assert failed[0].name == "qwenweb.bus"
    assert failed[0].levelno == logging.ERROR
    assert failed[0].exc_info is not None
    assert isinstance(failed[0].exc_info[1], RuntimeError)
    assert len(sweep) == 0


@pytest.mark.asyncio
async def test_the_period_never_goes_below_min_period() -> None:
    loop = asyncio.get_running_loop()
    sweep, fired = Sweeper(loop), _Fired(loop)
    asked = loop.time()
    sweep.call_at("k", asked, fired, MIN_PERIOD_S / 100)  # already due, tiny slack
    assert sweep._period == MIN_PERIOD_S
    assert sweep._handle is not None
    assert sweep._handle.when() >= asked + MIN_PERIOD_S
    await fired.wait()
    assert fired.calls[0][1] >= asked + MIN_PERIOD_S  # swept one minimal period later
    sweep.call_at("zero", asked, fired, 0.0)
    assert sweep._period == MIN_PERIOD_S
    await fired.wait(2)


@pytest.mark.asyncio
async def test_the_period_never_goes_above_max_period() -> None:
    loop = asyncio.get_running_loop()
    sweep, fired = Sweeper(loop), _Fired(loop)
    sweep.call_at("k", loop.time() + 3600, fired, 10 * MAX_PERIOD_S)
    after = loop.time()
    assert sweep._period == MAX_PERIOD_S
    assert sweep._handle is not None
    assert sweep._handle.when() <= after + MAX_PERIOD_S
    sweep.cancel("k")


@pytest.mark.asyncio
async def test_sweeper_is_one_per_loop() -> None:
    loop = asyncio.get_running_loop()
    mine = sweeper()
    assert sweeper() is mine is sweeper(loop)
    other = asyncio.new_event_loop()
    try:
        theirs = sweeper(other)
        assert theirs is not mine
        assert sweeper(other) is theirs
    finally:
        other.close()


def test_sweeper_without_a_running_loop_raises() -> None:
    with pytest.raises(RuntimeError):
        sweeper()


def test_a_sweeper_does_not_keep_its_loop_alive() -> None:
    loop = asyncio.new_event_loop()
    sweep = sweeper(loop)
    loop.close()
    gone = weakref.ref(loop)
    del loop
    gc.collect()
    assert gone() is None
    sweep.call_at("k", 0.0, lambda _key: None, 0.01)  # its loop gone: no timer, no error
    assert sweep._handle is None
    sweep._sweep()  # a sweep after the loop went: nothing to do, no error


def test_a_sweeper_with_a_pending_deadline_does_not_keep_its_loop_alive() -> None:
    # A stream's deadline still pending when its loop is closed (a worker's or a test's
    # loop that ends with open streams): loop and sweeper must still be collectable.
    loop = asyncio.new_event_loop()
    sweep = sweeper(loop)
    sweep.call_at("k", loop.time() + 60, lambda _key: None, 0.01)
    assert sweep._handle is not None  # the loop holds a timer of the sweeper
    loop.close()
    gone, sweep_gone = weakref.ref(loop), weakref.ref(sweep)
    del loop, sweep
    gc.collect()
    assert (gone(), sweep_gone()) == (None, None)
