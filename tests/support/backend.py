"""Which event backend the test run uses, and the Redis key space it may write (issue 6).

``QWENWEB_BACKEND=redis`` runs the whole suite against the Redis backend (``make
test-redis``). The run writes only under one key prefix, ``QWENWEB_REDIS_KEY_PREFIX``
(generated when unset): in-process tests each get ``<prefix>-t<n>``, server processes
started by end-to-end tests inherit the environment. The prefix's keys are deleted at the
end of the run; the shared Redis is never flushed.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import secrets
import pytest
import redis

from sessions import runtime

USING_REDIS = os.environ.get("QWENWEB_BACKEND") == "redis"
"""Whether this run selects the Redis backend (the environment overrides settings)."""

TEST_PREFIX_START = "qwtest-"
"""Key prefixes a test run may use: it deletes its prefix's keys when it ends."""

_per_test = itertools.count(1)


def memory_only(reason: str) -> pytest.MarkDecorator:
    """Skip a test about the memory backend's internals when the run uses Redis."""
    return pytest.mark.skipif(USING_REDIS, reason=f"memory backend internals: {reason}")


@functools.cache
def run_prefix() -> str:
    """Return the run's key prefix, choosing ``qwtest-<random>`` when none is set (once).

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
    return prefix


def per_test_prefix(base: str) -> str:
    """Return a key prefix no other test of this run uses (below ``base``)."""
    return f"{base}-t{next(_per_test)}"


def delete_run_keys(base: str) -> int:
    """Delete every key of the run (``base`` and its per-test prefixes); return how many."""
    client = redis.Redis.from_url(
        os.environ.get("QWENWEB_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    deleted = 0
    try:
        for pattern in (f"{base}:*", f"{base}-t*"):
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


def close_backend_on(loop: asyncio.AbstractEventLoop, timeout_s: float = 5.0) -> None:
    """Close the Redis store from another thread, on ``loop`` where it runs (if it does)."""
    store = runtime._store
    if store is None or store.loop is not loop or loop.is_closed():
        return
    asyncio.run_coroutine_threadsafe(runtime.close_backend(), loop).result(timeout_s)

