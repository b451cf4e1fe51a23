"""The Redis backend's reader on a Redis Cluster: one reader per primary node.

On one Redis the reader blocks in one ``XREAD`` over every watched stream. A Cluster
refuses that (``CROSSSLOT``: every key of one command must be in one slot, even on one
node), so here each primary node has one reader task with one connection of its own,
subscribed (sharded pub/sub, ``SSUBSCRIBE``, one command per session, all on that node)
to the notify channel of each watched session whose slot the node serves. The publish
script announces every new id on its session's channel (``SPUBLISH``, same slot), and the
reader then reads that session's new entries (``XREAD`` of one stream, after the id it
last handed on) on its own second connection to the node, and hands them on in order.

Messages can be lost (a dropped connection, a slot moving): after every (re)subscription
the node's sessions are read once, and every ``SWEEP_S`` all of them again, so a lost
notification delays entries, never loses them (a read always starts at the cursor).

Sessions are grouped by the slot map of the cluster client. A ``MOVED``/``ASK`` on a read,
a ``sunsubscribe`` pushed by the node (the slot left it), or a lost node refreshes the
slot map and re-groups: a session whose node changed ends its streams (as for a lost
node), and is read on its new node once a client loads it again (the epoch checks of a
new mirror catch a promoted replica that is behind). A node whose connection fails ends
only *its* sessions' streams (the outage handler is given their ids): the other nodes'
readers go on. This module imports nothing from Django.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection
from typing import Any, Final

import redis.asyncio as redis_asyncio
import redis.asyncio.cluster as async_cluster
from redis import exceptions as redis_errors

from sessions.backends.errors import BackendUnavailableError
from sessions.backends.redis_clients import is_unavailable, ping_primaries

__all__ = ["ClusterReader"]

logger = logging.getLogger("qwenweb.redis")

#: Every watched session is read this often even without a notification (a lost one).
SWEEP_S: Final = 5.0
_READ_COUNT: Final = 1000
#: The slot map is re-read at most this often (a refresh reconnects the client's pool).
_REFRESH_EVERY_S: Final = 1.0
#: How long a node reader waits for a notification before it looks at its sessions again
#: (a newly watched one is subscribed within this).
_POLL_S: Final = 0.2
_BACKOFF_START_S: Final = 0.1
_BACKOFF_MAX_S: Final = 5.0

EntriesHandler = Callable[[str, list[tuple[int, bytes]]], None]
NodeOutageHandler = Callable[[BaseException, Collection[str] | None], None]
NodeClientFactory = Callable[[str, int], redis_asyncio.Redis]


class _NodeReader:
    """The reader of one primary node (``host:port``): its sessions, its subscriptions."""

    def __init__(self, owner: ClusterReader, host: str, port: int) -> None:
        self.owner = owner
        self.host, self.port = host, port
        self.sessions: set[str] = set()
        self.subscribed: set[str] = set()
        self.dirty: set[str] = set()
        self.attached = False
        self.task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return f"{self.host}:{self.port}"

    async def run(self) -> None:
        owner = self.owner
        backoff = _BACKOFF_START_S
        while self.sessions and not owner.closing:
            client = owner.node_client(self.host, self.port)
            pubsub = client.pubsub()
            try:
                await self._serve(client, pubsub)
                backoff = _BACKOFF_START_S
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never dies: this node's sessions end, others go on
                if not is_unavailable(exc) and not isinstance(exc, redis_errors.ResponseError):
                    logger.exception("cluster_reader_failed node=%s", self.name)
                lost = set(self.sessions)
                self.attached = False
                self.subscribed.clear()
                logger.error(
                    "cluster_node_unavailable node=%s sessions=%d error=%s",
                    self.name,
                    len(lost),
                    f"{type(exc).__name__}: {exc}",
                )
                owner.node_failed(self, exc, lost)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_S)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
                with contextlib.suppress(Exception):
                    await client.aclose()
        self.attached = False

    async def _serve(self, client: redis_asyncio.Redis, pubsub: Any) -> None:
        owner = self.owner
        loop = asyncio.get_running_loop()
        await pubsub.ping()  # connects now: a dead node fails here, not at the first message
        swept_at = loop.time()
        first = True
        while self.sessions and not owner.closing:
            await self._sync_subscriptions(pubsub)
            if first:  # every session once after a (re)subscription: nothing missed
                self.dirty |= self.sessions
                first = False
                if not self.attached:
                    self.attached = True
                    owner.node_attached(self)
            if loop.time() - swept_at >= SWEEP_S:
                self.dirty |= self.sessions
                swept_at = loop.time()
            if self.dirty:
                await self._read_dirty(client)
                continue
            message = await pubsub.get_message(timeout=_POLL_S)
            while message is not None:
                self._take(message)
                message = await pubsub.get_message(timeout=0)

    def _take(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        session_id = self.owner.session_of(message.get("channel"))
        if session_id is None:
            return
        if kind == "smessage" and session_id in self.sessions:
            self.dirty.add(session_id)
        elif kind == "sunsubscribe":
            self.subscribed.discard(session_id)
            if session_id in self.sessions:  # pushed by the node: the slot moved away
                self.owner.regroup_soon(refresh=True)

    async def _sync_subscriptions(self, pubsub: Any) -> None:
        owner = self.owner
        for session_id in self.sessions - self.subscribed:
            await pubsub.ssubscribe(owner.channel(session_id))
            self.subscribed.add(session_id)
        for session_id in self.subscribed - self.sessions:
            await pubsub.sunsubscribe(owner.channel(session_id))
            self.subscribed.discard(session_id)

    async def _read_dirty(self, client: redis_asyncio.Redis) -> None:
        """Read each dirty session's new entries on this node's own connection (not the
        shared cluster client: its errors about other nodes are not this node's)."""
        owner = self.owner
        dirty, self.dirty = self.dirty, set()
        for session_id in dirty:
            after = owner.watched.get(session_id)
            if after is None or session_id not in self.sessions:
                continue
            try:
                reply: Any = await client.xread(
                    {owner.stream_key(session_id): f"{after}-0"}, count=_READ_COUNT
                )
            except (redis_errors.MovedError, redis_errors.AskError):  # the slot moved
                owner.regroup_soon(refresh=True)
                continue
            for _, raw_entries in reply or ():
                if raw_entries:
                    owner.deliver(session_id, raw_entries)
                    if len(raw_entries) >= _READ_COUNT:
                        self.dirty.add(session_id)  # more behind this batch


class ClusterReader:
    """Reads the watched sessions' streams, one :class:`_NodeReader` per primary node.

    ``watched`` is the store's map session id -> last id handed on (this reader updates
    it); ``stream_key`` and ``channel`` name a session's stream and notify channel;
    ``on_entries(session, entries)`` gets new entries in order; ``on_outage(error,
    sessions)`` the sessions of a node that failed; ``on_recovery()`` a node attached
    after a failure. Runs on the loop it was started on.
    """

    def __init__(
        self,
        client: async_cluster.RedisCluster,
        node_client: NodeClientFactory,
        watched: dict[str, int],
        stream_key: Callable[[str], str],
        channel: Callable[[str], str],
        on_entries: EntriesHandler,
        on_outage: NodeOutageHandler,
        on_recovery: Callable[[], None],
    ) -> None:
        self.client = client
        self.node_client = node_client
        self.watched = watched
        self.stream_key = stream_key
        self.channel = channel
        self._channel_prefix, _, self._channel_suffix = channel("\0").partition("\0")
        self._on_entries = on_entries
        self._on_outage = on_outage
        self._on_recovery = on_recovery
        self._nodes: dict[str, _NodeReader] = {}
        self._regroup = asyncio.Event()
        self._refresh = False
        self._refreshed_at = float("-inf")
        self._failed = False
        self.closing = False

    # -- what the store calls ---------------------------------------------------------------

    def regroup_soon(self, *, refresh: bool = False) -> None:
        """Re-group the watched sessions by node now (``refresh``: re-read the slot map)."""
        self._refresh = self._refresh or refresh
        self._regroup.set()

    @property
    def attached(self) -> bool:
        """Whether every node that has sessions to read is attached."""
        return all(node.attached for node in self._nodes.values() if node.sessions)

    def attached_for(self, session_id: str) -> bool:
        """Whether the node reader of ``session_id`` (if any yet) is attached."""
        for node in self._nodes.values():
            if session_id in node.sessions:
                return node.attached
        return True

    async def ping(self) -> None:
        """Raise unless every primary of the slot map answers PING and every node reader
        with sessions is attached (``/readyz``); a failed PING re-reads the slot map soon
        (a replica may have been promoted). Raises ``BackendUnavailableError`` or what the
        PING raised."""
        try:
            await ping_primaries(self.client)
        except Exception:
            self.regroup_soon(refresh=True)
            raise
        if not self.attached:
            raise BackendUnavailableError("a cluster node's reader is reconnecting")

    async def run(self) -> None:
        """Group, start and stop node readers until closed (the supervisor task)."""
        try:
            while not self.closing:
                try:
                    now = asyncio.get_running_loop().time()
                    if self._refresh and now - self._refreshed_at >= _REFRESH_EVERY_S:
                        self._refresh = False
                        self._refreshed_at = now
                        await self.client.nodes_manager.initialize()
                    self._assign()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if not is_unavailable(exc):
                        logger.exception("cluster_regroup_failed")
                    self._refresh = True
                self._regroup.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0 if self._refresh else SWEEP_S):
                        await self._regroup.wait()
        finally:
            tasks = [n.task for n in self._nodes.values() if n.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- node readers' callbacks --------------------------------------------------------------

    def session_of(self, raw_channel: Any) -> str | None:
        text = raw_channel.decode() if isinstance(raw_channel, bytes) else str(raw_channel)
        if not (text.startswith(self._channel_prefix) and text.endswith(self._channel_suffix)):
            return None
        return text[len(self._channel_prefix) : len(text) - len(self._channel_suffix)]

    def deliver(self, session_id: str, raw_entries: list[Any]) -> None:
        entries = [(_entry_id(entry_id), fields[b"e"]) for entry_id, fields in raw_entries]
        after = self.watched.get(session_id)
        if after is None:
            return
        entries = [entry for entry in entries if entry[0] > after]
        if not entries:
            return
        self.watched[session_id] = entries[-1][0]
        self._on_entries(session_id, entries)

    def node_failed(self, node: _NodeReader, exc: BaseException, sessions: set[str]) -> None:
        self._failed = True
        for session_id in sessions:
            self.watched.pop(session_id, None)
        node.sessions -= sessions
        self._on_outage(exc, sessions)
        self.regroup_soon(refresh=True)

    def node_attached(self, node: _NodeReader) -> None:
        logger.info("cluster_node_attached node=%s sessions=%d", node.name, len(node.sessions))
        if self._failed and self.attached:
            self._failed = False
            self._on_recovery()

    # -- grouping -----------------------------------------------------------------------------

    def _assign(self) -> None:
        """Put each watched session on the reader of the node serving its slot."""
        wanted: dict[str, set[str]] = {}
        where: dict[str, tuple[str, int]] = {}
        for session_id in self.watched:
            node = self.client.get_node_from_key(self.stream_key(session_id))
            if node is None:
                continue
            wanted.setdefault(node.name, set()).add(session_id)
            where[node.name] = (node.host, int(node.port))
        # A session whose slot is now served by another node (a failover, or a slot
        # moved) ends its streams like a lost node's: its mirror is rebuilt on the new node
        # with the epoch checks (a promoted replica may be behind what was delivered).
        was = {sid: name for name, reader in self._nodes.items() for sid in reader.sessions}
        moved = {sid for name, sids in wanted.items() for sid in sids if was.get(sid, name) != name}
        if moved:
            for sids in wanted.values():
                sids -= moved
            for session_id in moved:
                self.watched.pop(session_id, None)
            logger.warning("cluster_sessions_moved sessions=%d", len(moved))
            self._on_outage(redis_errors.ConnectionError("the slot moved to another node"), moved)
        for name, reader in list(self._nodes.items()):
            sessions = wanted.get(name, set())
            moved_in = sessions - reader.sessions
            reader.sessions = sessions
            reader.dirty |= moved_in
            if not sessions and (reader.task is None or reader.task.done()):
                del self._nodes[name]
        for name, sessions in wanted.items():
            found = self._nodes.get(name)
            if found is None:
                found = self._nodes[name] = _NodeReader(self, *where[name])
                found.sessions = sessions
            if found.task is None or found.task.done():
                found.task = asyncio.get_running_loop().create_task(found.run())


def _entry_id(raw: bytes | str) -> int:
    text = raw.decode() if isinstance(raw, bytes) else raw
    return int(text.partition("-")[0])
