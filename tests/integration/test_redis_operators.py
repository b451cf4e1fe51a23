"""Operator figures with the Redis backend, in process, against the Redis at 127.0.0.1:6379.

Each test selects the backend through the environment with a key prefix of its own and
deletes that prefix's keys at the end (never FLUSHDB). "Other processes" are reports
written under the prefix as a live process writes them; a dead one is a report whose TTL
ran out. The admin is read through Django's test client, whose views run with no server
loop in this process: the numbers then come from the short-lived synchronous client.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import orjson
import pytest
import pytest_asyncio
import redis
from django.urls import reverse
from django_eventstream import eventstream
from django_eventstream.views import Listener, get_listener_manager

from sessions.backends import get_backend
from sessions.backends.base import OPERATOR_STATS_TIMEOUT_S
from sessions.backends.errors import BackendUnavailableError
from sessions.backends.redis_store import RedisStore
from sessions.backends.reports import merge_reports
from sessions.conf import get_config
from sessions.models import AgentSession
from sessions.ops import feed as operator_feed
from tests.support import backend

pytestmark = pytest.mark.django_db(transaction=True)

REDIS_URL = "redis://127.0.0.1:6379/0"
CHANGELIST = reverse("admin:agent_sessions_agentsession_changelist")


@pytest.fixture
def prefix(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Select the Redis backend with a key prefix of this test's; delete its keys after."""
    key_prefix = f"qwtest-ops-{secrets.token_hex(4)}"
    monkeypatch.setenv("QWENWEB_BACKEND", "redis")
    monkeypatch.setenv("QWENWEB_REDIS_URL", REDIS_URL)
    monkeypatch.setenv("QWENWEB_REDIS_KEY_PREFIX", key_prefix)
    get_config.cache_clear()
    yield key_prefix
    get_config.cache_clear()
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{key_prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def stuck_redis_url(monkeypatch: pytest.MonkeyPatch, prefix: str) -> Iterator[str]:
    """Point the backend at a port that accepts connections (the kernel's backlog) and
    never answers: a stuck Redis."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(16)
        url = f"redis://127.0.0.1:{listening.getsockname()[1]}/0"
        monkeypatch.setenv("QWENWEB_REDIS_URL", url)
        get_config.cache_clear()
        yield url


def figures(subscribers: int, **overrides: Any) -> dict[str, Any]:
    """One session's figures as a process reports them (``get_backend()._make_report``)."""
    return {
        "published": 5, "slow_client_warnings": 0, "evictions": {}, "resyncs": {},
        "replayed_frames": 0, "subscriber_count": subscribers,
        "peak_subscribers": subscribers, "ring_length": 5, "ring_size": 100,
        "earliest_id": 1, "last_event_id": 5, "epoch": "e1", "closed": False, **overrides,
    }  # fmt: skip


def write_report(prefix: str, process: str, sessions: dict[str, Any], ttl_s: float = 30) -> None:
    """Write a process's report the way a live process does (``RedisStore.report``)."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        body = {"at": time.time(), "sessions": sessions, "process": process}
        client.set(f"{prefix}:proc:{process}", orjson.dumps(body), px=int(ttl_s * 1000))
        client.zadd(f"{prefix}:procs", {process: time.time()})
    finally:
        client.close()


def cell(html: str, session_id: str, field: str) -> str:
    """The text of column ``field`` in the changelist row of ``session_id``."""
    row = next(r for r in html.split("<tr") if f'value="{session_id}"' in r)
    match = re.search(rf'<td class="field-{field}[^"]*">(.*?)</td>', row, re.S)
    assert match, f"no column {field} in {row}"
    return re.sub(r"<[^>]+>", "", match.group(1)).strip()


# -- reports ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_process_that_stops_reporting_drops_out_after_its_ttl(prefix: str) -> None:
    alive = RedisStore(REDIS_URL, prefix, process_ttl_s=30)
    dying = RedisStore(REDIS_URL, prefix, process_ttl_s=0.2)
    try:
        await alive.report({"sessions": {"s1": figures(2)}})
        await dying.report({"sessions": {"s1": figures(3)}})
        assert merge_reports(await alive.reports())["s1"].subscriber_count == 5
        async with asyncio.timeout(5):  # the dying one never reports again: its key expires
            while len(reports := await alive.reports()) != 1:
                await asyncio.sleep(0.05)
        assert [r["process"] for r in reports] == [alive.process_uid]
        assert merge_reports(reports)["s1"].subscriber_count == 2
    finally:
        await alive.aclose()
        await dying.aclose()


@pytest.mark.asyncio
async def test_a_control_message_counts_only_the_other_processes_that_heard_it(prefix):
    # A store just started (an admin action in a process that had loaded nothing) must
    # not count its own listener, whether or not Redis has subscribed it yet.
    heard = asyncio.Event()
    first = RedisStore(REDIS_URL, prefix)
    first.start(*_ignore_all(), lambda message: heard.set(), dict)
    fresh, later = RedisStore(REDIS_URL, prefix), RedisStore(REDIS_URL, prefix)
    try:
        assert await first.send_control({"op": "noop"}) == 0  # alone, and now subscribed
        fresh.start(*_ignore_all(), lambda message: None, dict)
        assert await fresh.send_control({"op": "disconnect", "session": "s1"}) == 1
        async with asyncio.timeout(5):
            await heard.wait()
        later.start(*_ignore_all(), lambda message: None, dict)
        for _ in range(5):  # its SUBSCRIBE sent, perhaps not yet confirmed
            await asyncio.sleep(0)
        assert await later.send_control({"op": "noop"}) == 2
    finally:
        for store in (later, fresh, first):
            await store.aclose()


def _ignore_all() -> tuple[Any, Any, Any]:
    """The entry, outage and recovery handlers of a store that watches no session."""
    return (lambda *args: None, lambda error: None, lambda: None)


# -- the admin in a process that has loaded nothing ------------------------------------------


def test_admin_without_a_server_loop_shows_the_sums_of_the_live_reports(prefix, staff):
    sid = AgentSession.objects.create(title="shared").id
    write_report(prefix, "p1", {sid: figures(2, slow_client_warnings=1)})
    write_report(prefix, "p2", {sid: figures(3, evictions={"queue_overflow": 1})})
    html = staff.get(CHANGELIST).content.decode()
    values = [cell(html, sid, f) for f in ("source", "subscribers", "warnings", "evicted")]
    assert values == ["live", "5", "1", "1"]
    redis.Redis.from_url(REDIS_URL).delete(f"{prefix}:proc:p2")  # p2 died: its TTL ran out
    assert cell(staff.get(CHANGELIST).content.decode(), sid, "subscribers") == "2"
    detail = staff.get(reverse("admin:agent_sessions_agentsession_change", args=[sid]))
    assert b"<th>subscribers</th><td>2</td>" in detail.content
    assert get_backend().loop.get() is None  # reading started nothing in this process


def test_admin_pages_say_redis_is_stuck_instead_of_failing(stuck_redis_url, staff):
    sid = AgentSession.objects.create(last_event_id=7).id
    started = time.monotonic()
    response = staff.get(CHANGELIST)
    assert response.status_code == 200
    html = response.content.decode()
    assert '<li class="error">Redis is unavailable' in html
    assert (cell(html, sid, "source"), cell(html, sid, "last_event")) == ("saved", "7")
    detail = staff.get(reverse("admin:agent_sessions_agentsession_change", args=[sid]))
    assert detail.status_code == 200
    assert b"Redis is unavailable" in detail.content
    assert time.monotonic() - started < 2 * (OPERATOR_STATS_TIMEOUT_S + 1)


def test_actions_without_a_server_loop_refuse_rather_than_close_only_the_row(prefix, staff):
    # Outside an ASGI request there is no loop to adopt: marking the row closed alone
    # would leave the other processes' streams running.
    sid = AgentSession.objects.create().id
    for action in ("close_sessions", "disconnect_all_subscribers"):
        response = staff.post(
            CHANGELIST, {"action": action, "_selected_action": [sid]}, follow=True
        )
        assert response.status_code == 200
        assert b"no server event loop in this process" in response.content
    assert AgentSession.objects.get(pk=sid).status == "open"


# -- the dashboard's feed ----------------------------------------------------------------------


@pytest_asyncio.fixture
async def closes_backend() -> AsyncIterator[None]:
    """Close the Redis store this test's loop started (on that loop)."""
    yield
    await get_backend().aclose()


@pytest.mark.asyncio
async def test_feed_rows_sum_this_process_and_the_others_reports(prefix, closes_backend):
    here = await AgentSession.objects.acreate(title="loaded here and there")
    elsewhere = await AgentSession.objects.acreate(title="loaded elsewhere only")
    live = await get_backend().get_live_session(here.id)
    live.bus.subscribe()
    await asyncio.to_thread(
        write_report, prefix, "other", {here.id: figures(2), elsewhere.id: figures(4)}
    )
    await operator_feed.feed.fetch_others()
    rows = {row["id"]: row for row in operator_feed.feed.sample()}
    assert (rows[here.id]["subscribers"], rows[here.id]["title"]) == (3, "loaded here and there")
    assert (rows[elsewhere.id]["subscribers"], rows[elsewhere.id]["title"]) == (
        4,
        "loaded elsewhere only",
    )


@contextlib.contextmanager
def local_dashboard() -> Iterator[Listener]:
    """A listener of the operator channel in this process, as an open dashboard has."""
    listener = Listener()
    listener.channels = {operator_feed.OPERATOR_CHANNEL}
    listener.assign_loop()
    get_listener_manager().add_listener(listener)
    try:
        yield listener
    finally:
        get_listener_manager().remove_listener(listener)


def shown(listener: Listener) -> list[dict[str, Any]]:
    """The activity items ``listener`` received, in order."""
    events = listener.channel_items.get(operator_feed.OPERATOR_CHANNEL, [])
    return [item for e in events if e.type == "activity" for item in orjson.loads(e.data)["items"]]


async def until(listener: Listener, predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Wait (bounded) until ``predicate()`` holds, checking each time ``listener`` is woken."""
    async with asyncio.timeout(timeout_s):
        while not predicate():
            listener.aevent.clear()
            await listener.aevent.wait()


async def next_activity(heard: asyncio.Queue[Any], timeout_s: float = 5.0) -> Any:
    """The next ``activity`` control message a peer process heard (bounded)."""
    async with asyncio.timeout(timeout_s):
        while (message := await heard.get()).get("op") != "activity":
            pass
    return message


@pytest_asyncio.fixture
async def peer(prefix: str) -> AsyncIterator[tuple[RedisStore, asyncio.Queue[Any]]]:
    """Another process of the deployment: its store, listening, and what it hears."""
    heard: asyncio.Queue[Any] = asyncio.Queue()
    store = RedisStore(REDIS_URL, prefix)
    store.start(*_ignore_all(), heard.put_nowait, dict)
    await store.send_control({"op": "noop"})  # returns once Redis has subscribed it
    yield store, heard
    await store.aclose()


@pytest.mark.asyncio
async def test_activity_noted_here_is_shown_here_and_relayed_to_the_other_processes(
    peer, closes_backend
):
    _, heard = peer
    operator_feed.feed.start(asyncio.get_running_loop())
    with local_dashboard() as listener:
        operator_feed.feed.note("session_opened", "s1", title="here")
        message = await next_activity(heard)
        await until(listener, lambda: bool(shown(listener)))
    item = {
        "kind": "session_opened",
        "session": "s1",
        "t": message["items"][0]["t"],
        "title": "here",
    }
    assert message == {
        "op": "activity",
        "items": [item],
        "from": backend.as_redis().store().process_uid,
    }
    assert shown(listener) == [item]


@pytest.mark.asyncio
async def test_activity_relayed_from_another_process_is_shown_here_and_not_sent_on(
    peer, closes_backend
):
    store, heard = peer
    operator_feed.feed.start(asyncio.get_running_loop())
    await backend.as_redis().store().send_control({"op": "noop"})  # this process listens too
    remote = {"kind": "session_closed", "session": "s2", "t": 1, "lastEventId": 7}
    with local_dashboard() as listener:
        await store.send_control({"op": "activity", "items": [remote]})
        await until(listener, lambda: remote in shown(listener))
        assert remote in operator_feed.feed.snapshot()["activity"]
        # One relay publish at a time, in order: had the remote item been sent on, it would
        # come before (or with) the next item noted here.
        operator_feed.feed.note("session_opened", "s3")
        message = await next_activity(heard)
    assert [(i["kind"], i["session"]) for i in message["items"]] == [("session_opened", "s3")]
    assert [i["session"] for i in shown(listener)] == ["s2", "s3"]


@pytest.fixture
def refused_redis_url(monkeypatch: pytest.MonkeyPatch, prefix: str) -> str:
    """Point the backend at a port nothing listens on: Redis down."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{probe.getsockname()[1]}/0"
    monkeypatch.setenv("QWENWEB_REDIS_URL", url)
    get_config.cache_clear()
    return url


@pytest.mark.asyncio
async def test_activity_is_shown_here_and_the_relay_keeps_trying_while_redis_is_down(
    refused_redis_url, monkeypatch, closes_backend
):
    outcomes: asyncio.Queue[BaseException | None] = asyncio.Queue()
    relay = get_backend().relay_activity

    async def recorded(items: Any) -> None:
        try:
            await relay(items)
        except Exception as exc:
            outcomes.put_nowait(exc)
            raise
        outcomes.put_nowait(None)

    monkeypatch.setattr(get_backend(), "relay_activity", recorded)
    operator_feed.feed.start(asyncio.get_running_loop())
    with local_dashboard() as listener:
        for count in (1, 2):  # a failed relay neither raises nor stops the next one
            operator_feed.feed.note("session_opened", f"s{count}")
            await until(listener, lambda: len(shown(listener)) == count)  # noqa: B023
            async with asyncio.timeout(10):
                assert isinstance(await outcomes.get(), BackendUnavailableError)


@pytest.mark.asyncio
async def test_memory_backend_relays_no_activity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QWENWEB_BACKEND", "memory")
    get_config.cache_clear()
    relayed: list[Any] = []

    async def relay(items: Any) -> None:
        relayed.append(items)

    monkeypatch.setattr(get_backend(), "relay_activity", relay)
    operator_feed.feed.start(asyncio.get_running_loop())
    with local_dashboard() as listener:
        operator_feed.feed.note("session_opened", "s1")
        await until(listener, lambda: bool(shown(listener)))  # the relay would start here
    await asyncio.sleep(0)  # and run its first step here
    assert relayed == []
    assert backend.open_store(get_backend()) is None


@pytest.mark.asyncio
async def test_feed_events_go_to_local_dashboards_only_even_with_eventstream_relay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # django-eventstream's relay (EVENTSTREAM_REDIS, not configured) would send every
    # process's cluster-wide stats to every dashboard N times, and activity twice with ours.
    relayed: list[Any] = []

    class Relay:
        def publish(self, channel: str, message: str) -> None:
            relayed.append(orjson.loads(message)["event_type"])

    monkeypatch.setattr(eventstream, "redis_client", Relay())
    with local_dashboard() as listener:
        operator_feed.feed.tick()
        operator_feed._send("activity", {"t": 1, "items": []})
    events = listener.channel_items[operator_feed.OPERATOR_CHANNEL]
    assert [e.type for e in events] == ["stats", "activity"]
    assert relayed == []


@pytest.mark.asyncio
async def test_an_outage_tells_a_non_owner_nothing_about_which_ids_exist(
    refused_redis_url, closes_backend, make_user
):
    # Existence (docs/protocol.md, "Where this differs"): with Redis down, another user's
    # session must answer the 404 of an unknown one, not the owner's 503.
    from tests.integration.conftest import assert_error, call, login_cookie

    owner, stranger = await make_user("owner"), await make_user("stranger")
    row = await AgentSession.objects.acreate(title="theirs", owner=owner)
    unknown = "00000000-0000-4000-8000-000000000000"
    cookie = await login_cookie(stranger)
    for path in (f"/session/{row.id}", f"/session/{row.id}/events"):
        mine = await call("GET", path, headers={"cookie": await login_cookie(owner)})
        theirs = await call("GET", path, headers={"cookie": cookie})
        missing = await call("GET", path.replace(row.id, unknown), headers={"cookie": cookie})
        assert_error(mine, 503, "backend_unavailable")
        assert (theirs.status, theirs.body) == (missing.status, missing.body)
        assert_error(theirs, 404, "not_found")
