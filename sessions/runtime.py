"""The server's event loop, seen from other threads: :class:`ServerLoop`.

Every bus belongs to the event loop that serves the streams (EB-11). The first bus built
or operator feed opened captures that loop (:meth:`ServerLoop.attach`, which announces it
through :meth:`sessions.hooks.Hooks.loop_attached`, so the operator side starts its
writers there); code on other threads — the admin's synchronous views — hands work to it
with :meth:`~ServerLoop.run` / :meth:`~ServerLoop.call` / :meth:`~ServerLoop.call_soon`
and never touches a bus directly. Each backend owns one :class:`ServerLoop`
(``backend.loop``). This module imports nothing from Django.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from asgiref.sync import async_to_sync

from sessions.hooks import Hooks

__all__ = ["ServerLoop", "ServerLoopUnavailableError"]

_T = TypeVar("_T")


class ServerLoopUnavailableError(RuntimeError):
    """Raised when work must run on the server's loop and there is none (or it is closed)."""


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def _current_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _submit(
    coroutine: Coroutine[Any, Any, _T], loop: asyncio.AbstractEventLoop
) -> concurrent.futures.Future[_T]:
    """``run_coroutine_threadsafe`` in a fresh context: the caller's context variables must
    not follow the coroutine (nor the tasks it starts) onto the loop. A Django request's
    thread carries asgiref's ``ThreadSensitiveContext``, which would send the coroutine's
    ``database_sync_to_async`` calls to that very thread, blocked waiting for it."""
    return contextvars.Context().run(asyncio.run_coroutine_threadsafe, coroutine, loop)


def _wait_for(future: concurrent.futures.Future[_T], timeout_s: float, loop_name: str) -> _T:
    """The result of ``future``; after ``timeout_s`` it is cancelled and TimeoutError
    (naming ``loop_name``) raised. Whatever the coroutine raised is raised here."""
    try:
        return future.result(timeout_s)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise TimeoutError(f"{loop_name} did not answer within {timeout_s} s") from None


class ServerLoop:
    """The one event loop of this process that owns the buses, and the bridge to it.

    Args:
        hooks: where :meth:`attach` announces a newly captured loop.
    """

    def __init__(self, hooks: Hooks) -> None:
        self._hooks = hooks
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self) -> asyncio.AbstractEventLoop:
        """Capture the running loop as the server's loop; announce it once per loop.

        Idempotent; never awaits.

        Raises:
            RuntimeError: no loop is running in this thread.
        """
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self._hooks.loop_attached(loop)
        return loop

    def get(self) -> asyncio.AbstractEventLoop | None:
        """Return the captured loop, or None if none was captured or it is closed."""
        loop = self._loop
        return loop if loop is not None and not loop.is_closed() else None

    def run(
        self, coroutine: Callable[[], Coroutine[Any, Any, _T]], *, timeout_s: float = 10.0
    ) -> _T:
        """Run ``coroutine()`` on the server's loop from another thread; return its result.

        Blocks the calling thread for at most ``timeout_s`` seconds.

        Raises:
            ServerLoopUnavailableError: no server loop (no bus was ever built here).
            RuntimeError: called on the loop's own thread (it would wait for itself).
            TimeoutError: the coroutine did not finish in time (it is cancelled).
            Exception: whatever the coroutine raised.
        """
        loop = self.get()
        if loop is None:
            raise ServerLoopUnavailableError("no server event loop in this process")
        if _on_loop_thread(loop):
            raise RuntimeError("ServerLoop.run() called on the server loop; await instead")
        return _wait_for(_submit(coroutine(), loop), timeout_s, "the server loop")

    def call(self, function: Callable[[], _T], *, default: _T, timeout_s: float = 5.0) -> _T:
        """Return ``function()`` computed on the server's loop (directly if this is it).

        ``function`` must not await (it reads buses: ``stats()``, the registry). Returns
        ``default`` when there is no server loop (nothing is loaded, nothing to read).
        Raises ``TimeoutError`` after ``timeout_s`` seconds and whatever ``function``
        raises.
        """
        loop = self.get()
        if loop is None:
            return default
        if _on_loop_thread(loop):
            return function()

        async def call() -> _T:
            return function()

        return self.run(call, timeout_s=timeout_s)

    def call_soon(self, function: Callable[..., object], *args: Any) -> bool:
        """Schedule ``function(*args)`` on the server's loop from any thread; never waits.

        Returns False (and does nothing) when there is no server loop. Never raises.
        """
        loop = self.get()
        if loop is None:
            return False
        try:
            loop.call_soon_threadsafe(function, *args)
        except RuntimeError:  # closed between the check and the call
            return False
        return True

    def adopt_request_loop(self, *, timeout_s: float = 5.0) -> asyncio.AbstractEventLoop | None:
        """From a sync view's worker thread: return the server loop, adopting the request's.

        When this process has no server loop yet (it never built a bus), the loop serving
        this thread's request becomes it (:meth:`attach` runs there): the loop
        ``asgiref.sync.async_to_sync`` runs coroutines on from this thread, which is the
        one Django's ``ASGIHandler`` runs on (it awaits this thread, so it answers). For
        operator actions that must reach other processes from a process that has loaded
        nothing. Returns None outside a request served over
        ASGI (Django's test client, WSGI).

        Raises:
            TimeoutError: the request's loop did not answer within ``timeout_s``.
        """
        loop = self.get()
        if loop is not None:
            return loop
        if _running_loop() is not None:
            return None  # a thread that runs a loop serves no sync view (async_to_sync refuses it)
        # asgiref's public bridge runs the coroutine on the loop of this thread's request
        # (SyncToAsync's caller, same process); without one it runs it on a loop of its own,
        # closed when async_to_sync returns.
        request_loop = async_to_sync(_current_loop)()
        if request_loop.is_closed() or not request_loop.is_running():
            return None

        async def attach() -> asyncio.AbstractEventLoop:
            return self.attach()

        return _wait_for(_submit(attach(), request_loop), timeout_s, "the request's loop")
