"""The Redis backend's per-process loops besides the reader: control listener, reporter.

Control messages (:meth:`RedisStore.send_control`) arrive on the prefixed channel: a pub/sub
channel on one Redis (or Sentinel-managed), a sharded channel (``SSUBSCRIBE``) on a Cluster,
subscribed on the node serving its slot (looked up again after a failure: the node may
have failed over). While Redis has confirmed the subscription ``store.subscribed`` is set,
so a sender can leave itself out of the receivers' count. A message from this process
itself, or one that is not a JSON object, is ignored. This module imports nothing from
Django.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

import orjson
import redis.asyncio as redis_asyncio

from sessions.backends.errors import BackendUnavailableError
from sessions.backends.redis_clients import is_unavailable

__all__ = ["listen_control", "report_forever"]

logger = logging.getLogger("qwenweb.redis")

_LISTEN_TIMEOUT_S: Final = 5.0
_BACKOFF_START_S: Final = 0.1
_BACKOFF_MAX_S: Final = 5.0

ControlHandler = Callable[[Mapping[str, Any]], None]

# ``store`` below is the :class:`~sessions.backends.redis_store.RedisStore` that started
# these loops (typed Any: that module imports this one).


async def listen_control(store: Any, on_control: ControlHandler) -> None:
    """Hand every control message of another process to ``on_control`` until the store
    closes (module docstring); reconnects after a pause. Never raises but CancelledError."""
    backoff = _BACKOFF_START_S
    while not store.closing:
        node: redis_asyncio.Redis | None = None
        if store.is_cluster:  # a sharded channel: on the node serving its slot
            found = store.client.get_node_from_key(store.control_channel)
            node = store.node_client(found.host, int(found.port))
            pubsub = node.pubsub()
        else:
            pubsub = store.client.pubsub()
        try:
            if node is not None:
                await pubsub.ssubscribe(store.control_channel)
            else:
                await pubsub.subscribe(store.control_channel)
            backoff = _BACKOFF_START_S
            while not store.closing:
                message = await pubsub.get_message(timeout=_LISTEN_TIMEOUT_S)
                if message is None:
                    continue
                if message["type"] in ("subscribe", "ssubscribe"):  # Redis confirmed it
                    store.subscribed.set()
                    continue
                if message["type"] not in ("message", "smessage"):
                    continue
                try:
                    decoded = orjson.loads(message["data"])
                except orjson.JSONDecodeError:
                    logger.warning("control_message_ignored reason=not_json")
                    continue
                if isinstance(decoded, dict) and decoded.get("from") != store.process_uid:
                    on_control(decoded)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never dies: reconnect after a pause
            if not is_unavailable(exc):
                logger.exception("control_listener_failed")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX_S)
            if node is not None:  # the channel's node may have failed over
                with contextlib.suppress(Exception):
                    await store.client.nodes_manager.initialize()
        finally:
            store.subscribed.clear()
            with contextlib.suppress(Exception):
                await pubsub.aclose()
            if node is not None:
                with contextlib.suppress(Exception):
                    await node.aclose()


async def report_forever(store: Any, make_report: Callable[[], Mapping[str, Any]]) -> None:
    """Write this process's report every ``process_ttl_s / 4`` until the store closes."""
    interval = max(0.05, store.process_ttl_s / 4)
    while not store.closing:
        try:
            await store.report(make_report())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never dies; a down Redis is the reader's to log
            if not isinstance(exc, BackendUnavailableError) and not is_unavailable(exc):
                logger.exception("report_failed")
        await asyncio.sleep(interval)
