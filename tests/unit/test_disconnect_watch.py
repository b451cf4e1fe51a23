"""``sessions.transport.disconnect.DisconnectWatch``: ``http.disconnect`` noticed by
callback, with an ``async def`` receive (uvicorn, daphne: one task per pending call) and
with one returning plain futures (granian: no task). Waits are on the events themselves
or on :func:`_after_ready_callbacks`, each bounded by ``asyncio.timeout``."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import pytest_asyncio

from sessions.transport.disconnect import DisconnectWatch

REQUEST = {"type": "http.request", "body": b"", "more_body": False}
DISCONNECT = {"type": "http.disconnect"}


class _OnDisconnect:
    """``on_disconnect``: counts calls; ``wait()`` for the first (bounded)."""

    def __init__(self) -> None:
        self.calls, self.called = 0, asyncio.Event()

    def __call__(self) -> None:
        self.calls += 1
        self.called.set()

    async def wait(self) -> None:
        async with asyncio.timeout(1):
            await self.called.wait()


class _FutureReceive:
    """A granian-like ``receive``: each call returns a new plain future of the loop."""

    def __init__(self, factory: type[asyncio.Future[Any]] = asyncio.Future) -> None:
        self.factory, self.called = factory, asyncio.Event()
        self.futures: list[asyncio.Future[Any]] = []

    def __call__(self) -> asyncio.Future[Any]:
        future = self.factory(loop=asyncio.get_running_loop())
        self.futures.append(future)
        self.called.set()
        return future

    async def wait_calls(self, n: int) -> None:
        async with asyncio.timeout(1):
            while len(self.futures) < n:
                self.called.clear()
                await self.called.wait()


class _Uncancellable(asyncio.Future[Any]):  # (its message may arrive after close())
    def cancel(self, msg: Any | None = None) -> bool:
        return False


def _ended_quietly(watch: DisconnectWatch, on_disconnect: _OnDisconnect) -> None:
    """The watch ended without calling ``on_disconnect`` or counting a disconnect."""
    assert on_disconnect.calls == 0
    assert not watch.disconnected


def _nothing_reported(loop_errors: list[dict[str, Any]]) -> None:
    """Once the test dropped its references: no exception went unretrieved (the loop
    reports one when its future or task is collected)."""
    gc.collect()
    assert loop_errors == []


async def _after_ready_callbacks() -> None:
    """Return once the callbacks already queued (a resolved future's) have run: FIFO."""
    loop = asyncio.get_running_loop()
    turn = loop.create_future()
    loop.call_soon(turn.set_result, None)
    async with asyncio.timeout(1):
        await turn


@pytest_asyncio.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """What reaches the loop's exception handler (e.g. "exception was never retrieved")."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    yield errors
    loop.set_exception_handler(None)


@contextmanager
def _tasks_created() -> Iterator[list[asyncio.Task[Any]]]:
    """Every task created on the running loop inside the block (a task factory)."""
    loop = asyncio.get_running_loop()
    created: list[asyncio.Task[Any]] = []

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        created.append(task)
        return task

    loop.set_task_factory(factory)
    try:
        yield created
    finally:
        loop.set_task_factory(None)


@pytest.mark.asyncio
async def test_the_unretrieved_exception_probe_sees_a_dropped_failure(
    loop_errors: list[dict[str, Any]],
) -> None:
    # The probe the tests below rely on: a failed future nobody looked at is reported.
    future = asyncio.get_running_loop().create_future()
    future.set_exception(OSError("reset"))
    del future
    gc.collect()
    assert [e["message"] for e in loop_errors] == ["Future exception was never retrieved"]


@pytest.mark.asyncio
async def test_coroutine_receive_disconnect_calls_on_disconnect_once() -> None:
    release, second_call = asyncio.Event(), asyncio.Event()
    calls = 0

    async def receive() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            return REQUEST
        second_call.set()
        await release.wait()
        return DISCONNECT

    on_disconnect = _OnDisconnect()
    with _tasks_created() as tasks_created:
        watch = DisconnectWatch(receive, on_disconnect)
    assert len(tasks_created) == 1  # (so the no-task check below can fail)
    async with asyncio.timeout(1):
        await second_call.wait()  # the request message was read and dropped
    assert (watch.disconnected, on_disconnect.calls) == (False, 0)
    release.set()
    await on_disconnect.wait()
    await _after_ready_callbacks()
    assert (watch.disconnected, on_disconnect.calls) == (True, 1)
    assert calls == 2  # no receive() after the disconnect
    watch.close()  # after the end: nothing to do
    assert on_disconnect.calls == 1


@pytest.mark.asyncio
async def test_future_receive_disconnect_calls_on_disconnect_once_without_a_task() -> None:
    before = asyncio.all_tasks()
    receive, on_disconnect = _FutureReceive(), _OnDisconnect()
    with _tasks_created() as tasks_created:
        watch = DisconnectWatch(receive, on_disconnect)
        receive.futures[0].set_result(REQUEST)
        await receive.wait_calls(2)  # read, dropped, the next receive() pending
        assert not watch.disconnected
        assert asyncio.all_tasks() == before
        receive.futures[1].set_result(DISCONNECT)
        await on_disconnect.wait()
        await _after_ready_callbacks()
    assert on_disconnect.calls == 1
    assert watch.disconnected
    assert len(receive.futures) == 2
    assert asyncio.all_tasks() == before
    assert tasks_created == []


@pytest.mark.asyncio
async def test_close_cancels_the_pending_future_and_no_call_follows() -> None:
    receive, on_disconnect = _FutureReceive(), _OnDisconnect()
    watch = DisconnectWatch(receive, on_disconnect)
    watch.close()
    assert receive.futures[0].cancelled()
    watch.close()  # idempotent
    await _after_ready_callbacks()
    assert on_disconnect.calls == 0
    assert not watch.disconnected
    assert len(receive.futures) == 1


@pytest.mark.asyncio
async def test_close_right_after_the_disconnect_resolved_wins() -> None:
    # The future is resolved (its callback queued, not yet run) when close() comes.
    receive, on_disconnect = _FutureReceive(), _OnDisconnect()
    watch = DisconnectWatch(receive, on_disconnect)
    receive.futures[0].set_result(DISCONNECT)
    watch.close()
    await _after_ready_callbacks()
    assert on_disconnect.calls == 0
    assert not watch.disconnected


@pytest.mark.asyncio
async def test_close_then_a_disconnect_on_an_uncancellable_future_is_ignored() -> None:
    receive, on_disconnect = _FutureReceive(_Uncancellable), _OnDisconnect()
    watch = DisconnectWatch(receive, on_disconnect)
    watch.close()
    assert not receive.futures[0].done()  # it refused the cancel
    receive.futures[0].set_result(DISCONNECT)  # the message arrives later
    await _after_ready_callbacks()
    assert on_disconnect.calls == 0
    assert not watch.disconnected


@pytest.mark.asyncio
async def test_close_then_a_coroutine_receive_that_still_answers_disconnect() -> None:
    # receive() is cancelled by close(), swallows it and answers http.disconnect later.
    release, started, cancelled = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def receive() -> dict[str, Any]:
        started.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            cancelled.set()
            async with asyncio.timeout(1):  # (bounded: a second cancel would be swallowed)
                await release.wait()
        return DISCONNECT

    on_disconnect = _OnDisconnect()
    with _tasks_created() as tasks_created:
        watch = DisconnectWatch(receive, on_disconnect)
    async with asyncio.timeout(1):
        await started.wait()
    watch.close()
    async with asyncio.timeout(1):
        await cancelled.wait()  # the pending receive() was cancelled
    release.set()
    async with asyncio.timeout(1):
        [message] = await asyncio.gather(*tasks_created)
    assert message == DISCONNECT  # it did arrive
    await _after_ready_callbacks()
    assert on_disconnect.calls == 0
    assert not watch.disconnected


@pytest.mark.asyncio
async def test_failing_future_receive_ends_the_watch_quietly(
    loop_errors: list[dict[str, Any]],
) -> None:
    receive, on_disconnect = _FutureReceive(), _OnDisconnect()
    watch = DisconnectWatch(receive, on_disconnect)
    receive.futures[0].set_exception(OSError("reset"))
    await _after_ready_callbacks()
    _ended_quietly(watch, on_disconnect)
    assert len(receive.futures) == 1  # no receive() after the failure
    del watch, receive
    _nothing_reported(loop_errors)


@pytest.mark.asyncio
async def test_failing_coroutine_receive_ends_the_watch_quietly(
    loop_errors: list[dict[str, Any]],
) -> None:
    async def receive() -> dict[str, Any]:
        raise OSError("reset")

    on_disconnect = _OnDisconnect()
    with _tasks_created() as tasks_created:
        watch = DisconnectWatch(receive, on_disconnect)
        async with asyncio.timeout(1):
            await asyncio.wait(tasks_created)  # (its callbacks ran before wait's own)
        await _after_ready_callbacks()
    assert len(tasks_created) == 1  # one receive(): none after the failure
    _ended_quietly(watch, on_disconnect)
    del watch
    tasks_created.clear()
    _nothing_reported(loop_errors)


@pytest.mark.asyncio
async def test_a_receive_failing_after_close_is_not_reported(
    loop_errors: list[dict[str, Any]],
) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def receive() -> dict[str, Any]:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise OSError("reset while cancelled") from None
        return DISCONNECT  # (never: the event is never set)

    on_disconnect = _OnDisconnect()
    with _tasks_created() as tasks_created:
        watch = DisconnectWatch(receive, on_disconnect)
    async with asyncio.timeout(1):
        await started.wait()
    watch.close()
    async with asyncio.timeout(1):
        await asyncio.wait(tasks_created)
    await _after_ready_callbacks()
    assert cancelled.is_set()
    assert on_disconnect.calls == 0
    del watch
    tasks_created.clear()
    _nothing_reported(loop_errors)


def test_a_receive_that_raises_before_awaiting_ends_the_watch_quietly() -> None:
    calls: list[str] = []

    def receive() -> Any:
        raise RuntimeError("the server's receive failed at once")

    watch = DisconnectWatch(receive, lambda: calls.append("disconnect"))
    assert not watch.disconnected
    watch.close()  # nothing pending: still fine
    assert calls == []
