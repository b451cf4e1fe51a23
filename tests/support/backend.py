"""Which event backend the test run uses, and the Redis key space it may write.

``QWENWEB_BACKEND=redis`` runs the whole suite against the Redis backend (``make
test-redis``). The run writes only under one key prefix, ``QWENWEB_REDIS_KEY_PREFIX``
(generated when unset; it must start with ``qwtest-``): in-process tests each get
``<prefix>-t<n>``, server processes started by end-to-end tests inherit the environment.
Under pytest-xdist each worker has ``<prefix>-<worker>`` in place of ``<prefix>``. The
prefix's keys are deleted when the run ends; the shared Redis is never flushed.

``python -m tests.support.backend check`` exits 1 with one line when Redis does not
answer; ``python -m tests.support.backend delete <prefix>`` deletes a run's keys (``make
test-redis`` runs it even when pytest was interrupted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sessions.backends.memory import MemoryBackend
    from sessions.backends.redis import RedisBackend
    from sessions.backends.redis_store import RedisStore

import asyncio
import functools
import itertools
import os
import secrets
import sys
from collections.abc import Callable
from typing import Any, Final, TypeVar, cast

import pytest
import redis

_T = TypeVar("_T")

USING_REDIS: Final = os.environ.get("QWENWEB_BACKEND") == "redis"
"""Whether this run selects the Redis backend (the environment overrides settings)."""

TEST_PREFIX_START: Final = "qwtest-"
"""Key prefixes a test run may use: it deletes its prefix's keys when it ends."""

DEFAULT_REDIS_URL: Final = "redis://127.0.0.1:6379/0"  # sessions.conf's default

_per_test = itertools.count(1)


def memory_only(reason: str) -> Callable[[_T], _T]:
    """Run a test about the memory-only backend's behaviour on that backend (the default
    is the durable one: fixture ``memory_backend``); skip it when the run uses Redis."""
    skip = pytest.mark.skipif(USING_REDIS, reason=f"memory backend internals: {reason}")
    use = pytest.mark.usefixtures("memory_backend")

    def decorate(test: _T) -> _T:
        return cast(_T, use(skip(test)))

    return decorate


def redis_only(reason: str) -> pytest.MarkDecorator:
    """Skip a test of the Redis backend's behaviour when the run uses the memory backend
    (``make test-redis`` runs it)."""
    return pytest.mark.skipif(
        not USING_REDIS, reason=f"runs under the Redis backend only (make test-redis): {reason}"
    )


def server_matrix(production: str, *others: Any) -> list[Any]:
    """The servers a test that runs across servers runs on: ``production`` (the production
    entry point's kind) and ``others`` (kinds or ``pytest.param``) in ``make test``; under
    the Redis backend (``make test-redis``) ``production`` only. The matrix checks each
    server's own flow control and shutdown, which the backend does not reach, and ``make
    test`` ran it whole; the Redis tier checks the backend behind the production server."""
    return [production] if USING_REDIS else [production, *others]


def redis_url() -> str:
    return os.environ.get("QWENWEB_REDIS_URL", DEFAULT_REDIS_URL)


@functools.cache
def run_prefix() -> str:
    """Return the run's key prefix, choosing ``qwtest-<random>`` when none is set (once).

    In a pytest-xdist worker it is the run's prefix with the worker's name after it
    (``qwtest-1a2b3c4d-gw1``), set in this process's environment too: the servers a
    worker's tests start (a session's or a module's, which count the processes and
    subscribers of their prefix) never share a key space with another worker's.

    Raises:
        pytest.UsageError: the prefix does not start with ``qwtest-`` (the run deletes its
            keys at the end, so it must not share a deployment's prefix).
    """
    prefix = os.environ.setdefault(
        "QWENWEB_REDIS_KEY_PREFIX", f"{TEST_PREFIX_START}{secrets.token_hex(4)}"
    )
    if not prefix.startswith(TEST_PREFIX_START):
        raise pytest.UsageError(
            f"QWENWEB_REDIS_KEY_PREFIX={prefix!r}: a test run deletes its prefix's keys, "
            f"so it must start with {TEST_PREFIX_START!r}"
        )
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is not None:
        prefix = os.environ["QWENWEB_REDIS_KEY_PREFIX"] = f"{prefix}-{worker}"
    return prefix


def per_test_prefix(base: str) -> str:
    """Return a key prefix no other test of this run uses (below ``base``)."""
    return f"{base}-t{next(_per_test)}"


def delete_run_keys(base: str, url: str | None = None) -> int:
    """Delete every key of the run (``base``, its workers' and per-test prefixes: every
    ``<base>:*`` and ``<base>-*``); return how many.

    ``url`` is the Redis to delete them from (default: the run's, ``redis_url()``). Raises
    ``ValueError`` for a prefix that does not start with ``qwtest-``.
    """
    if not base.startswith(TEST_PREFIX_START):
        raise ValueError(f"not a test run's key prefix: {base!r}")
    client = redis.Redis.from_url(url or redis_url())
    deleted = 0
    try:
        for pattern in (f"{base}:*", f"{base}-*"):
            batch: list[bytes] = []
            for key in client.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    deleted += int(client.delete(*batch))
                    batch.clear()
            if batch:
                deleted += int(client.delete(*batch))
    finally:
        client.close()
    return deleted


def as_redis() -> RedisBackend:
    """This test's backend, which must be the Redis backend."""
    from sessions.backends import get_backend
    from sessions.backends.redis import RedisBackend

    backend = get_backend()
    assert isinstance(backend, RedisBackend), backend
    return backend


def as_memory() -> MemoryBackend:
    """This test's backend, which must be the memory backend."""
    from sessions.backends import get_backend
    from sessions.backends.memory import MemoryBackend

    backend = get_backend()
    assert isinstance(backend, MemoryBackend), backend
    return backend


def open_store(backend: object) -> RedisStore | None:
    """The Redis store ``backend`` started, if any (None for the memory backend, before the
    first use and after ``aclose``). The tests' guards read the backend's own field: no
    code of the server needs to ask."""
    return getattr(backend, "_store", None)


def close_backend_on(loop: asyncio.AbstractEventLoop, timeout_s: float = 5.0) -> None:
    """Close the Redis store from another thread, on ``loop`` where it runs (if it does)."""
    from sessions.backends import backends

    current = backends.current
    store = open_store(current)
    if current is None or store is None or store.loop is not loop or loop.is_closed():
        return
    asyncio.run_coroutine_threadsafe(current.aclose(), loop).result(timeout_s)


def main(argv: list[str]) -> int:
    """``check``: 0 if Redis answers, else 1. ``delete <prefix>``: delete a run's keys."""
    if argv == ["check"]:
        client = redis.Redis.from_url(redis_url(), socket_connect_timeout=5, socket_timeout=5)
        try:
            client.ping()
        except (redis.RedisError, OSError) as exc:
            print(f"Redis is not reachable at {redis_url()}: {exc}", file=sys.stderr)
            return 1
        finally:
            client.close()
        return 0
    if len(argv) == 2 and argv[0] == "delete":
        print(f"deleted {delete_run_keys(argv[1])} keys of {argv[1]}")
        return 0
    print("usage: python -m tests.support.backend check | delete qwtest-<run>", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
