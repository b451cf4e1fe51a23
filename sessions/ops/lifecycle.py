"""Start and stop the operator machinery with the server's event loop.

:data:`listener` (connected to :data:`sessions.hooks.hooks` in ``AppConfig.ready``) hears
of each server loop the backend attaches: it starts the records writer
(:data:`sessions.ops.records.recorder`) and the dashboard feed
(:data:`sessions.ops.feed.feed`) on that loop and installs the shutdown hooks below.

What "never lose them on a clean shutdown" means here
    A *clean shutdown* is the server process asked to stop with SIGINT or SIGTERM and
    allowed to finish: ``python -m qwenweb.serve`` (granian, or daphne with
    ``--server daphne``), ``manage.py runserver`` and ``daphne`` (Twisted), and uvicorn.
    Not ``kill -9``, not a crash, not a power cut: those lose at most the last
    ``RECORDS_FLUSH_INTERVAL_S`` seconds of records.

    On a clean shutdown every record change made before the process exits is in the
    database when it exits — including the end of every stream that was still open,
    recorded as ``server_shutdown``. The bus counters of every loaded session are saved
    on its row too (``Backend.flush_all``), so the admin's fallback numbers
    are the final ones. The sequence, :func:`shutdown`, runs on the loop:

    0. the graceful drain (:func:`drain`): ``/readyz`` turns 503, new streams get
       ``stream_error`` (``server_draining``) and a jittered ``retry:``, and the open
       streams end one by one spread over ``DRAIN_S`` seconds, each with the same
       terminal frame and its own jittered ``retry:``: their clients resume on the other
       processes without a reconnect storm;
    1. wait until every open stream has recorded its end, at most
       :data:`SHUTDOWN_TIMEOUT_S`; close those still open as ``server_shutdown``;
    2. write every pending record, then save each loaded session's counters.

    How the streams come to an end, and where the sequence is hooked:

    - granian (``python -m qwenweb.serve``), and any server sending the ASGI lifespan:
      :class:`LifespanApp` attaches the loop at ``lifespan.startup``. granian's main
      process would stop its workers at once on SIGTERM (a worker closes its listener
      first), so ``qwenweb.granian_server`` sends each worker :data:`DRAIN_SIGNAL` first
      (the drain, while it listens) and the SIGTERM ``DRAIN_S`` + 0.5 s later; the worker's
      ``lifespan.shutdown`` then runs (or joins) the sequence.
    - Any server that installed SIGINT/SIGTERM handlers (Twisted for daphne, ``serve``
      and ``runserver --noreload``; uvicorn): ours wraps them. On the first signal the
      sequence runs while the server still listens (the drain, then
      ``bus.disconnect_all("server_shutdown")`` for any straggler), and only then is the
      server's own handler called, so the server starts its shutdown with every stream
      ended and everything written. A second signal goes to the server at once (uvicorn:
      force quit; Twisted: stop now, without the rest of the drain).
    - Twisted, stopped some other way (``reactor.stop()``): daphne's own ``before
      shutdown`` trigger cancels every application instance (each stream records
      ``server_shutdown`` in its ``finally``); ours, another ``before shutdown``
      trigger, runs the sequence without a drain window, and the reactor
      waits for both before it stops.
    - uvicorn must be told to stop this way because after
      a SIGTERM it re-raises the signal with its default action, which ends the process
      without running ``atexit``.
    - In every case, an ``atexit`` hook writes whatever is still pending synchronously,
      closing any connection still open as ``server_shutdown``
      (:meth:`Recorder.flush_sync <sessions.ops.records.Recorder.flush_sync>`).

What happens when the parent dies
    A granian worker (and the server ``manage.py demo`` starts) gets
    :data:`~sessions.ops.parent_death.PARENT_DEATH_SIGNAL` when its parent dies, even by
    ``kill -9`` (:mod:`sessions.ops.parent_death`). Nobody is left to stop it, nor to wait
    for a drain: :func:`orphaned` ends every open stream at once (``server_draining``, a
    jittered ``retry:``), writes the records and counters and lets go of the backend, all
    within :data:`ORPHAN_EXIT_S`, and the process exits (``os._exit``: granian would
    otherwise wait for idle HTTP/2 connections to close, with no main process left to
    kill it). A loop too busy to run the sequence in time does not hold it: the process
    exits :data:`ORPHAN_EXIT_S` + 0.5 s after the signal whatever happened.

The in-process test suite disconnects :data:`listener` (its per-test loops must not write
records at teardown); tests of this module connect it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import random
import signal
import sys
import threading
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any, Final

from django.db import DatabaseError, connections

from sessions.backends import get_backend
from sessions.hooks import Listener
from sessions.ops.feed import feed
from sessions.ops.parent_death import PARENT_DEATH_SIGNAL
from sessions.ops.records import recorder
from sessions.process_state import process_state
from sessions.transport.admission import drain_frame, drain_retry_ms

__all__ = [
    "DRAIN_SIGNAL",
    "ORPHAN_EXIT_S",
    "SHUTDOWN_TIMEOUT_S",
    "Lifecycle",
    "LifespanApp",
    "drain",
    "flush_at_exit",
    "lifespan_app",
    "listener",
    "orphaned",
    "shutdown",
]

logger = logging.getLogger("qwenweb.lifecycle")

SHUTDOWN_TIMEOUT_S: Final = 2.0
"""Upper bound of the wait for the streams to record their end at shutdown.

Each was told to end before the wait (the drain, then ``server_shutdown``); one that has
not recorded its end by then (a peer that stopped reading) is closed as
``server_shutdown``. Short, so that ``python -m qwenweb.serve`` stops within ``DRAIN_S`` +
5 s (``qwenweb.granian_server``, ``workers_kill_timeout``)."""

DRAIN_SIGNAL: Final = signal.SIGUSR1
"""The signal that starts the graceful drain without stopping the process (:func:`drain`)."""

ORPHAN_EXIT_S: Final = 1.0
"""A process whose parent died exits within this (:func:`orphaned`)."""

_ORPHAN_WATCHDOG_MARGIN_S: Final = 0.5
# Of ORPHAN_EXIT_S, the share the streams get to record their end; the rest writes.
_ORPHAN_STREAMS_SHARE: Final = 0.5

_random = random.SystemRandom()  # jitter only; no secret depends on it


class Lifecycle(Listener):
    """Starts the operator machinery on each server loop and hooks its shutdown.

    Its state (the loops hooked, whether a signal started the shutdown) is its own: a
    test builds one and drops it.
    """

    def __init__(self) -> None:
        self._atexit_registered = False
        self._hooked_loops: set[int] = set()
        self._signalled = False
        self._shutdown_tasks: set[asyncio.Task[Any]] = set()
        self._installed: dict[int, Any] = {}

    def loop_attached(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the records writer and the dashboard feed on ``loop``; hook its shutdown.

        Idempotent per loop. Never raises for a running loop.
        """
        recorder.start(loop)
        feed.start(loop)
        if id(loop) in self._hooked_loops:
            return
        self._hooked_loops.add(id(loop))
        if not self._atexit_registered:
            atexit.register(flush_at_exit)
            self._atexit_registered = True
        # Twisted (daphne) too: its own "before shutdown" trigger cancels every stream at
        # once, so the drain must run before the reactor is told to stop.
        _hook_twisted(loop, lambda: self._signalled)
        self._hook_signals(loop)

    def _hook_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run :func:`shutdown` before the server's own SIGINT/SIGTERM handlers (uvicorn).

        Only on the main thread, and only for a signal whose current handler a server
        installed (a Python callable other than ``signal.default_int_handler``); the
        defaults and ``SIG_IGN`` are left alone (``atexit`` covers a plain Ctrl-C).
        Also makes :data:`DRAIN_SIGNAL` (SIGUSR1, when nobody else handles it) start the
        drain alone, without stopping: ``python -m qwenweb.serve`` sends it to granian's
        workers on SIGTERM while they still listen (``qwenweb.granian_server``); and
        :data:`~sessions.ops.parent_death.PARENT_DEATH_SIGNAL` (SIGUSR2, likewise) run
        :func:`orphaned` and exit.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(sig)
            if callable(previous) and previous is not signal.default_int_handler:
                handler = self.chained_handler(loop, previous)
                self._installed[sig] = handler
                signal.signal(sig, handler)
        if signal.getsignal(DRAIN_SIGNAL) == signal.SIG_DFL:
            signal.signal(DRAIN_SIGNAL, self.drain_handler(loop))
        if signal.getsignal(PARENT_DEATH_SIGNAL) == signal.SIG_DFL:
            signal.signal(PARENT_DEATH_SIGNAL, self.orphan_handler(loop))

    def drain_handler(self, loop: asyncio.AbstractEventLoop) -> Any:
        """A signal handler that starts :func:`drain` (``DRAIN_S``) on ``loop``, once."""

        def start() -> None:
            if process_state.draining:
                return
            # qwenweb.serve's main process sends it to each worker on SIGTERM (or SIGINT).
            logger.info(
                "drain_requested signal=%s drain_s=%g",
                DRAIN_SIGNAL.name,
                get_backend().config.drain_s,
            )
            task = loop.create_task(drain(get_backend().config.drain_s), name="qwenweb-drain")
            self._shutdown_tasks.add(task)
            task.add_done_callback(self._shutdown_tasks.discard)

        def handler(signum: int, frame: FrameType | None) -> None:
            if not loop.is_closed():
                loop.call_soon_threadsafe(start)

        return handler

    def orphan_handler(
        self, loop: asyncio.AbstractEventLoop, exit_process: Callable[[int], Any] = os._exit
    ) -> Any:
        """A signal handler for a parent's death: run :func:`orphaned` on ``loop``, then
        ``exit_process(0)`` (``1`` if the sequence failed or ran out of time).

        A watchdog thread calls ``exit_process(1)`` :data:`ORPHAN_EXIT_S` + 0.5 s after the
        signal should the loop not get through the sequence by then. ``exit_process`` is
        called once; later signals are ignored.
        """
        signalled = threading.Event()
        finished = threading.Lock()
        watchdog = threading.Timer(ORPHAN_EXIT_S + _ORPHAN_WATCHDOG_MARGIN_S, lambda: finish(1))
        watchdog.daemon = True

        def finish(status: int) -> None:
            if not finished.acquire(blocking=False):
                return
            watchdog.cancel()
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            exit_process(status)

        def start() -> None:
            async def sequence() -> None:
                finish(0 if await orphaned() else 1)

            task = loop.create_task(sequence(), name="qwenweb-orphaned")
            self._shutdown_tasks.add(task)
            task.add_done_callback(self._shutdown_tasks.discard)

        def handler(signum: int, frame: FrameType | None) -> None:
            if signalled.is_set():
                return
            signalled.set()
            if loop.is_closed():
                finish(1)
                return
            watchdog.start()
            loop.call_soon_threadsafe(start)

        return handler

    def chained_handler(self, loop: asyncio.AbstractEventLoop, previous: Any) -> Any:
        """A signal handler: the first signal starts :func:`shutdown` on ``loop`` and calls
        ``previous`` once it is done; a later one calls ``previous`` at once."""

        def handler(signum: int, frame: FrameType | None) -> None:
            if self._signalled or loop.is_closed():
                previous(signum, frame)
                return
            self._signalled = True
            # Only hand over to the loop here: a handler may interrupt any code of this
            # thread.
            loop.call_soon_threadsafe(self._start_shutdown, loop, previous, signum)

        return handler

    def _start_shutdown(self, loop: asyncio.AbstractEventLoop, previous: Any, signum: int) -> None:
        logger.info("shutdown_started signal=%s", signal.Signals(signum).name)

        async def sequence() -> None:
            try:
                await shutdown(end_streams=True)
            finally:
                self._hand_over(signum, previous)  # now let the server shut down

        task = loop.create_task(sequence(), name="qwenweb-shutdown")
        self._shutdown_tasks.add(task)
        task.add_done_callback(self._shutdown_tasks.discard)

    def _hand_over(self, signum: int, previous: Any) -> None:
        """Give the signal to the server's own handler, as if it had just arrived.

        Where our handler is the one installed (main thread), the server's is put back and
        the signal raised again, so that it sees a real delivery, with whatever wake-up of
        its loop comes with one (uvloop's handler, under granian, is a method of the loop),
        rather than a plain call; a later signal goes to it directly. Otherwise (a handler
        built by :meth:`chained_handler` but never installed) ``previous`` is called.
        """
        ours = self._installed.get(signum)
        on_main = threading.current_thread() is threading.main_thread()
        if on_main and ours is not None and signal.getsignal(signum) is ours:
            signal.signal(signum, previous)
            signal.raise_signal(signum)
        else:
            previous(signum, None)


listener = Lifecycle()
"""The process's lifecycle listener (connected by ``sessions.apps``)."""


_running: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[bool]] = (
    weakref.WeakKeyDictionary()
)
"""The shutdown sequence running on each loop (a second caller joins it)."""


async def shutdown(
    timeout_s: float = SHUTDOWN_TIMEOUT_S,
    *,
    end_streams: bool = False,
    drain_s: float | None = None,
) -> None:
    """The clean-shutdown sequence on the loop (see the module docstring). Never raises.

    First the graceful drain (:func:`drain`, over ``drain_s`` seconds, default
    ``DRAIN_S``): readiness turns 503, new streams are refused, open streams end spread
    over the window. Then every subscriber still attached (none, unless one slipped in
    while the drain listed them) gets a terminal frame
    (``disconnect_all("server_shutdown")``). From the start on, streams record their end
    as ``server_shutdown``. ``end_streams`` is kept for the callers that ask for that last
    step explicitly (servers that do not cancel their streams themselves): it always runs.

    The one place that ends the streams and flushes the records at shutdown: the signal
    hook, the ASGI lifespan (:class:`LifespanApp`) and Twisted's trigger all call it. A
    call made while the sequence already runs on this loop (a signal and then
    ``lifespan.shutdown``) waits for that run instead of starting a second one, and does
    not end the streams itself: a ``lifespan.shutdown`` that comes at once must not cut
    the drain short.
    """
    del end_streams  # the sequence always ends what the drain left (see above)
    loop = asyncio.get_running_loop()
    running = _running.get(loop)
    if running is not None and not running.done():
        await asyncio.shield(running)
        return
    task = loop.create_task(_sequence(timeout_s, drain_s), name="qwenweb-shutdown-sequence")
    _running[loop] = task
    await asyncio.shield(task)


async def _sequence(timeout_s: float, drain_s: float | None) -> bool:
    """The steps of :func:`shutdown`; returns False when a step failed (logged)."""
    process_state.shutting_down = True
    backend = get_backend()
    try:
        await drain(backend.config.drain_s if drain_s is None else drain_s)
        backend.end_all_streams("server_shutdown")
        written = await recorder.drain(timeout_s)
        await backend.flush_all()
        logger.info("shutdown_flushed records=%d sessions=%d", written, len(backend.registry))
        await backend.aclose()
    except Exception:
        logger.exception("shutdown_flush_failed")
        return False
    return True


async def orphaned(exit_s: float = ORPHAN_EXIT_S) -> bool:
    """End everything at once because the parent process died; return whether all was
    written within ``exit_s`` seconds. Never raises.

    The clean-shutdown sequence without its windows: every open stream ends now (the drain
    over 0 s: ``server_draining``, a jittered ``retry:``; a drain already under way is cut
    short), the streams get half of ``exit_s`` to record their end (the rest are closed as
    ``server_shutdown``), then the records and each loaded session's counters are written
    and the backend lets go of what it holds (the memory backend's row holds), all within
    ``exit_s``. The caller exits the process afterwards (module docstring).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + exit_s
    logger.warning("parent_died pid=%d exit_s=%g", os.getpid(), exit_s)
    try:
        async with asyncio.timeout_at(deadline):
            return await _sequence(exit_s * _ORPHAN_STREAMS_SHARE, drain_s=0)
    except TimeoutError:
        logger.error("orphan_exit_timeout exit_s=%g", exit_s)
        return False


async def drain(drain_s: float) -> int:
    """End every open stream of this process, spread over ``drain_s`` seconds; return how many.

    Sets ``process_state.draining`` first (``/readyz`` 503; the stream route refuses new streams
    with ``stream_error`` ``server_draining``; for good: a drained process is expected to
    stop). The open streams, in random order, each
    end at its own moment of the window (one per ``drain_s / n`` slice, uniformly within
    it) with the terminal frame :func:`~sessions.transport.admission.drain_frame` and a
    ``retry:`` drawn from ``DRAIN_RETRY_MS``: their clients come back to the other
    processes spread over the window, never in one burst. Never raises.
    """
    process_state.draining = True
    process_state.shutting_down = True  # the process is going away: its streams end server_shutdown
    backend = get_backend()
    streams = [
        (live, subscription)
        for live in backend.registry.values()
        for subscription in live.bus.subscriptions()
    ]
    if not streams:
        return 0
    _random.shuffle(streams)
    loop = asyncio.get_running_loop()
    start = loop.time()
    logger.info("drain_started streams=%d drain_s=%g", len(streams), drain_s)
    ended = 0
    for index, (live, subscription) in enumerate(streams):
        delay = start + drain_s * (index + _random.random()) / len(streams) - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        retry_ms = drain_retry_ms()
        ended += live.bus.disconnect(subscription, "server_draining", frame=drain_frame(retry_ms))
    logger.info("drain_finished streams=%d took_s=%.2f", ended, loop.time() - start)
    return ended


def flush_at_exit() -> None:
    """``atexit``: write what is still pending, in this thread (no loop runs any more).

    Then closes this thread's database connections: nothing is left to be dropped unclosed
    when the process ends. Never raises.
    """
    written = recorder.flush_sync()
    try:
        connections.close_all()
    except DatabaseError:
        logger.debug("exit_close_failed", exc_info=True)
    if written:
        logger.info("exit_flushed records=%d", written)


def _hook_twisted(loop: asyncio.AbstractEventLoop, signalled: Callable[[], bool]) -> bool:
    """Add a ``before shutdown`` trigger if a Twisted reactor drives ``loop``.

    It runs :func:`shutdown` unless a signal already ran it (``signalled()``): the chained
    signal handler stops the reactor only once the sequence is done.
    """
    if "twisted.internet.reactor" not in sys.modules:
        return False
    from twisted.internet import reactor as installed
    from twisted.internet.defer import Deferred

    reactor: Any = installed  # zope interfaces confuse mypy about `self`
    if not reactor.running or getattr(reactor, "_asyncioEventloop", None) is not loop:
        return False

    def before_shutdown() -> Any:
        if signalled():
            return None
        # daphne cancels every stream itself meanwhile: nothing is left to spread out.
        return Deferred.fromFuture(loop.create_task(shutdown(drain_s=0)))

    reactor.addSystemEventTrigger("before", "shutdown", before_shutdown)
    return True


class LifespanApp:
    """The ASGI ``lifespan`` protocol (routed by ``qwenweb.asgi``).

    ``lifespan.startup``: attach the server's loop (``Backend.loop.attach()``: the records
    writer and the dashboard feed start on it, the shutdown hooks are installed), then
    ``lifespan.startup.complete``; if that fails, ``lifespan.startup.failed`` with the
    error, and the server does not start. ``lifespan.shutdown``: :func:`shutdown` with
    ``end_streams`` (every open stream gets its terminal frame, the records and counters
    are written), then ``lifespan.shutdown.complete``.

    Servers differ on *when* they send ``lifespan.shutdown``: granian at once on SIGTERM,
    uvicorn only after every connection has closed (so an open stream would hold it: the
    signal hook of :class:`Lifecycle` ends the streams first there), hypercorn after its
    graceful timeout. Whichever comes first runs the sequence; the other joins it.
    """

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    get_backend().loop.attach()
                except Exception as exc:
                    logger.exception("lifespan_startup_failed")
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                logger.info("shutdown_started by=lifespan")
                await shutdown(end_streams=True)
                await send({"type": "lifespan.shutdown.complete"})
                return


lifespan_app = LifespanApp()
"""The application of the ``lifespan`` scope."""
