"""The shared ring of the Redis backend: ids, epochs and replay in Redis.

Layout (``P`` = the key prefix, ``S`` = a session id; the ``{S}`` hash tag keeps a
session's keys in one Redis Cluster slot):

``P:s:{S}:meta``   hash: ``epoch`` (token of the current id sequence), ``last`` (last id
                   issued), ``first`` (first id of this epoch), ``closed`` (id of the
                   ``session_closed`` event, once closed), ``bytes`` (what the stream
                   holds, kept by the publish script).
``P:s:{S}:stream`` a Redis Stream, the shared ring: entry ``<id>-0`` holds ``e`` = the
                   event's compact JSON envelope *without* its ``id`` (the id is the
                   entry id) and ``t`` (epoch ms when appended); trimmed by count, bytes
                   and age by the publish script (:mod:`redis_scripts`).
``P:s:{S}:notify`` (Cluster only) sharded pub/sub channel: the publish script announces
                   each new id there (:mod:`redis_cluster_reader`).
``P:proc:<uid>``   one process's report (JSON), written with a TTL.
``P:procs``        sorted set of process uids by last report time.
``P:proc:<uid>:wake`` a one-entry stream whose new entry wakes that process's reader.
``P:control``      pub/sub channel of control messages (disconnect a session's subscribers;
                   the operator dashboard's activity items, relayed to the other processes);
                   on a Cluster a sharded one (``SPUBLISH``). There each script and
                   ``MULTI`` touches one slot; the reader is :mod:`redis_cluster_reader`.

Ids are assigned by one Lua script (``HINCRBY`` + ``XADD`` together), so they are plain
integers without gaps in an epoch, whatever process publishes. If Redis loses a session's
data, :meth:`RedisStore.ensure_session` starts a new epoch whose ids continue above a
base the caller gives (the database's reserved high-water mark), so an old cursor is
recognised (EB-7).

Concurrency model: a store belongs to the event loop that created it (redis.asyncio
connections are bound to their loop), like the buses it feeds (EB-11). One *reader task*
per process runs ``XREAD BLOCK`` over every watched stream on a dedicated connection and
hands each entry to a callback on the loop; it never awaits the consumers, so local
backpressure stays local. This module imports nothing from Django.

Errors: every network method raises :class:`BackendUnavailableError` when Redis cannot be
reached or does not answer in time; the reader reports outages through its callbacks and
reconnects by itself (exponential backoff, 0.1 s doubling to 5 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
import redis.asyncio as redis_asyncio
from redis import exceptions as redis_errors

from sessions.backends.errors import BackendUnavailableError, OutcomeUnknownError
from sessions.backends.idempotency import IdempotencyKey, Remembered
from sessions.backends.redis_clients import (
    UNAVAILABLE_ERRORS,
    RedisTarget,
    async_client,
    async_cluster,
    async_node_client,
    async_pool,
    cluster_script_once,
    is_unavailable,
    unavailable_as_error,
)
from sessions.backends.redis_cluster_reader import ClusterReader
from sessions.backends.redis_listener import listen_control, report_forever
from sessions.backends.redis_replication import publish_replicated, replicated
from sessions.backends.redis_scripts import (
    CLOSED_KEYS_TTL_MS,
    ENSURE_LUA,
    IDEMPOTENCY_EXPIRE_BATCH,
    PUBLISH_LUA,
    RESTART_LUA,
    TRIM_BATCH,
    PublishOutcome,
    parse_remembered,
)
from sessions.bus import DEFAULT_RING_MAX_BYTES
from sessions.bus.ring import FRAME_OVERHEAD_BYTES

__all__ = [
    "BackendUnavailableError",
    "PublishOutcome",
    "RedisStore",
    "SessionHead",
    "SessionWindow",
]

logger = logging.getLogger("qwenweb.redis")

_CONNECT_TIMEOUT_S: Final = 2.0
_COMMAND_TIMEOUT_S: Final = 5.0
_READ_BLOCK_MS: Final = 5000
_READ_COUNT: Final = 1000
_BACKOFF_START_S: Final = 0.1
_BACKOFF_MAX_S: Final = 5.0
_CLOSE_RECANCEL_S: Final = 0.1
#: Connections of a process's command pool. A command that finds all of them busy waits
#: (at most ``_COMMAND_TIMEOUT_S``) for one to come back, instead of failing at once
#: ("Too many connections": a burst of stream opens answered 503 under granian).
_POOL_SIZE: Final = 100


@dataclass(frozen=True, slots=True)
class SessionHead:
    """A session's sequence as Redis has it: ``epoch`` None means Redis has no data."""

    epoch: str | None
    last_event_id: int
    closed: bool


@dataclass(frozen=True, slots=True)
class SessionWindow:
    """The shared ring read in one transaction: the head and the entries, oldest first.

    ``entries`` holds ``(id, envelope JSON without id)`` pairs.
    """

    head: SessionHead
    first_id: int
    entries: tuple[tuple[int, bytes], ...]


EntryHandler = Callable[[str, list[tuple[int, bytes]]], None]
#: ``(error, sessions)``: sessions None for all (one Redis), else one cluster node's.
OutageHandler = Callable[[BaseException, Collection[str] | None], None]
RecoveryHandler = Callable[[], None]
ControlHandler = Callable[[Mapping[str, Any]], None]


def entry_json(event_id: int, body: bytes) -> bytes:
    """Return the full envelope JSON: ``body`` (``{"v":…}``) with ``"id"`` put first."""
    return b'{"id":%d,%s' % (event_id, body[1:])


class RedisStore:
    """The Redis side of the backend for one process and one event loop.

    Must be created on the loop it will serve (``loop``).

    Args:
        target: a redis-py URL (``redis://host:port/db``) or a :class:`RedisTarget`
            (Sentinels: every connection follows the current primary).
        prefix: the key prefix (several deployments or test runs can share one Redis).
        process_ttl_s: how long a process's report stays without being renewed.
        wait: ``(REDIS_WAIT_REPLICAS, REDIS_WAIT_TIMEOUT_MS)``.
    """

    def __init__(
        self,
        target: str | RedisTarget,
        prefix: str,
        *,
        process_ttl_s: float = 10.0,
        wait: tuple[int, int] = (0, 1000),
    ) -> None:
        self.prefix = prefix
        #: ``(REDIS_WAIT_REPLICAS, its timeout ms)``: replicas > 0: nothing is handed on
        #: (reader, window) before it is on that many replicas (:mod:`redis_replication`).
        self.wait = wait
        self.process_ttl_s = process_ttl_s
        self.process_uid = secrets.token_hex(8)
        self.loop = asyncio.get_running_loop()
        self.target = target if isinstance(target, RedisTarget) else RedisTarget(target)
        self.url = self.target.url
        self.is_cluster = bool(self.target.cluster)
        self.client: Any
        if self.target.cluster:
            self.client = async_cluster(
                self.target,
                max_connections=_POOL_SIZE,
                connect_timeout_s=_CONNECT_TIMEOUT_S,
                socket_timeout_s=_COMMAND_TIMEOUT_S,
            )
        else:
            pool = async_pool(
                self.target,
                max_connections=_POOL_SIZE,
                timeout_s=_COMMAND_TIMEOUT_S,
                connect_timeout_s=_CONNECT_TIMEOUT_S,
                socket_timeout_s=_COMMAND_TIMEOUT_S,
            )
            self.client = redis_asyncio.Redis.from_pool(pool)  # closes the pool with it
        self.cluster_reader: ClusterReader | None = None
        self._publish_script = self.client.register_script(PUBLISH_LUA)
        self._ensure_script = self.client.register_script(ENSURE_LUA)
        self._restart_script = self.client.register_script(RESTART_LUA)
        self._watched: dict[str, int] = {}  # session id -> last id handed to the handler
        self._wake_key = f"{prefix}:proc:{self.process_uid}:wake"
        self._ack_key = f"{prefix}:proc:{self.process_uid}:ack"  # (written to WAIT on)
        self._wake_seen = b"0-0"
        self._tasks: list[asyncio.Task[None]] = []
        # Set by aclose: the loops end even where redis-py swallowed the cancellation.
        self.closing = False
        self.available = True
        #: ``(host, port)`` the reader last read from (with Sentinels: the primary they
        #: named), None before its first read.
        self.attached_to: tuple[str, int] | None = None
        # Set while the reader is connected; a successful command elsewhere pokes a reader
        # that is backing off after an outage, so it need not wait out its backoff.
        self._recovered = asyncio.Event()
        self._recovered.set()
        self._poke = asyncio.Event()
        # Set while Redis has confirmed the control listener's subscription: from then on
        # PUBLISH counts this process among the receivers of its own control messages.
        self.subscribed = asyncio.Event()

    # -- keys ------------------------------------------------------------------------------

    def meta_key(self, session_id: str) -> str:
        return f"{self.prefix}:s:{{{session_id}}}:meta"

    def stream_key(self, session_id: str) -> str:
        return f"{self.prefix}:s:{{{session_id}}}:stream"

    def idempotency_keys(self, session_id: str) -> tuple[str, str]:
        """The session's idempotency hash and its sorted set of first-request times."""
        base = f"{self.prefix}:s:{{{session_id}}}"
        return f"{base}:idem", f"{base}:idemt"

    def notify_channel(self, session_id: str) -> str:
        """The session's sharded notify channel (Cluster only; same slot as its keys)."""
        return f"{self.prefix}:s:{{{session_id}}}:notify"

    @property
    def control_channel(self) -> str:
        return f"{self.prefix}:control"

    def node_client(self, host: str, port: int) -> redis_asyncio.Redis:
        """A one-connection client to one cluster node (its reader, the control listener)."""
        timeouts = (_CONNECT_TIMEOUT_S, _COMMAND_TIMEOUT_S + _READ_BLOCK_MS / 1000)
        return async_node_client(self.target, host, port, *timeouts)

    # -- commands ----------------------------------------------------------------------------

    async def ensure_session(self, session_id: str, base_id: int) -> tuple[str, bool]:
        """Return ``(epoch, created)``; start a new epoch at ``base_id + 1`` if Redis has none.

        Raises :class:`BackendUnavailableError`.
        """
        keys = [self.meta_key(session_id), self.stream_key(session_id)]
        new_epoch = secrets.token_urlsafe(12)
        with unavailable_as_error():
            epoch, created = await self._ensure_script(keys=keys, args=[new_epoch, base_id])
        return _text(epoch), bool(created)

    async def restart_epoch(
        self, session_id: str, stale_epoch: str | None, base_id: int, known_last_id: int
    ) -> tuple[str, bool]:
        """Replace data Redis went back in time on (a restore from an older snapshot) with a
        new, empty epoch whose ids continue at ``base_id + 1``; ``(epoch, replaced)``.

        Does nothing if the session's epoch is no longer ``stale_epoch`` (another process
        restarted it first; its epoch is returned). Raises :class:`BackendUnavailableError`.
        """
        keys = [self.meta_key(session_id), self.stream_key(session_id)]
        new_epoch = secrets.token_urlsafe(12)
        with unavailable_as_error():
            epoch, replaced = await self._restart_script(
                keys=keys, args=[stale_epoch or "", new_epoch, base_id, known_last_id]
            )
        return _text(epoch), bool(replaced)

    async def wait_available(self, timeout_s: float) -> None:
        """Return once the reader is connected; after an outage, check Redis answers (PING
        on the pool), wake the reader and wait for it at most ``timeout_s``.

        Raises :class:`BackendUnavailableError` if Redis does not answer or the reader is
        not back in time.
        """
        if self.available:
            return
        with unavailable_as_error():
            await self.client.ping()
        self._poke.set()
        try:
            async with asyncio.timeout(timeout_s):
                await self._recovered.wait()
        except TimeoutError:
            raise BackendUnavailableError("this process's Redis reader is reconnecting") from None

    async def ping(self) -> None:
        """Check that Redis answers now (one PING; with Sentinels one ``ROLE``, which must
        say ``master``: a demoted primary answers too). Raises
        :class:`BackendUnavailableError`."""
        with unavailable_as_error():
            if self.cluster_reader is not None:  # every primary, every node's reader
                await self.cluster_reader.ping()
                return
            if not self.target.sentinels:
                await self.client.ping()
                return
            role: Any = await self.client.role()
        if _text(role[0]) != "master":
            await self._drop_idle_connections()  # the next ones ask the Sentinels again
            raise BackendUnavailableError("the Redis this process reached is not the primary")

    async def head(self, session_id: str) -> SessionHead:
        """Return the session's epoch, last id and closed flag. Raises BackendUnavailableError."""
        with unavailable_as_error():
            epoch, last, closed = await self.client.hmget(
                self.meta_key(session_id), ["epoch", "last", "closed"]
            )
        return SessionHead(
            epoch=_text(epoch) if epoch is not None else None,
            last_event_id=int(last or 0),
            closed=closed is not None,
        )

    async def window(self, session_id: str) -> SessionWindow:
        """Read the head and every entry of the shared ring in one transaction (MULTI);
        with ``wait``, only once all of it is on that many replicas.

        Raises :class:`BackendUnavailableError` (also: not replicated in time).
        """
        with unavailable_as_error():
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.hmget(self.meta_key(session_id), ["epoch", "last", "closed"])
                pipe.xrange(self.stream_key(session_id), "-", "+")
                (epoch, last, closed), raw_entries = await pipe.execute()
            waits = self.wait[0] and raw_entries  # (nothing to hand on: nothing to confirm)
            if waits and not await replicated(self.client, self._ack_key, *self.wait):
                raise BackendUnavailableError("the session's events are not replicated yet")
        head = SessionHead(
            epoch=_text(epoch) if epoch is not None else None,
            last_event_id=int(last or 0),
            closed=closed is not None,
        )
        entries = tuple((_entry_id(entry_id), fields[b"e"]) for entry_id, fields in raw_entries)
        first_id = entries[0][0] if entries else head.last_event_id + 1
        return SessionWindow(head=head, first_id=max(1, first_id), entries=entries)

    async def publish(
        self,
        session_id: str,
        body: bytes,
        ring_size: int,
        *,
        close: bool = False,
        known_last_id: int = 0,
        idempotency: IdempotencyKey | None = None,
        idempotency_ttl_s: float = 900.0,
        idempotency_max_keys: int = 10_000,
        max_bytes: int = DEFAULT_RING_MAX_BYTES,
        max_age_s: float = 0.0,
        closed_ttl_ms: int = CLOSED_KEYS_TTL_MS,
    ) -> PublishOutcome:
        """Assign the next id and append ``body`` to the shared ring, then trim it to
        ``ring_size`` entries, ``max_bytes`` (of :func:`~sessions.bus.held_bytes`) and
        ``max_age_s`` (0: no age limit), oldest first; the newest entry always stays.

        ``body`` is the compact JSON envelope without ``id`` (it must start with ``{"v":``).
        ``close`` marks the session closed after this event (``session_closed``) and lets
        its keys expire after ``closed_ttl_ms`` (at least ``CLOSED_KEYS_TTL_MS``).
        ``known_last_id``: the highest id the caller knows was issued; if Redis's last id is
        below it, Redis went back in time (restored from an older snapshot) and nothing is
        appended (status ``stale``): an id must never be issued twice in one epoch.
        ``idempotency``: a key already stored for the session (younger than
        ``idempotency_ttl_s``) appends nothing and answers status ``replay`` with its first
        result; a new key is stored with the new id, at most ``idempotency_max_keys`` per
        session (oldest dropped), all in the same script. The caller compares digests.
        The store's ``wait`` replicas > 0: ``WAIT <replicas> <timeout ms>`` follows
        the script on the same connection (a pipeline), also for a replayed key (after a
        write that covers the first one), so an ``ok`` or ``replay`` is on that many
        replicas.

        Raises:
            OutcomeUnknownError: fewer replicas confirmed in time (the write may be lost
                in a failover; a retry with the same key answers once it is confirmed),
                or Redis timed out or the connection was lost after the script was sent.
            BackendUnavailableError: Redis unreachable or too slow.
        """
        keys = [
            self.meta_key(session_id),
            self.stream_key(session_id),
            *self.idempotency_keys(session_id),
        ]
        args: list[bytes | str | int] = [
            body,
            ring_size,
            "1" if close else "0",
            known_last_id,
            max(CLOSED_KEYS_TTL_MS, closed_ttl_ms),
            idempotency.key if idempotency is not None else "",
            idempotency.digest if idempotency is not None else "",
            _now_ms(),
            max(1, int(idempotency_ttl_s * 1000)),
            idempotency_max_keys,
            IDEMPOTENCY_EXPIRE_BATCH,
            max_bytes,
            int(max_age_s * 1000),
            FRAME_OVERHEAD_BYTES,
            TRIM_BATCH,
            self.notify_channel(session_id) if self.is_cluster else "",
        ]
        try:
            with unavailable_as_error():
                if self.wait[0]:
                    script = self._publish_script
                    reply = await publish_replicated(self.client, script, keys, args, *self.wait)
                elif self.is_cluster:  # at most once (redis-py's resends are not)
                    reply = await cluster_script_once(self.client, self._publish_script, keys, args)
                else:
                    reply = await self._publish_script(keys=keys, args=args)
        except OutcomeUnknownError:
            raise
        except BackendUnavailableError as exc:
            if _may_have_run(exc.__cause__):
                raise OutcomeUnknownError(str(exc)) from exc.__cause__
            raise
        status = _text(reply[0])
        if status == "ok":
            return PublishOutcome("ok", _text(reply[1]), int(reply[2]))
        if status == "replay":
            remembered = parse_remembered(_text(reply[1]))
            if remembered is not None:
                return PublishOutcome("replay", remembered.epoch, remembered.id, remembered)
            logger.warning("idempotency_entry_unreadable session=%s", session_id)
            return PublishOutcome("noepoch")
        if status in ("closed", "stale"):
            return PublishOutcome(status, _text(reply[1]))
        return PublishOutcome("noepoch")

    async def recall(self, session_id: str, key: str, *, ttl_s: float = 900.0) -> Remembered | None:
        """Return the first result stored for ``key`` in the session (younger than
        ``ttl_s``), or None. Reads only. Raises :class:`BackendUnavailableError`."""
        idem, times = self.idempotency_keys(session_id)
        with unavailable_as_error():
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.hget(idem, key)
                pipe.zscore(times, key)
                raw, first_at_ms = await pipe.execute()
        if raw is None or first_at_ms is None:
            return None
        if _now_ms() - float(first_at_ms) >= ttl_s * 1000:
            return None
        return parse_remembered(_text(raw))

    async def send_control(self, message: Mapping[str, Any]) -> int:
        """Publish a control message to every other process; return how many received it.

        A store whose listener started but is not subscribed yet waits for that (at most
        the connect timeout), so that the count leaves this process out exactly.
        Raises :class:`BackendUnavailableError`.
        """
        if self._tasks and not self.subscribed.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_CONNECT_TIMEOUT_S):
                    await self.subscribed.wait()
        payload = orjson.dumps({**message, "from": self.process_uid})
        with unavailable_as_error():
            send = self.client.spublish if self.is_cluster else self.client.publish
            receivers = int(await send(self.control_channel, payload))
        return max(0, receivers - (1 if self.subscribed.is_set() else 0))

    async def report(self, report: Mapping[str, Any]) -> None:
        """Write this process's report with the TTL and note the process as alive."""
        now = time.time()
        ttl_ms = max(1, int(self.process_ttl_s * 1000))
        key = f"{self.prefix}:proc:{self.process_uid}"
        with unavailable_as_error():  # (no MULTI: on a Cluster these keys are on several slots)
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.set(key, orjson.dumps({**report, "process": self.process_uid}), px=ttl_ms)
                pipe.zadd(f"{self.prefix}:procs", {self.process_uid: now})
                pipe.pexpire(self._wake_key, 10 * ttl_ms)  # a killed process leaves none
                pipe.zremrangebyscore(f"{self.prefix}:procs", "-inf", now - 10 * self.process_ttl_s)
                await pipe.execute()

    async def reports(self) -> list[dict[str, Any]]:
        """Return the reports of every live process (expired ones are gone)."""
        with unavailable_as_error():
            uids = await self.client.zrange(f"{self.prefix}:procs", 0, -1)
            if not uids:
                return []
            keys = report_keys(self.prefix, uids)
            if self.is_cluster:
                raw = await self.client.mget_nonatomic(keys)
            else:
                raw = await self.client.mget(keys)
        return [orjson.loads(item) for item in raw if item is not None]

    # -- the reader -------------------------------------------------------------------------

    def watch(self, session_id: str, after_id: int) -> None:
        """Deliver the session's entries after ``after_id`` to the entry handler from now on."""
        self._watched[session_id] = after_id
        self._wake()

    def unwatch(self, session_id: str) -> None:
        """Stop reading the session's stream. Never raises."""
        self._watched.pop(session_id, None)
        if self.cluster_reader is not None:
            self.cluster_reader.regroup_soon()

    def _wake(self) -> None:
        """Make a blocked ``XREAD`` return now (a new entry in this process's wake stream);
        on a Cluster, group the watched sessions by node again."""
        if self.cluster_reader is not None:
            self.cluster_reader.regroup_soon()
            return
        if not self._tasks:
            return
        task = asyncio.get_running_loop().create_task(self._send_wake())
        self._tasks.append(task)
        task.add_done_callback(self._forget_task)

    def _forget_task(self, task: asyncio.Task[None]) -> None:
        with contextlib.suppress(ValueError):
            self._tasks.remove(task)
        if not task.cancelled() and task.exception() is not None:
            logger.debug("wake failed: %r", task.exception())

    async def _send_wake(self) -> None:
        with contextlib.suppress(*UNAVAILABLE_ERRORS):
            await self.client.xadd(self._wake_key, {"w": "1"}, maxlen=1)

    def start(
        self,
        on_entries: EntryHandler,
        on_outage: OutageHandler,
        on_recovery: RecoveryHandler,
        on_control: ControlHandler,
        make_report: Callable[[], Mapping[str, Any]],
    ) -> None:
        """Start the reader, the control listener and the reporter on the running loop."""
        loop = asyncio.get_running_loop()
        reader: Any
        if self.is_cluster:
            self.cluster_reader = ClusterReader(
                self.client,
                self.node_client,
                self._watched,
                self.stream_key,
                self.notify_channel,
                on_entries,
                on_outage,
                on_recovery,
            )
            reader = self.cluster_reader.run()
        else:
            reader = self._read_forever(on_entries, on_outage, on_recovery)
        self._tasks = [
            loop.create_task(reader),
            loop.create_task(listen_control(self, on_control)),
            loop.create_task(report_forever(self, make_report)),
        ]

    async def _read_forever(
        self, on_entries: EntryHandler, on_outage: OutageHandler, on_recovery: RecoveryHandler
    ) -> None:
        backoff = _BACKOFF_START_S
        reader = async_client(
            self.target,
            connect_timeout_s=_CONNECT_TIMEOUT_S,
            socket_timeout_s=_COMMAND_TIMEOUT_S + _READ_BLOCK_MS / 1000,
        )
        try:
            while not self.closing:
                try:
                    await self._read_once(reader, on_entries)
                    if not self.available:
                        await self._drop_idle_connections()
                        self.available = True
                        self._recovered.set()
                        logger.warning("backend_recovered url=%s", self.target.describe())
                        on_recovery()
                    backoff = _BACKOFF_START_S
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the reader must never die: treat it as an outage
                    if not is_unavailable(exc):
                        logger.exception("reader_failed url=%s", self.target.describe())
                    if self.available:
                        self.available = False
                        self._recovered.clear()
                        logger.error(
                            "backend_unavailable url=%s error=%s",
                            self.target.describe(),
                            f"{type(exc).__name__}: {exc}",
                        )
                        on_outage(exc, None)
                        await self._drop_idle_connections()
                    with contextlib.suppress(Exception):
                        await reader.connection.disconnect()  # type: ignore[union-attr]
                    self._poke.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(backoff):  # or until poked
                            await self._poke.wait()
                    backoff = min(backoff * 2, _BACKOFF_MAX_S)
        finally:
            with contextlib.suppress(Exception):
                await reader.aclose()

    async def _drop_idle_connections(self) -> None:
        """Close the pool's idle connections, at an outage and at the recovery. Never raises.

        A Redis that went away closed them; redis-py only checks a pooled connection for
        unread data, so each would fail one command (a spurious 503) after Redis returns.
        Connections in use are left alone: a failing command disconnects its own.
        """
        with contextlib.suppress(Exception):
            await self.client.connection_pool.disconnect(inuse_connections=False)

    async def _read_once(self, reader: redis_asyncio.Redis, on_entries: EntryHandler) -> None:
        streams: dict[Any, Any] = {self._wake_key: self._wake_seen}
        by_key: dict[str, str] = {}
        for session_id, after in self._watched.items():
            key = self.stream_key(session_id)
            by_key[key] = session_id
            streams[key] = f"{after}-0"
        if not self.available:  # after an outage: answer recovery at once, not after BLOCK
            await reader.ping()
            self._note_attached(reader)
            return
        reply: Any = await reader.xread(streams, count=_READ_COUNT, block=_READ_BLOCK_MS)
        self._note_attached(reader)
        # Hand on only what is on the replicas: a failover cannot take back an event a
        # client saw. Not yet: read it again (the cursors stay) and ask again.
        if (
            self.wait[0]
            and any(_text(key) != self._wake_key for key, _ in reply or ())
            and not await replicated(self.client, self._ack_key, *self.wait)
        ):
            return
        for raw_key, raw_entries in reply or ():
            key = _text(raw_key)
            if key == self._wake_key:
                if raw_entries:
                    self._wake_seen = raw_entries[-1][0]
                continue
            watched_id = by_key.get(key)
            if watched_id is None or watched_id not in self._watched or not raw_entries:
                continue
            entries = [(_entry_id(entry_id), fields[b"e"]) for entry_id, fields in raw_entries]
            self._watched[watched_id] = entries[-1][0]
            on_entries(watched_id, entries)

    def _note_attached(self, reader: redis_asyncio.Redis) -> None:
        connection = reader.connection
        if connection is not None:
            self.attached_to = (str(connection.host), int(connection.port))

    async def aclose(self) -> None:
        """Stop the tasks, forget this process's report and close the connections."""
        self.closing = True
        tasks, self._tasks = self._tasks, []
        pending = set(tasks)
        while pending:  # redis-py can swallow a cancellation (a read it had just finished)
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=_CLOSE_RECANCEL_S)
        await asyncio.gather(*tasks, return_exceptions=True)  # (all done: retrieves errors)
        with contextlib.suppress(Exception):
            await self.client.delete(f"{self.prefix}:proc:{self.process_uid}")  # (two slots)
            await self.client.delete(self._wake_key)
            await self.client.zrem(f"{self.prefix}:procs", self.process_uid)
        with contextlib.suppress(Exception):
            await (self.client.close_connections() if self.is_cluster else self.client.aclose())


def report_keys(prefix: str, uids: Any) -> list[str]:
    return [f"{prefix}:proc:{_text(uid)}" for uid in uids]


def _may_have_run(cause: BaseException | None) -> bool:
    """Whether a command that failed with ``cause`` may still have run in Redis: a reply
    that did not come in time, or a connection lost once it was open (not one that could
    not be opened: then nothing was sent). Never raises."""
    lost = redis_errors.TimeoutError | TimeoutError | redis_errors.ConnectionError
    return isinstance(cause, lost) and "connecting" not in str(cause)  # (redis-py's words)


def _now_ms() -> int:
    """Wall-clock epoch milliseconds: the idempotency keys' times (comparable across
    processes)."""
    return int(time.time() * 1000)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _entry_id(raw: bytes | str) -> int:
    text = _text(raw)
    return int(text.partition("-")[0])
