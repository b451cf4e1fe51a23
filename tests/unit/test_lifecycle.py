"""The shutdown signal hook of ``sessions.ops.lifecycle`` (for servers like uvicorn).

The end-to-end tests stop real servers with SIGINT and SIGTERM; these check the order:
our sequence first, the server's own handler after it, and a second signal at once. And
the parent's death: the whole sequence at once, then one exit (the process itself:
tests/e2e/test_process_tree.py).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator

import pytest

from sessions.ops import lifecycle
from sessions.ops.parent_death import PARENT_DEATH_SIGNAL
from sessions.process_state import process_state

pytestmark = pytest.mark.asyncio


@pytest.fixture
def listener() -> Iterator[lifecycle.Lifecycle]:
    """A lifecycle of the test's own (nothing signalled yet)."""
    yield lifecycle.Lifecycle()
    process_state.shutting_down = False


async def test_first_signal_runs_the_shutdown_sequence_before_the_servers_handler(listener):
    loop = asyncio.get_running_loop()
    called = asyncio.Event()
    seen: list[bool] = []

    def server_handler(signum, frame):
        seen.append(process_state.shutting_down)  # our sequence ran first
        called.set()

    handler = listener.chained_handler(loop, server_handler)
    handler(signal.SIGTERM, None)
    assert not called.is_set()  # not yet: the sequence runs on the loop first
    async with asyncio.timeout(2):
        await called.wait()
    assert seen == [True]


async def test_second_signal_goes_to_the_server_at_once(listener):
    loop = asyncio.get_running_loop()
    calls: list[int] = []
    both = asyncio.Event()

    def server_handler(signum, frame):
        calls.append(signum)
        if len(calls) == 2:
            both.set()

    handler = listener.chained_handler(loop, server_handler)
    handler(signal.SIGINT, None)
    handler(signal.SIGINT, None)  # e.g. uvicorn's "press CTRL+C again to force quit"
    assert calls == [signal.SIGINT]  # at once, before the first one's sequence ended
    async with asyncio.timeout(2):
        await both.wait()  # the first signal reaches the server after its sequence


async def test_drain_signal_starts_the_drain_without_the_shutdown(listener):
    loop = asyncio.get_running_loop()
    handler = listener.drain_handler(loop)
    handler(lifecycle.DRAIN_SIGNAL, None)
    async with asyncio.timeout(2):
        while not process_state.draining:
            await asyncio.sleep(0)  # the handler hands the start to the loop
    assert process_state.draining
    process_state.draining = False


async def test_parent_death_ends_everything_then_exits_once(listener):
    loop = asyncio.get_running_loop()
    exits: list[int] = []
    exited = asyncio.Event()

    def exit_process(status: int) -> None:
        exits.append(status)
        exited.set()

    handler = listener.orphan_handler(loop, exit_process)
    handler(PARENT_DEATH_SIGNAL, None)
    handler(PARENT_DEATH_SIGNAL, None)  # a second signal starts nothing more
    async with asyncio.timeout(lifecycle.ORPHAN_EXIT_S + 1):
        await exited.wait()
    assert exits == [0]  # the sequence finished in time, and the watchdog stood down
    assert (process_state.shutting_down, process_state.draining) == (True, True)
    process_state.draining = False
