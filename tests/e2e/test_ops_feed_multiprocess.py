"""The operator feed across server processes: the Redis backend's own relay.

Deployment 1 is two ``python -m qwenweb.serve`` processes, A and B, on one SQLite file and
the Redis at 127.0.0.1:6379 (``QWENWEB_TEST_REDIS_URL`` picks another, as in
``test_redis_scaleout.py``) under one key prefix, with ``QWENWEB_BACKEND=redis`` and no
django-eventstream setting. An activity item noted in one process goes to that process's
``/ops/events/`` clients and, over the backend's control channel ``<prefix>:control``, to
the other's: ``session_opened`` is noted by A (which created the session),
``session_closed`` by B (which closed it). Deployment 2 is one process, C, on the same
Redis with another key prefix (and its own database): it must see none of deployment 1's
activity — django-eventstream's relay (``EVENTSTREAM_REDIS``) published every
deployment's on one shared channel, ``events_channel``. The prefixes are this test's own
and their keys are deleted afterwards (never FLUSHDB).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from sessions.wire import ServerSentEvent
from tests.support.server import (
    REPO,
    TEST_REDIS_URL,
    RawSSEClient,
    RemoteSession,
    ServerProcess,
    redis_cluster,
    request_json,
    server_env,
    wait_for,
)
from tests.support.staff import StaffClient, staffed_database

pytestmark = [pytest.mark.e2e]

WAIT_S = 15.0


@dataclass
class Deployments:
    """A and B (deployment 1, prefix ``prefix``) and C (deployment 2, ``other_prefix``)."""

    a: ServerProcess
    b: ServerProcess
    c: ServerProcess
    prefix: str
    other_prefix: str


@pytest.fixture
def deployments(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> Iterator[Deployments]:
    """Start A and B on one prefix and database, C on others; stop them and delete the keys."""
    databases = [staffed_database(tmp_path_factory.mktemp(f"ops-feed-{n}")) for n in (1, 2)]
    with (
        redis_cluster(databases[0], tmp_path) as first,
        redis_cluster(databases[1], tmp_path) as second,
    ):
        yield Deployments(first("a"), first("b"), second("c"), first.prefix, second.prefix)


def _redis() -> redis.Redis:
    return redis.Redis.from_url(TEST_REDIS_URL, socket_connect_timeout=1, socket_timeout=5)


def control_listeners(prefix: str) -> int:
    """How many processes listen on the deployment's control channel (``PUBSUB NUMSUB``)."""
    client = _redis()
    try:
        return int(client.pubsub_numsub(f"{prefix}:control")[0][1])
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


def activity(events: Sequence[ServerSentEvent]) -> list[tuple[str, str]]:
    """``(kind, session)`` of every activity item among ``events``, in order."""
    return [
        (item["kind"], item["session"])
        for e in events
        if e.type == "activity"
        for item in json.loads(e.data)["items"]
    ]


async def read_until_seen(feed: RawSSEClient, wanted: set[tuple[str, str]]) -> None:
    """Read ``feed`` until it has every item of ``wanted``; bounded by :data:`WAIT_S`."""
    with contextlib.suppress(TimeoutError):  # the caller's assertion says what is missing
        await feed.read_until(lambda events: wanted <= set(activity(events)), WAIT_S)


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_activity_reaches_every_process_of_the_deployment_and_no_other(
    deployments: Deployments,
) -> None:
    a, b, c = deployments.a, deployments.b, deployments.c
    feeds = {"A": await open_operator_feed(a), "B": await open_operator_feed(b)}
    feeds["C"] = await open_operator_feed(c)
    try:
        # A process starts listening on its control channel once its feed has ticked.
        assert wait_for(lambda: control_listeners(deployments.prefix) == 2, WAIT_S)
        assert wait_for(lambda: control_listeners(deployments.other_prefix) == 1, WAIT_S)
        session = RemoteSession.create(a.base_url, title="opened on A")
        status, body = request_json(
            "POST", f"{b.base_url}/session/{session.id}/close", token=session.publish_token
        )
        assert (status, body["alreadyClosed"]) == (200, False)
        expected = [("session_closed", session.id), ("session_opened", session.id)]
        for name in ("A", "B"):
            await read_until_seen(feeds[name], set(expected))
            # Each exactly once (no echo, no second relay); in the order they reached this
            # process, which across processes need not be the order they happened in.
            got = sorted(item for item in activity(feeds[name].events) if item[1] == session.id)
            assert got == expected, f"the feed on {name}: {got}"
        # C's feed is live and has taken what was published in the meantime.
        own = RemoteSession.create(c.base_url, title="deployment 2")
        await read_until_seen(feeds["C"], {("session_opened", own.id)})
        assert ("session_opened", own.id) in activity(feeds["C"].events)
        assert [item for item in activity(feeds["C"].events) if item[1] == session.id] == []
    finally:
        for feed in feeds.values():
            feed.close()
    for server in (a, b, c):
        assert "operator_feed_send_failed" not in server.log()
        assert "Traceback" not in server.log()


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
    "env",
    [
        {"QWENWEB_BACKEND": "redis", "QWENWEB_REDIS_URL": "redis://127.0.0.1:6379/0"},
        {"QWENWEB_EVENTSTREAM_REDIS_URL": "redis://127.0.0.1:6379/0"},  # the retired opt-in
    ],
    ids=["redis-backend", "retired-opt-in"],
)
def test_django_eventstream_relay_is_never_configured(env: dict[str, str]) -> None:
    # With it, every activity item would arrive twice (ours and its relay).
    assert eventstream_redis(**env) is None
