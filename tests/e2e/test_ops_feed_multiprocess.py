"""The operator feed across server processes (issue 6): django-eventstream through Redis.

Two ``python -m qwenweb.serve`` processes share one SQLite file and the Redis at
127.0.0.1:6379 (``QWENWEB_TEST_REDIS_URL`` picks another, as in
``test_redis_scaleout.py``). ``QWENWEB_EVENTSTREAM_REDIS_URL`` sets ``EVENTSTREAM_REDIS``
(``qwenweb/settings.py``): django-eventstream's ``send_event`` then publishes on Redis
pub/sub instead of queueing locally, and every process hands what it receives to its own
``/ops/events/`` listeners. So an operator event sent in one process — ``session_opened``,
sent by the dashboard feed of the process that created the session — reaches the staff
dashboards connected to either process. Checked with the Redis backend (a key prefix of
its own, whose keys are deleted afterwards; never FLUSHDB) and with the memory backend.

django-eventstream 5.3.4 relays on one fixed pub/sub channel, ``events_channel``, whatever
the database number or key prefix: the feeds here may receive other deployments' operator
events from the same Redis (so the assertions look for this test's session ids only), and
they ours, while the servers run.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from sessions.sse import ServerSentEvent
from tests.support.server import (
    REPO,
    RawSSEClient,
    RemoteSession,
    ServerProcess,
    free_port,
    migrate,
    serve_argv,
    server_env,
)
from tests.support.staff import StaffClient, create_staff_user

pytestmark = [pytest.mark.e2e]

REDIS_URL = os.environ.get("QWENWEB_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
WAIT_S = 15.0
PROBE_WAIT_S = 0.5
"""How long one probe may take to come back (the feed batches activity every 0.1 s)."""


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ops-feed") / "db.sqlite3"
    migrate(path)
    create_staff_user(path)
    return path


@pytest.fixture(params=["redis-backend", "memory-backend"])
def two_servers(
    request: pytest.FixtureRequest, database: Path, tmp_path: Path
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Two ``serve`` processes with the relay on, over either backend; stopped at the end."""
    prefix = f"qwtest-ops-{secrets.token_hex(4)}"
    env = {"QWENWEB_EVENTSTREAM_REDIS_URL": REDIS_URL, "QWENWEB_BACKEND": "memory"}
    if request.param == "redis-backend":
        env.update(
            QWENWEB_BACKEND="redis", QWENWEB_REDIS_URL=REDIS_URL, QWENWEB_REDIS_KEY_PREFIX=prefix
        )
    servers: list[ServerProcess] = []
    try:
        for name in ("a", "b"):
            port = free_port()
            log = tmp_path / f"server-{name}.log"
            servers.append(ServerProcess(serve_argv(port), port, server_env(database, **env), log))
            servers[-1].start()
        yield servers[0], servers[1]
    finally:
        for server in servers:
            server.stop()
        _delete_keys(prefix)


def _delete_keys(prefix: str) -> None:
    """Delete this test's keys (the backend's, under its own prefix); nothing else."""
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1, socket_timeout=5)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


async def open_operator_feed(server: ServerProcess) -> RawSSEClient:
    """``GET /ops/events/`` on ``server`` as the staff user, over a raw socket."""
    staff = StaffClient(server.base_url).login()
    cookie = "; ".join(f"{c.name}={c.value}" for c in staff.jar)
    headers = [("Accept", "text/event-stream"), ("Cookie", cookie)]
    feed = await RawSSEClient(server.port, "/ops/events/", headers).connect()
    assert feed.status == 200, feed.body[:300]
    return feed


def opened_sessions(events: Sequence[ServerSentEvent]) -> set[str]:
    """Ids of the ``session_opened`` activity items among ``events``."""
    items: list[dict[str, Any]] = [
        item for e in events if e.type == "activity" for item in json.loads(e.data)["items"]
    ]
    return {item["session"] for item in items if item["kind"] == "session_opened"}


async def wait_until_relayed(origin: ServerProcess, feeds: Sequence[RawSSEClient]) -> None:
    """Open probe sessions on ``origin`` until one's ``session_opened`` reached every feed.

    A process's Redis listener subscribes a moment after its first feed opened, and
    pub/sub keeps nothing for late subscribers: until then relayed events are lost, so a
    probe is sent again until one arrives. Bounded by :data:`WAIT_S`.
    """
    probes: set[str] = set()

    def arrived(events: Sequence[ServerSentEvent]) -> bool:
        return bool(probes & opened_sessions(events))

    deadline = time.monotonic() + WAIT_S
    while not all(arrived(feed.events) for feed in feeds):
        assert time.monotonic() < deadline, f"no probe reached every feed in {WAIT_S} s"
        probes.add(RemoteSession.create(origin.base_url, title="probe").id)
        for feed in feeds:
            with contextlib.suppress(TimeoutError):  # not there yet: send another probe
                await feed.read_until(arrived, PROBE_WAIT_S)


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_operator_event_sent_in_one_process_reaches_the_feeds_of_both(
    two_servers: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = two_servers
    feed_a, feed_b = await open_operator_feed(a), await open_operator_feed(b)
    try:
        await wait_until_relayed(a, [feed_a, feed_b])
        on_a = RemoteSession.create(a.base_url, title="opened on A")
        on_b = RemoteSession.create(b.base_url, title="opened on B")
        expected = {on_a.id, on_b.id}
        for feed, name in ((feed_a, "A"), (feed_b, "B")):
            with contextlib.suppress(TimeoutError):  # bounded; the assertion says what is missing
                await feed.read_until(lambda events: expected <= opened_sessions(events), WAIT_S)
            missing = expected - opened_sessions(feed.events)
            assert not missing, f"the feed on {name} never got session_opened for {missing}"
    finally:
        feed_a.close()
        feed_b.close()
    for server in (a, b):
        assert "operator_feed_send_failed" not in server.log()


def eventstream_redis(**env: str) -> Any:
    """``settings.EVENTSTREAM_REDIS`` in a fresh process with ``env`` (None when unset)."""
    code = (
        "import django, json; django.setup(); from django.conf import settings; "
        "print(json.dumps(getattr(settings, 'EVENTSTREAM_REDIS', None)))"
    )
    clean = server_env(Path("unused.sqlite3"))
    for name in ("QWENWEB_BACKEND", "QWENWEB_REDIS_URL", "QWENWEB_EVENTSTREAM_REDIS_URL"):
        clean.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**clean, **env},
        capture_output=True,
        check=True,
        timeout=60,
    )
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"QWENWEB_BACKEND": "redis", "QWENWEB_REDIS_URL": "redis://127.0.0.1:6379/0"}, None),
        (
            {"QWENWEB_EVENTSTREAM_REDIS_URL": "redis://:s%40cret@redis.internal:6380/2"},
            {"host": "redis.internal", "port": 6380, "db": 2, "password": "s@cret"},
        ),
        (
            {"QWENWEB_EVENTSTREAM_REDIS_URL": "rediss://ops@redis.internal/1"},
            {"host": "redis.internal", "db": 1, "username": "ops", "ssl": True},
        ),
        (
            {"QWENWEB_EVENTSTREAM_REDIS_URL": "unix:///run/redis/redis.sock?db=3"},
            {"unix_socket_path": "/run/redis/redis.sock", "db": 3},
        ),
    ],
    ids=["unset", "backend-alone", "redis", "rediss", "unix"],
)
def test_eventstream_redis_is_set_only_from_its_url(
    env: dict[str, str], expected: dict[str, Any] | None
) -> None:
    got = eventstream_redis(**env)
    if expected is None:
        assert got is None
    else:
        assert {k: got.get(k) for k in expected} == expected
        # A publish on the server's loop fails fast while Redis is down (no retries).
        assert (got["retry"], got["socket_connect_timeout"], got["socket_timeout"]) == (
            None,
            1.0,
            1.0,
        )
