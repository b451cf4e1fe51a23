"""Redis faults under two server processes: the Redis backend's failure behaviour.

Each test starts a *private* ``redis-server`` on a free port with its data directory in the
test's ``tmp_path`` and two ``python -m qwenweb.serve`` processes (``QWENWEB_BACKEND=redis``)
pointing at it, then breaks that Redis on purpose:

- ``FLUSHDB`` (the session's data lost while Redis stays up);
- Redis stopped and started again with its AOF (``appendfsync always``): an outage that
  loses nothing;
- Redis stopped and started again without persistence: an outage that loses everything.

What must hold: Redis unreachable -> publish answers 503 with a clear error, open streams
get ``stream_error`` and end, new streams get 503; when Redis returns everything resumes
without a restart, and nothing published before the outage and still in the stream is
lost. When Redis has lost a session's data, a new epoch starts above the database's
reserved high-water mark, so old cursors get ``state_resync_required`` (EB-7) and are
never answered with events of another epoch as if they were new.

The machine's shared Redis (127.0.0.1:6379) is never touched. Every wait is bounded
(``RECOVERY_S``): the servers' readers reconnect with a backoff of up to 5 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import redis

from sessions.wire import ServerSentEvent
from tests.support.redis_server import PrivateRedis
from tests.support.server import (
    RawSSEClient,
    RemoteSession,
    ServerProcess,
    event_ids,
    free_port,
    start_redis_server,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.own_backend, pytest.mark.asyncio]

PREFIX = "qwtest-faults"
#: Bound of every wait around an outage: the readers' reconnect backoff (<= 5 s), with room.
RECOVERY_S = 20.0
UNAVAILABLE_LINE = re.compile(r"qwenweb\.redis backend_unavailable ")
RECOVERED_LINE = re.compile(r"qwenweb\.redis backend_recovered ")


def _running_redis(directory: Path, *, persistent: bool) -> Iterator[PrivateRedis]:
    server = PrivateRedis(free_port(), directory, persistent).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def aof_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    yield from _running_redis(tmp_path, persistent=True)


@pytest.fixture
def volatile_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    yield from _running_redis(tmp_path, persistent=False)


# -- two server processes on it --------------------------------------------------------------


@dataclass
class Cluster:
    """Two server processes sharing one database and the private Redis."""

    a: ServerProcess
    b: ServerProcess
    redis: PrivateRedis
    database: Path

    @property
    def servers(self) -> tuple[ServerProcess, ServerProcess]:
        return self.a, self.b


def _start(database: Path, redis_url: str, log_path: Path) -> ServerProcess:
    return start_redis_server(database, redis_url, PREFIX, log_path)


def _running_cluster(database: Path, private: PrivateRedis, logs: Path) -> Iterator[Cluster]:
    a = _start(database, private.url, logs / "a.log")
    try:
        b = _start(database, private.url, logs / "b.log")
    except BaseException:
        a.stop()
        raise
    try:
        yield Cluster(a, b, private, database)
    finally:
        a.stop()
        b.stop()


@pytest.fixture
def aof_cluster(e2e_database: Path, aof_redis: PrivateRedis, tmp_path: Path) -> Iterator[Cluster]:
    yield from _running_cluster(e2e_database, aof_redis, tmp_path)


@pytest.fixture
def volatile_cluster(
    e2e_database: Path, volatile_redis: PrivateRedis, tmp_path: Path
) -> Iterator[Cluster]:
    yield from _running_cluster(e2e_database, volatile_redis, tmp_path)


# -- helpers ---------------------------------------------------------------------------------


def _publish(
    server: ServerProcess, session: RemoteSession, event_type: str = "note"
) -> tuple[int, Any, dict[str, str]]:
    """POST one event to ``server``: ``(status, JSON body, lowercased headers)``."""
    request = urllib.request.Request(
        f"{server.base_url}{session.events_path}",
        data=json.dumps({"type": event_type}).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {session.publish_token}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            status, raw, headers = response.status, response.read(), response.headers
    except urllib.error.HTTPError as exc:
        status, raw, headers = exc.code, exc.read(), exc.headers
    return status, json.loads(raw), {k.lower(): v for k, v in headers.items()}


def _publish_ok(server: ServerProcess, session: RemoteSession) -> tuple[int, str]:
    """Publish on ``server``, which must answer 200: ``(id, epoch)``."""
    status, body, _ = _publish(server, session)
    assert status == 200, body
    return int(body["id"]), str(body["epoch"])


def _publish_once_back(server: ServerProcess, session: RemoteSession) -> tuple[int, str]:
    """Publish until Redis is back (503 ``backend_unavailable`` meanwhile, nothing else)."""
    deadline = time.monotonic() + RECOVERY_S
    while True:
        status, body, _ = _publish(server, session)
        if status == 200:
            return int(body["id"]), str(body["epoch"])
        assert (status, body["code"]) == (503, "backend_unavailable"), body
        assert time.monotonic() < deadline, (
            f"publish still answers 503 after Redis returned: {body} {server.log()[-3000:]}"
        )
        time.sleep(0.1)


async def _publish_concurrently(cluster: Cluster, session: RemoteSession, count: int) -> list[int]:
    """Publish ``count`` events at once, alternating between the processes; every one must
    answer 200 at the first try. Returns the ids in completion order."""
    servers = [cluster.servers[n % 2] for n in range(count)]
    answers = await asyncio.gather(*(asyncio.to_thread(_publish, s, session) for s in servers))
    assert [status for status, _, _ in answers] == [200] * count, answers
    return [int(body["id"]) for _, body, _ in answers]


def _reserved_mark(database: Path, session_id: str) -> int:
    """The session row's ``event_id_reserved``, read from the database file."""
    with sqlite3.connect(database) as db:
        (reserved,) = db.execute(
            "SELECT event_id_reserved FROM agent_sessions_agentsession WHERE id = ?",
            (session_id,),
        ).fetchone()
    return int(reserved)


def _frames(events: list[ServerSentEvent]) -> list[dict[str, Any]]:
    return [json.loads(e.data) for e in events]


def _saw(event_type: str) -> Any:
    """A ``read_until`` predicate: an event of ``event_type`` was read."""
    return lambda events: any(e.type == event_type for e in events)


def _saw_id(event_id: int) -> Any:
    """A ``read_until`` predicate: the event ``event_id`` was read."""
    return lambda events: event_id in event_ids(events)


class Streams:
    """Opens SSE streams for a test and closes whatever is still open at its end."""

    def __init__(self) -> None:
        self.opened: list[RawSSEClient] = []

    async def live(self, server: ServerProcess, session: RemoteSession) -> RawSSEClient:
        """A live-only stream (no cursor) that must answer 200."""
        return await self.resume(server, session, None, None)

    async def resume(
        self,
        server: ServerProcess,
        session: RemoteSession,
        cursor: int | None,
        epoch: str | None,
        *,
        expect_status: int = 200,
    ) -> RawSSEClient:
        """A stream with ``Last-Event-ID: cursor`` (and ``X-Event-Epoch``) answering
        ``expect_status``; a 200 is returned open, any other status read to its end."""
        headers = [] if cursor is None else [("Last-Event-ID", str(cursor))]
        if epoch is not None:
            headers.append(("X-Event-Epoch", epoch))
        client = RawSSEClient(
            server.port,
            session.events_path,
            [
                ("Accept", "text/event-stream"),
                ("Authorization", f"Bearer {session.read_token}"),
                *headers,
            ],
        )
        self.opened.append(client)
        await client.connect(timeout_s=RECOVERY_S)
        if client.status != 200:
            await client.read_to_end(timeout_s=RECOVERY_S)
        assert client.status == expect_status, bytes(client.body)
        return client

    def close_all(self) -> None:
        for client in self.opened:
            if hasattr(client, "_writer"):  # connected
                client.close()


@pytest_asyncio.fixture
async def streams() -> AsyncIterator[Streams]:
    opened = Streams()
    yield opened
    opened.close_all()


def _assert_ended_by_backend_error(client: RawSSEClient, ids: list[int]) -> None:
    """The stream delivered ``ids``, then exactly one ``backend_unavailable`` error, then ended."""
    assert client.ended
    assert event_ids(client.events) == ids
    errors = [f for f in _frames(client.events) if f["type"] == "stream_error"]
    assert len(errors) == 1, errors
    assert client.events[-1].type == "stream_error"
    assert errors[0]["data"] == {"error": "event store unavailable", "code": "backend_unavailable"}
    assert "id" not in errors[0]


async def _assert_new_stream_refused(
    streams: Streams, server: ServerProcess, session: RemoteSession
) -> None:
    refused = await streams.resume(server, session, None, None, expect_status=503)
    assert refused.ended
    assert refused.response_headers["content-type"] == "application/json"
    assert refused.response_headers["retry-after"].isdigit()
    assert json.loads(bytes(refused.body))["code"] == "backend_unavailable"


def _outage_lines(server: ServerProcess) -> tuple[int, int]:
    log = server.log()
    return len(UNAVAILABLE_LINE.findall(log)), len(RECOVERED_LINE.findall(log))


def _has_recovered(server: ServerProcess) -> bool:
    return _outage_lines(server)[1] >= 1


def _wait_until_recovered(cluster: Cluster) -> None:
    """Wait (bounded) until both processes' readers logged ``backend_recovered``."""
    for server in cluster.servers:
        assert wait_for(partial(_has_recovered, server), RECOVERY_S, 0.1), server.log()[-3000:]


def _assert_one_outage_logged(cluster: Cluster) -> None:
    """Each reader logged one ``backend_unavailable`` and one ``backend_recovered`` line."""
    for server in cluster.servers:
        assert _outage_lines(server) == (1, 1), server.log()[-3000:]


# -- the tests -------------------------------------------------------------------------------


async def test_flushdb_gives_epoch_reset_and_the_session_goes_on_above_the_mark(
    aof_cluster: Cluster, streams: Streams
) -> None:
    """FLUSHDB: old cursors resync (EB-7), new ids start above the reserved mark.

    With ``X-Event-Epoch`` the resync says ``epoch_reset`` / ``epoch_mismatch``. Without
    it the new epoch's ids are all above the cursor and none is kept below them, so our
    rules give ``ring_evicted`` ("empty ring with a gap", EB-7): a resync either way, and
    no old-epoch id is ever replayed as new.
    """
    cluster = aof_cluster
    session = RemoteSession.create(cluster.a.base_url)
    old_a, old_b = await streams.live(cluster.a, session), await streams.live(cluster.b, session)
    assert [_publish_ok(cluster.a, session)[0] for _ in range(5)] == [1, 2, 3, 4, 5]
    old_epoch = old_a.response_headers["x-event-epoch"]
    for client in (old_a, old_b):
        assert event_ids(await client.read_until(_saw_id(5))) == [1, 2, 3, 4, 5]
    mark = _reserved_mark(cluster.database, session.id)
    assert mark >= 5

    with cluster.redis.client() as client:
        assert client.flushdb() is True

    with_epoch = await streams.resume(cluster.b, session, 5, old_epoch)
    new_epoch = with_epoch.response_headers["x-event-epoch"]
    assert new_epoch != old_epoch
    frames = _frames(await with_epoch.read_until(_saw("replay_complete")))
    assert [f["type"] for f in frames] == ["state_resync_required", "replay_complete"]
    assert frames[0]["data"] == {
        "reason": "epoch_reset",
        "detail": "epoch_mismatch",
        "lastDeliveredId": 5,
        "earliestAvailableId": mark + 1,
    }
    without_epoch = await streams.resume(cluster.a, session, 5, None)
    assert without_epoch.response_headers["x-event-epoch"] == new_epoch
    frames = _frames(await without_epoch.read_until(_saw("replay_complete")))
    assert [f["type"] for f in frames] == ["state_resync_required", "replay_complete"]
    assert frames[0]["data"] == {
        "reason": "ring_evicted",
        "lastDeliveredId": 5,
        "earliestAvailableId": mark + 1,
    }
    # The mirrors that served the old epoch were dropped: their streams ended.
    for client in (old_a, old_b):
        ended = await client.read_to_end()
        assert ended[-1].type == "stream_error"
        assert event_ids(ended) == [1, 2, 3, 4, 5]
        client.close()

    assert _publish_ok(cluster.a, session) == (mark + 1, new_epoch)
    assert _publish_ok(cluster.b, session) == (mark + 2, new_epoch)
    for client in (with_epoch, without_epoch):
        got = await client.read_until(_saw_id(mark + 2), timeout_s=RECOVERY_S)
        assert event_ids(got) == [mark + 1, mark + 2]
        client.close()
    assert _reserved_mark(cluster.database, session.id) > mark + 2
    assert session.load()["epoch"] == new_epoch
    assert _outage_lines(cluster.a) == _outage_lines(cluster.b) == (0, 0)


async def test_publish_right_after_flushdb_starts_a_new_epoch_above_the_mark(
    aof_cluster: Cluster, streams: Streams
) -> None:
    """FLUSHDB, then a publish on a process whose mirror is stale (EB-2, EB-7).

    The publish script finds no epoch: the process drops its mirror (its streams end),
    starts the new epoch above the reserved mark and answers 200 with its first id. The
    other process's reader sees that id after a gap and drops its own mirror; cursors of
    the old epoch resync and get the new event. No error is logged on the way.
    """
    cluster = aof_cluster
    session = RemoteSession.create(cluster.a.base_url)
    old_a, old_b = await streams.live(cluster.a, session), await streams.live(cluster.b, session)
    assert [_publish_ok(cluster.b, session)[0] for _ in range(3)] == [1, 2, 3]
    old_epoch = old_a.response_headers["x-event-epoch"]
    for client in (old_a, old_b):
        await client.read_until(_saw_id(3))
    mark = _reserved_mark(cluster.database, session.id)
    with cluster.redis.client() as client:
        assert client.flushdb() is True

    first, new_epoch = _publish_ok(cluster.a, session)
    assert (first, new_epoch != old_epoch) == (mark + 1, True)
    for client in (old_a, old_b):
        ended = await client.read_to_end(timeout_s=RECOVERY_S)
        assert ended[-1].type == "stream_error"
        assert event_ids(ended) == [1, 2, 3]
    for server in cluster.servers:
        resumed = await streams.resume(server, session, 3, old_epoch)
        frames = _frames(await resumed.read_until(_saw("replay_complete")))
        assert [f["type"] for f in frames] == ["state_resync_required", "note", "replay_complete"]
        assert frames[0]["data"]["reason"] == "epoch_reset"
        assert frames[1]["id"] == mark + 1
    assert _publish_ok(cluster.b, session) == (mark + 2, new_epoch)
    for server in cluster.servers:
        assert " ERROR " not in server.log(), server.log()[-3000:]


@pytest.mark.timeout(90)
async def test_redis_outage_with_aof_answers_503_then_resumes_without_loss(
    aof_cluster: Cluster, streams: Streams
) -> None:
    """Redis stopped mid-run, then started again on the same port and data.

    While it is down: publish answers 503 ``backend_unavailable`` with ``Retry-After``,
    each open stream gets one ``stream_error`` (code ``backend_unavailable``, EB-19) and
    ends, a new stream answers 503. Once it is back, with no server restart: publish
    answers 200 with the next id of the same epoch, and cursors resume with exactly the
    events after them (EB-7), then live, on both processes. Once both readers have
    recovered, no request fails any more, however many run at once.
    """
    cluster = aof_cluster
    session = RemoteSession.create(cluster.a.base_url)
    on_a, on_b = await streams.live(cluster.a, session), await streams.live(cluster.b, session)
    epoch = on_a.response_headers["x-event-epoch"]
    assert sorted(await _publish_concurrently(cluster, session, 10)) == list(range(1, 11))
    for client in (on_a, on_b):
        assert event_ids(await client.read_until(_saw_id(10))) == list(range(1, 11))

    cluster.redis.stop()

    status, body, headers = _publish(cluster.a, session)
    assert status == 503, body
    assert body["code"] == "backend_unavailable"
    assert "Redis" in body["error"]
    assert headers["retry-after"].isdigit()
    for client in (on_a, on_b):
        await client.read_to_end(timeout_s=RECOVERY_S)
        _assert_ended_by_backend_error(client, list(range(1, 11)))
        client.close()
    await _assert_new_stream_refused(streams, cluster.b, session)

    cluster.redis.start()

    assert _publish_once_back(cluster.b, session) == (11, epoch)
    _wait_until_recovered(cluster)
    on_a = await streams.resume(cluster.a, session, 10, epoch)
    on_b = await streams.resume(cluster.b, session, 4, epoch)
    replay_a = _frames(await on_a.read_until(_saw("replay_complete")))
    replay_b = _frames(await on_b.read_until(_saw("replay_complete")))
    assert [f.get("id") for f in replay_a] == [11, None]
    assert [f.get("id") for f in replay_b] == [*range(5, 12), None]
    assert replay_b[-1]["data"] == {"replayedCount": 7, "lastReplayedEventId": 11}
    assert sorted(await _publish_concurrently(cluster, session, 10)) == list(range(12, 22))
    for client in (on_a, on_b):
        got = await client.read_until(_saw_id(21), timeout_s=RECOVERY_S)
        assert event_ids(got)[-11:] == list(range(11, 22))
        client.close()
    _assert_one_outage_logged(cluster)


@pytest.mark.timeout(90)
async def test_redis_restart_without_persistence_resyncs_and_publish_goes_on(
    volatile_cluster: Cluster, streams: Streams
) -> None:
    """Redis restarted empty (no AOF): an outage that loses the data (EB-7).

    Open streams end with ``stream_error``; once Redis is back, publish answers 200 with a
    new epoch whose ids start above the reserved mark, and old cursors resync with
    ``epoch_reset`` before they get the new epoch's events, on both processes.
    """
    cluster = volatile_cluster
    session = RemoteSession.create(cluster.a.base_url)
    on_a, on_b = await streams.live(cluster.a, session), await streams.live(cluster.b, session)
    old_epoch = on_a.response_headers["x-event-epoch"]
    assert sorted(await _publish_concurrently(cluster, session, 6)) == list(range(1, 7))
    for client in (on_a, on_b):
        await client.read_until(_saw_id(6))
    mark = _reserved_mark(cluster.database, session.id)

    cluster.redis.stop()
    for client in (on_a, on_b):
        await client.read_to_end(timeout_s=RECOVERY_S)
        _assert_ended_by_backend_error(client, list(range(1, 7)))
        client.close()
    cluster.redis.start()

    first, new_epoch = _publish_once_back(cluster.a, session)
    assert (first, new_epoch != old_epoch) == (mark + 1, True)
    _wait_until_recovered(cluster)
    resumed = [await streams.resume(server, session, 6, old_epoch) for server in cluster.servers]
    for client in resumed:
        assert client.response_headers["x-event-epoch"] == new_epoch
        frames = _frames(await client.read_until(_saw("replay_complete")))
        assert [f["type"] for f in frames] == ["state_resync_required", "note", "replay_complete"]
        assert frames[0]["data"] == {
            "reason": "epoch_reset",
            "detail": "epoch_mismatch",
            "lastDeliveredId": 6,
            "earliestAvailableId": mark + 1,
        }
        assert frames[1]["id"] == mark + 1
    new_ids = sorted(await _publish_concurrently(cluster, session, 10))
    assert new_ids == list(range(mark + 2, mark + 12))
    for client in resumed:
        got = await client.read_until(_saw_id(mark + 11), timeout_s=RECOVERY_S)
        assert event_ids(got) == list(range(mark + 1, mark + 12))
        client.close()
    _assert_one_outage_logged(cluster)


async def test_full_redis_answers_503_and_publishing_resumes_when_memory_frees(
    volatile_cluster: Cluster,
) -> None:
    """A full Redis (maxmemory reached, policy noeviction) refuses writes: publish answers
    503 ``backend_unavailable`` (a clear error, not a 500) and nothing is issued; once it
    has room again, ids continue without a gap."""
    session = RemoteSession.create(volatile_cluster.a.base_url)
    first_id, epoch = _publish_ok(volatile_cluster.a, session)
    client = volatile_cluster.redis.client()
    try:
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")
        status, body, headers = _publish(volatile_cluster.b, session)
        assert (status, body["code"]) == (503, "backend_unavailable"), body
        assert "retry-after" in headers
        client.config_set("maxmemory", "0")
    finally:
        client.config_set("maxmemory", "0")
        client.close()
    assert _publish_ok(volatile_cluster.b, session) == (first_id + 1, epoch)


async def test_redis_restored_from_an_older_snapshot_never_reissues_ids(
    volatile_cluster: Cluster, streams: Streams
) -> None:
    """Redis restarts from an RDB snapshot older than what it gave out (ids 4..6 were
    issued after the snapshot): the same epoch would hand out 4, 5, 6 again and a client
    at cursor 6 would silently miss them. Instead a new epoch starts above the reserved
    mark and the cursor resyncs (EB-7)."""
    cluster = volatile_cluster
    session = RemoteSession.create(cluster.a.base_url)
    reader = await streams.live(cluster.b, session)
    for _ in range(3):
        _publish_ok(cluster.a, session)
    client = cluster.redis.client()
    try:
        client.save()  # the snapshot holds ids 1..3
    finally:
        client.close()
    ids = [_publish_ok(cluster.a, session)[0] for _ in range(3)]
    assert ids == [4, 5, 6]
    await reader.read_until(_saw_id(6), timeout_s=RECOVERY_S)
    epoch = reader.response_headers["x-event-epoch"]
    assert cluster.redis.process is not None
    cluster.redis.process.kill()  # no shutdown save: the restart loads the older snapshot
    cluster.redis.process.wait(timeout=10)
    cluster.redis.start()
    new_id, new_epoch = _publish_once_back(cluster.a, session)
    assert new_epoch != epoch
    assert new_id > 100_000  # above the mark reserved before the restore (one block)
    resumed = await streams.resume(cluster.b, session, 6, epoch)
    await resumed.read_until(_saw("replay_complete"), timeout_s=RECOVERY_S)
    resync = _frames(resumed.events)[0]
    assert resync["type"] == "state_resync_required"
    assert resync["data"]["reason"] == "epoch_reset"
    assert [i for i in event_ids(resumed.events) if i <= 6] == []


async def test_busy_redis_answers_503_and_the_reader_survives(
    volatile_cluster: Cluster, streams: Streams
) -> None:
    """A script running too long makes Redis answer ``BUSY`` to everything: publish answers
    503 (not a 500), and the reader task of each process survives it, so once the script is
    killed a live stream gets the next event."""
    cluster = volatile_cluster
    session = RemoteSession.create(cluster.a.base_url)
    _publish_ok(cluster.a, session)
    admin = cluster.redis.client()
    admin.config_set("busy-reply-threshold", "100")  # BUSY after 100 ms of a script
    blocker = cluster.redis.client()

    def run_forever() -> None:
        with contextlib.suppress(redis.RedisError):
            blocker.eval("while true do end", 0)

    thread = threading.Thread(target=run_forever, daemon=True)
    thread.start()
    try:
        assert wait_for(partial(_answers_busy, cluster.redis), 10, 0.05)
        status, body, headers = _publish(cluster.b, session)
        assert (status, body["code"]) == (503, "backend_unavailable"), body
        assert "retry-after" in headers
        # Keep it busy until each reader's blocked XREAD has timed out and met BUSY.
        assert wait_for(
            lambda: all(_outage_lines(s)[0] >= 1 for s in cluster.servers), RECOVERY_S, 0.1
        ), cluster.a.log()[-2000:]
    finally:
        killer = cluster.redis.client()
        deadline = time.monotonic() + 10
        # (The blocker's own client may time out while the script still runs: kill the
        # script until Redis answers again, not until that thread ends.)
        while _answers_busy(cluster.redis) and time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                killer.script_kill()
            time.sleep(0.1)
        thread.join(10)
        killer.close()
        blocker.close()
        admin.close()
    assert not thread.is_alive()
    new_id, _ = _publish_once_back(cluster.b, session)
    reader = await _live_once_back(streams, cluster.a, session)
    new_id, _ = _publish_once_back(cluster.b, session)
    await reader.read_until(_saw_id(new_id), timeout_s=RECOVERY_S)
    assert event_ids(reader.events) == [new_id]


async def _live_once_back(
    streams: Streams, server: ServerProcess, session: RemoteSession
) -> RawSSEClient:
    """Open a live stream, retrying 503s (bounded) while the server's reader reconnects."""
    deadline = time.monotonic() + RECOVERY_S
    while True:
        client = RawSSEClient(
            server.port,
            session.events_path,
            [("Accept", "text/event-stream"), ("Authorization", f"Bearer {session.read_token}")],
        )
        streams.opened.append(client)
        await client.connect(timeout_s=RECOVERY_S)
        if client.status == 200:
            return client
        assert client.status == 503, bytes(client.body)
        assert time.monotonic() < deadline, "new streams still answer 503 after Redis returned"
        await asyncio.sleep(0.2)


def _answers_busy(private: PrivateRedis) -> bool:
    client = private.client()
    try:
        client.ping()
        return False
    except redis.exceptions.BusyLoadingError:
        return True
    except redis.RedisError as exc:
        return str(exc).startswith("BUSY")
    finally:
        client.close()
