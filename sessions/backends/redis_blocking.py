"""Short-lived synchronous Redis clients, for threads and processes without a store's loop.

An admin view in a process that never built a :class:`~sessions.backends.redis_store.RedisStore`
reads the processes' reports here; a management command publishes a control message. Each
call opens one connection, bounds connecting and every command by its ``timeout_s``, never
retries, and closes the connection before returning. This module imports nothing from Django.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Mapping
from typing import Any

import orjson
from redis.cluster import RedisCluster

from sessions.backends.redis_clients import RedisTarget, sync_client, unavailable_as_error
from sessions.backends.redis_store import report_keys

__all__ = ["read_reports_blocking", "send_control_blocking"]


def _client(target: str | RedisTarget, timeout_s: float) -> Any:
    """A ``redis.Redis``, or a ``redis.cluster.RedisCluster`` (``target.cluster``)."""
    return sync_client(
        target if isinstance(target, RedisTarget) else RedisTarget(target), timeout_s
    )


def read_reports_blocking(
    url: str | RedisTarget, prefix: str, *, timeout_s: float
) -> list[dict[str, Any]]:
    """Return every live process's report, read with a short-lived synchronous client.

    For threads without a store's loop (an admin view in a process that never built a
    store): what :meth:`RedisStore.reports` returns, in two round-trips (``ZRANGE``,
    ``MGET``; on a Cluster one ``MGET`` per slot), closed before returning. Connecting
    and each command are bounded by ``timeout_s`` and never retried, so a stuck Redis costs at
    most about three times ``timeout_s``.

    Raises:
        BackendUnavailableError: Redis unreachable, or too slow to answer.
    """
    with unavailable_as_error():  # (a blocking cluster client connects when built)
        client = _client(url, timeout_s)
    try:
        with unavailable_as_error():
            uids: Any = client.zrange(f"{prefix}:procs", 0, -1)
            keys = report_keys(prefix, uids)
            mget = client.mget_nonatomic if isinstance(client, RedisCluster) else client.mget
            raw: Any = mget(keys) if uids else []
    finally:
        with contextlib.suppress(Exception):
            client.close()  # and its pool's one connection
    return [orjson.loads(item) for item in raw if item is not None]


def send_control_blocking(
    url: str | RedisTarget, prefix: str, message: Mapping[str, Any], *, timeout_s: float
) -> int:
    """Publish one control message with a short-lived synchronous client; return how many
    processes received it. For a process without a store's loop (a management command):
    the ``from`` of the message is a fresh id, so every server process acts on it.

    Raises:
        BackendUnavailableError: Redis unreachable, or too slow to answer.
    """
    with unavailable_as_error():
        client = _client(url, timeout_s)
    payload = orjson.dumps({**message, "from": secrets.token_hex(8)})
    try:
        with unavailable_as_error():
            send = client.spublish if isinstance(client, RedisCluster) else client.publish
            return int(send(f"{prefix}:control", payload))
    finally:
        with contextlib.suppress(Exception):
            client.close()
