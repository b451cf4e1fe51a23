"""Every Redis client of the Redis backend is built here: one place per deployment shape.

A :class:`RedisTarget` says where the primary is: a plain ``REDIS_URL``, Sentinels that
name the current primary of a service (``REDIS_SENTINELS``, ``REDIS_SENTINEL_SERVICE``),
or the seed nodes of a Redis Cluster (``REDIS_CLUSTER``: redis-py's ``RedisCluster``
routes each command to its slot's primary and follows ``MOVED``/``ASK`` and failovers;
its database is 0, the URL's user, password and TLS apply).
With Sentinels the URL's host and port are ignored; its user, password, database and TLS
(``rediss://``) still apply to the data connections. A Sentinel-managed connection asks the
Sentinels for the primary each time it (re)connects, and redis-py closes it when the
primary answers ``READONLY`` (it was demoted): so the command pool, the reader and the
control listener follow a failover by reconnecting, without a restart.

The errors that mean "Redis is
not there right now" are classified here too (:func:`is_unavailable`). This module
imports nothing from Django.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from dataclasses import dataclass
from typing import Any, Final

import redis
import redis.asyncio as redis_asyncio
import redis.asyncio.cluster as redis_async_cluster
import redis.asyncio.sentinel as async_sentinel
import redis.cluster as sync_cluster
import redis.sentinel as sync_sentinel
from redis import exceptions as redis_errors
from redis._parsers import AsyncCommandsParser
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.retry import Retry

from sessions.backends.errors import BackendUnavailableError

__all__ = [
    "UNAVAILABLE_ERRORS",
    "RedisTarget",
    "async_client",
    "async_cluster",
    "async_node_client",
    "async_pool",
    "cluster_script_once",
    "is_unavailable",
    "ping_primaries",
    "sync_client",
    "unavailable_as_error",
]

#: What the URL says that a Sentinel-managed connection must not take over (the address
#: comes from the Sentinels; TLS is chosen by the connection class).
_ADDRESS_KEYS: Final = ("host", "port", "path", "connection_class")


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """Where the backend's Redis primary is (module docstring).

    ``sentinels`` empty: ``url`` is the server. Otherwise the Sentinels at those
    ``(host, port)`` pairs name the primary of ``service``; ``sentinel_password`` is
    what the Sentinels themselves ask for (empty: none).
    """

    url: str
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    sentinel_password: str = ""
    #: Seed nodes of a Redis Cluster (empty: not a cluster).
    cluster: tuple[tuple[str, int], ...] = ()

    def describe(self) -> str:
        """A log-safe name: the URL without its password, the Sentinel service, or the
        cluster's seed nodes."""
        if self.cluster:
            return "cluster://" + ",".join(f"{host}:{port}" for host, port in self.cluster)
        if self.sentinels:
            first = ",".join(f"{host}:{port}" for host, port in self.sentinels)
            return f"sentinel://{first}/{self.service}"
        scheme, sep, rest = self.url.partition("://")
        if "@" in rest:
            rest = "***@" + rest.rpartition("@")[2]
        return f"{scheme}{sep}{rest}"

    def _data_kwargs(self) -> dict[str, Any]:
        """The URL's user, password, database and TLS, for Sentinel-managed connections."""
        kwargs: dict[str, Any] = parse_url(self.url)  # type: ignore[no-untyped-call]
        for key in _ADDRESS_KEYS:
            kwargs.pop(key, None)
        return kwargs

    def _cluster_kwargs(self) -> dict[str, Any]:
        """The URL's user, password and TLS, for cluster connections (database 0)."""
        parsed: dict[str, Any] = parse_url(self.url)  # type: ignore[no-untyped-call]
        kwargs = {k: parsed[k] for k in ("username", "password") if parsed.get(k)}
        if self.url.startswith("rediss://"):
            kwargs["ssl"] = True
        return kwargs

    def _async_connection_class(self) -> type[redis_asyncio.Connection]:
        return _FollowingSSLConnection if self.url.startswith("rediss://") else _FollowingConnection

    def _sentinel_kwargs(self, connect_timeout_s: float, timeout_s: float) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "socket_connect_timeout": connect_timeout_s,
            "socket_timeout": timeout_s,
        }
        if self.sentinel_password:
            kwargs["password"] = self.sentinel_password
        return kwargs


class _FollowingConnection(async_sentinel.SentinelManagedConnection):
    """A Sentinel-managed connection that asks the Sentinels for the primary on *every*
    (re)connect.

    redis-py 8.1's asyncio client reconnects a dropped connection through
    ``connect_check_health``, which skips the Sentinel lookup of ``connect()``: a client
    whose connection dropped at a failover would dial the dead primary forever (the
    reader never re-attaches). The lookup is made where every path dials: ``_connect``.
    """

    async def _connect(self) -> None:
        if self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super()._connect()  # type: ignore[no-untyped-call]


class _FollowingSSLConnection(_FollowingConnection, redis_asyncio.SSLConnection):
    """:class:`_FollowingConnection` over TLS (``rediss://``)."""


class _BlockingSentinelPool(
    async_sentinel.SentinelConnectionPool, redis_asyncio.BlockingConnectionPool
):
    """A Sentinel-managed pool that waits for a free connection (as the plain pool does)."""


def async_pool(
    target: RedisTarget,
    *,
    max_connections: int,
    timeout_s: float,
    connect_timeout_s: float,
    socket_timeout_s: float,
) -> redis_asyncio.ConnectionPool:
    """Return a command pool of at most ``max_connections`` connections to the primary.

    A command that finds all of them busy waits at most ``timeout_s`` for one. Nothing is
    connected yet (never raises for an unreachable Redis; commands do).
    """
    if target.sentinels:
        manager = async_sentinel.Sentinel(  # type: ignore[no-untyped-call]
            target.sentinels,
            sentinel_kwargs=target._sentinel_kwargs(connect_timeout_s, socket_timeout_s),
        )
        return _BlockingSentinelPool(  # type: ignore[no-untyped-call]
            target.service,
            manager,
            max_connections=max_connections,
            timeout=timeout_s,
            socket_connect_timeout=connect_timeout_s,
            socket_timeout=socket_timeout_s,
            retry_on_timeout=False,
            connection_class=target._async_connection_class(),
            **target._data_kwargs(),
        )
    return redis_asyncio.BlockingConnectionPool.from_url(
        target.url,
        max_connections=max_connections,
        timeout=timeout_s,
        socket_connect_timeout=connect_timeout_s,
        socket_timeout=socket_timeout_s,
        retry_on_timeout=False,
    )


#: What redis-py 8.1's asyncio cluster client raises when its slot-map refresh (after a node
#: failed) closes a pooled connection while a command is being written on it: the command
#: was not sent (the write failed).
_CLOSED_UNDER_COMMAND: Final = re.compile(
    r"'NoneType' object has no attribute '(?:writelines|write|drain)'"
    r"|unable to perform operation on <\w*Transport closed=True"
)
#: How often :class:`_RetryingCluster` sends a command again after that.
_CLOSED_UNDER_COMMAND_TRIES: Final = 3


class _KeptCommandTable(AsyncCommandsParser):
    """The cluster client's command table (which arguments are keys), loaded once.

    redis-py 8.1 reloads it with ``COMMAND`` on the *default node* at every slot-map
    refresh. That node is the first primary of its cache, which can be a primary that
    just died: while its slots wait for a replica's promotion, a refresh (after any
    pipeline or ``CLUSTERDOWN`` error, both of which skip redis-py's "failed node last"
    reordering) then raises ``Error 111 connecting to <dead node>`` for every command,
    on every primary, and closes every pooled connection on the way out (issue 29: 503s
    on sessions of healthy primaries). A running cluster's command table does not change
    with its topology, so a refresh keeps it; an unknown command still reloads it
    (redis-py's own fallback)."""

    async def initialize(self, node: Any = None) -> None:
        if node is not None and self.commands:
            self.node = node  # (a refresh: keep the table)
            return
        await super().initialize(node)


class _KeptConnections(redis_async_cluster.NodesManager):
    """The cluster client's nodes, whose ``aclose`` closes no connection in use.

    redis-py 8.1 calls the client's ``aclose()`` (and so this one) to have the slot map
    read again: after a pipeline's connection error (the process reports reaching a dead
    node), a ``CLUSTERDOWN``, every ``reinitialize_steps``-th ``MOVED``, and a failed
    refresh. Its own closes every connection of every node at once, also one whose
    command another task has written and awaits the reply of: that task then sees
    "Connection closed by server" or "Connection lost", and a publish on a *healthy*
    primary answered 503 ``outcome_unknown`` (issue 29: sessions on the other primaries
    must not notice a failover). Here every connection is marked for reconnect instead,
    as redis-py's own slot-map refresh does: one in use is closed after its command, a
    free one before its next. :meth:`_RetryingCluster.close_connections` closes them."""

    __slots__ = ()

    async def aclose(self, attr: str = "nodes_cache") -> None:
        for node in getattr(self, attr).values():
            for connection in node._connections:
                connection.mark_for_reconnect()


class _RetryingCluster(redis_async_cluster.RedisCluster):
    """A cluster client that keeps its command table over slot-map refreshes
    (:class:`_KeptCommandTable`), closes no connection under a command when it refreshes
    (:class:`_KeptConnections`), and sends a command again when redis-py 8.1 closed its
    connection under it before writing it (:data:`_CLOSED_UNDER_COMMAND`): seen as HTTP
    500s on sessions of *healthy* primaries while another one failed over. The command
    was not written, so sending it again cannot run it twice."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands_parser = _KeptCommandTable()
        self.nodes_manager.__class__ = _KeptConnections  # (no state of its own: __slots__)

    async def close_connections(self) -> None:
        """Close every connection of every node, also those in use (``aclose`` closes
        none: :class:`_KeptConnections`); a later command connects again. Never raises."""
        self._initialize = True
        manager = self.nodes_manager
        known = (*manager.nodes_cache.values(), *manager.startup_nodes.values())
        nodes = {id(node): node for node in known}  # (a seed can be a node of the cache)
        await asyncio.gather(
            *(node.disconnect() for node in nodes.values()), return_exceptions=True
        )

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        for attempt in range(1, _CLOSED_UNDER_COMMAND_TRIES + 1):
            try:
                return await super().execute_command(*args, **kwargs)
            except (AttributeError, RuntimeError) as exc:
                if attempt == _CLOSED_UNDER_COMMAND_TRIES or not _CLOSED_UNDER_COMMAND.search(
                    str(exc)
                ):
                    raise
        raise AssertionError("unreachable")  # (the loop returns or raises)


def async_cluster(
    target: RedisTarget,
    *,
    max_connections: int,
    connect_timeout_s: float,
    socket_timeout_s: float,
) -> redis_async_cluster.RedisCluster:
    """Return a cluster client over ``target.cluster``'s seed nodes (at most
    ``max_connections`` per node). It learns the slots at its first command and again
    after ``MOVED``, a lost node or ``CLUSTERDOWN``. Nothing is connected yet. Close it
    with its ``close_connections()`` (its ``aclose()`` closes no connection in use)."""
    return _RetryingCluster(
        startup_nodes=[redis_async_cluster.ClusterNode(h, p) for h, p in target.cluster],
        require_full_coverage=False,  # the other primaries serve while one fails over
        max_connections=max_connections,
        socket_connect_timeout=connect_timeout_s,
        socket_timeout=socket_timeout_s,
        **target._cluster_kwargs(),
    )


#: How often :func:`cluster_script_once` sends a script again when nothing was written.
_NOT_SENT_TRIES: Final = 10
#: Cluster errors that mean the command did not run: no connection could be opened (redis-py
#: says "connecting to"), the cluster refused it, or no node serves the slot now.
_NOT_RUN_ERRORS: Final = (
    redis_errors.ConnectionError,
    redis_errors.ClusterDownError,
    redis_errors.SlotNotCoveredError,
)


async def cluster_script_once(
    client: redis_async_cluster.RedisCluster, script: Any, keys: list[str], args: list[Any]
) -> Any:
    """Run ``script`` (a registered script) on the primary of ``keys[0]``'s slot, at most
    once: a non-idempotent write such as a publish without Idempotency-Key.

    redis-py's cluster client resends a command after a ``ConnectionError`` or a
    ``TimeoutError`` (10 times by default), also when it was written and may have run
    before the primary died: a publish could run twice (on a replica that had it, once
    promoted). Here it is sent with its node named (redis-py then resends nothing) and
    sent again only when it cannot have run (:data:`_NOT_RUN_ERRORS`, a connect that
    failed; a connection closed under it is resent by :class:`_RetryingCluster`), at
    most :data:`_NOT_SENT_TRIES` times with a short growing pause (a failover takes
    seconds). ``NOSCRIPT`` loads the script on that node only (a promoted replica has
    none of the old primary's scripts). Raises what the last attempt raised: a lost
    reply (``TimeoutError``, a connection lost after the write) at once.
    """
    for attempt in range(1, _NOT_SENT_TRIES + 1):
        try:
            await client.initialize()  # (a slot map to re-read after a failed node)
            node = client.get_node_from_key(keys[0])
            evalsha = ("EVALSHA", script.sha, len(keys), *keys, *args)
            try:
                return await client.execute_command(*evalsha, target_nodes=node)
            except redis_errors.NoScriptError:
                await client.execute_command("SCRIPT LOAD", script.script, target_nodes=node)
                return await client.execute_command(*evalsha, target_nodes=node)
        except _NOT_RUN_ERRORS as exc:
            not_run = not isinstance(exc, redis_errors.ConnectionError) or "connecting" in str(exc)
            if attempt == _NOT_SENT_TRIES or not not_run:
                raise
        await asyncio.sleep(0.05 * attempt)
    raise AssertionError("unreachable")  # (the loop returns or raises)


async def ping_primaries(client: redis_async_cluster.RedisCluster) -> None:
    """PING every primary of the cluster client's slot map, each on its own connection and
    without the client's retries (a dead one fails now, not after its backoff). Leaves the
    slot map alone (re-reading it is the reader's: see ``ClusterReader.regroup_soon``).
    Raises what a PING raised (a ``ConnectionError`` for a dead node)."""
    await client.initialize()  # (nothing once it knows the slots)
    await asyncio.gather(*(node.execute_command("PING") for node in client.get_primaries()))


def async_node_client(
    target: RedisTarget, host: str, port: int, connect_timeout_s: float, socket_timeout_s: float
) -> redis_asyncio.Redis:
    """Return a one-connection client to one cluster node (a node's reader), with the
    URL's credentials and TLS."""
    return redis_asyncio.Redis(
        host=host,
        port=port,
        socket_connect_timeout=connect_timeout_s,
        socket_timeout=socket_timeout_s,
        single_connection_client=True,
        **target._cluster_kwargs(),
    )


def async_client(
    target: RedisTarget, *, connect_timeout_s: float, socket_timeout_s: float
) -> redis_asyncio.Redis:
    """Return a one-connection client to the primary (the reader's ``XREAD BLOCK``)."""
    if target.sentinels:
        manager = async_sentinel.Sentinel(  # type: ignore[no-untyped-call]
            target.sentinels,
            sentinel_kwargs=target._sentinel_kwargs(connect_timeout_s, socket_timeout_s),
        )
        client: redis_asyncio.Redis = manager.master_for(
            target.service,
            socket_connect_timeout=connect_timeout_s,
            socket_timeout=socket_timeout_s,
            connection_class=target._async_connection_class(),
            **target._data_kwargs(),
        )
        # master_for builds the client from its pool and takes no single_connection_client:
        # the reader's one connection must stay its own (its blocked XREAD holds it).
        client.single_connection_client = True
        return client
    return redis_asyncio.Redis.from_url(
        target.url,
        socket_connect_timeout=connect_timeout_s,
        socket_timeout=socket_timeout_s,
        single_connection_client=True,
    )


def sync_client(target: RedisTarget, timeout_s: float) -> Any:
    """Return a synchronous client whose connect and commands are bounded by ``timeout_s``
    and never retried (one-shot use from a thread or a management command): a
    ``redis.Redis``, or a ``redis.cluster.RedisCluster`` for a cluster."""
    no_retry = Retry(NoBackoff(), 0)
    if target.cluster:
        return sync_cluster.RedisCluster(
            startup_nodes=[
                sync_cluster.ClusterNode(host, port)  # type: ignore[no-untyped-call]
                for host, port in target.cluster
            ],
            require_full_coverage=False,
            socket_connect_timeout=timeout_s,
            socket_timeout=timeout_s,
            retry=no_retry,
            **target._cluster_kwargs(),
        )
    if target.sentinels:
        manager = sync_sentinel.Sentinel(  # type: ignore[no-untyped-call]
            target.sentinels,
            sentinel_kwargs={
                **target._sentinel_kwargs(timeout_s, timeout_s),
                "retry": no_retry,
            },
        )
        client: redis.Redis = manager.master_for(  # type: ignore[no-untyped-call]
            target.service,
            socket_connect_timeout=timeout_s,
            socket_timeout=timeout_s,
            retry=no_retry,
            ssl=target.url.startswith("rediss://"),
            **target._data_kwargs(),
        )
        return client
    return redis.Redis.from_url(
        target.url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s, retry=no_retry
    )


#: The errors that mean "Redis is not there right now" (not a bug in our commands).
UNAVAILABLE_ERRORS: Final = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.BusyLoadingError,
    redis_errors.ReadOnlyError,
    redis_errors.TryAgainError,
    # With maxmemory-policy noeviction a full Redis refuses writes: not our bug, a 503.
    redis_errors.OutOfMemoryError,
    # A cluster failing over: a slot without a primary, the cluster down for now.
    redis_errors.ClusterDownError,
    redis_errors.SlotNotCoveredError,
    redis_errors.MasterDownError,
    redis_errors.MaxConnectionsError,
    OSError,
)

#: Error replies that mean "Redis cannot serve writes right now" (a script running too long,
#: a failed background save, no replicas), not a bug in our commands: a 503, not a 500.
_TRANSIENT_REPLIES: Final = ("BUSY", "MISCONF", "NOREPLICAS", "MASTERDOWN", "LOADING")


_TRANSIENT_REPLY_RE: Final = re.compile(
    r"(?:^|[:(']\s*)(?:" + "|".join(_TRANSIENT_REPLIES) + r")\b"
)


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` means Redis is out of reach or cannot serve now (never raises).

    Error replies count when they carry one of ``_TRANSIENT_REPLIES``, also as the cause
    of a discarded transaction or a failed pipeline command (redis-py wraps those).
    """
    if isinstance(exc, UNAVAILABLE_ERRORS):
        return True
    if isinstance(exc, redis_errors.RedisClusterException):  # no seed node answered
        return "cannot be connected" in str(exc)
    return isinstance(exc, redis_errors.ResponseError) and bool(
        _TRANSIENT_REPLY_RE.search(str(exc))
    )


@contextlib.contextmanager
def unavailable_as_error() -> Any:
    """Turn the errors :func:`is_unavailable` accepts (and OSError, and a connection
    closed under a command by the cluster client) into :class:`BackendUnavailableError`;
    other errors pass through."""
    try:
        yield
    except (AttributeError, RuntimeError) as exc:
        if not _CLOSED_UNDER_COMMAND.search(str(exc)):
            raise
        raise BackendUnavailableError(f"Redis connection closed under the command: {exc}") from exc
    except (redis_errors.RedisError, redis_errors.RedisClusterException) as exc:
        if not is_unavailable(exc):
            raise
        raise BackendUnavailableError(f"Redis is unavailable: {type(exc).__name__}: {exc}") from exc
    except OSError as exc:
        raise BackendUnavailableError(f"Redis is unavailable: {type(exc).__name__}: {exc}") from exc
