"""Shared fixtures: a fresh backend per test (built from settings on first use), tokens.

With ``QWENWEB_BACKEND=redis`` (``make test-redis``) every test runs against the Redis
backend: each in-process test gets a key prefix of its own and its Redis store is closed
on its event loop at teardown; the run's keys are deleted when it ends
(:mod:`tests.support.backend`).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from sessions import token_versions
from sessions.backends import backends
from sessions.conf import get_config
from sessions.hooks import hooks
from sessions.ops import lifecycle
from sessions.ops.feed import feed
from sessions.ops.metrics import metrics
from sessions.ops.records import recorder
from sessions.process_state import process_state
from tests.support import backend

pytest_plugins = ["tests.support.leaks"]  # a leaked socket fails the test that leaked it

# The in-process tests run one event loop per test: the operator machinery (records
# writer, dashboard feed, shutdown hooks) must not start on those loops and write at their
# teardown. Tests of that machinery connect the lifecycle listener themselves.
hooks.disconnect(lifecycle.listener)
# Likewise the metrics listener's flush task; tests of metrics connect a listener of their own.
hooks.disconnect(metrics)


@pytest.fixture(autouse=True)
def _fresh_backend(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Each test gets a backend of its own (no bus loaded, no server loop captured):
    buses belong to one event loop (EB-11). Also forgets the operator records and feed.

    The durable backend's log is a file of the test's own (servers started by the test
    get theirs beside their database: ``tests.support.server.server_env``); it is closed
    when the test ends."""
    log = tmp_path_factory.mktemp("log") / "events.sqlite3"
    monkeypatch.setenv("QWENWEB_EVENT_LOG_PATH", str(log))
    get_config.cache_clear()
    backends.set(None)
    _forget_operator_state()
    yield
    close_log = getattr(backends.current, "close_log", None)
    if close_log is not None:
        close_log()
    _forget_operator_state()


@pytest.fixture
def memory_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the test (and the servers it starts) on the memory-only backend
    (``BACKEND=memory``), for behaviour the durable default does not have."""
    monkeypatch.setenv("QWENWEB_BACKEND", "memory")
    get_config.cache_clear()
    backends.set(None)


@pytest.fixture
def durable_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the test on the durable backend (``BACKEND=durable``), whatever the default."""
    monkeypatch.setenv("QWENWEB_BACKEND", "durable")
    get_config.cache_clear()
    backends.set(None)


def _forget_operator_state() -> None:
    token_versions.clear_cache()  # user ids are reused across tests' databases
    recorder.discard()
    feed.stop()
    process_state.reset()


# -- the Redis backend ---------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    # A shell that starts `make test &` without job control makes it ignore SIGINT, and
    # every server the tests start would inherit that: the tests that stop daphne and
    # runserver with SIGINT (Ctrl-C) then waited 20 s for nothing. Handled, not ignored,
    # SIGINT is back to its default in each child after exec.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if backend.USING_REDIS:
        backend.run_prefix()
        get_config.cache_clear()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if backend.USING_REDIS:
        backend.delete_run_keys(backend.run_prefix())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Close the Redis store on each async test's own loop (set up first, torn down last)."""
    if not backend.USING_REDIS:
        return
    for item in items:
        if pytest_asyncio.is_async_test(item):
            item.fixturenames.insert(0, "_close_redis_store")


CLOSE_STORE_WAIT_S = 10.0


@pytest_asyncio.fixture
async def _close_redis_store() -> AsyncIterator[None]:
    yield
    current = backends.current
    if current is None:
        return
    closing = asyncio.ensure_future(current.aclose())
    done, _ = await asyncio.wait({closing}, timeout=CLOSE_STORE_WAIT_S)
    if not done:
        pending = "\n".join(repr(task.get_stack()) for task in asyncio.all_tasks())
        closing.cancel()
        pytest.fail(f"closing the Redis store took over {CLOSE_STORE_WAIT_S} s; tasks:\n{pending}")


@pytest.fixture(autouse=True)
def _redis_key_prefix(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Give the test a Redis key prefix of its own."""
    if backend.USING_REDIS:
        monkeypatch.setenv(
            "QWENWEB_REDIS_KEY_PREFIX", backend.per_test_prefix(backend.run_prefix())
        )
    get_config.cache_clear()
    yield
    get_config.cache_clear()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """Fail a test that leaves a Redis store open once its fixtures are torn down."""
    yield
    dropped = backends.set(None)
    store = backend.open_store(dropped)
    if store is not None:
        pytest.fail(f"{item.nodeid} left its Redis store open (loop {store.loop!r})")
