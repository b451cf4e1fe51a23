"""The operator dashboard (``/``), its staff-only channel and the records endpoint.

The channel is read through the real ASGI application with ``ApplicationCommunicator``
(django-eventstream's view behind Django's ``ASGIHandler``). The feed is started on the
test's loop explicitly (the in-process tests do not start it by themselves).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from django.contrib.auth.models import AnonymousUser
from django.test import AsyncClient, RequestFactory

from sessions.auth import issue_token
from sessions.backends import get_backend
from sessions.models import AgentSession
from sessions.ops import feed as operator_feed
from sessions.ops.feed import OPERATOR_CHANNEL, OperatorChannelManager
from tests.integration.conftest import (
    Stream,
    assert_error,
    bearer,
    burst,
    call,
    login_cookie,
    publish_many,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def activity(stream: Stream) -> list[dict[str, Any]]:
    """Every activity item received on the operator channel so far."""
    return [
        item
        for event in stream.events
        if event.type == "activity"
        for item in json.loads(event.data)["items"]
    ]


def has_activity(kind: str, **fields: Any) -> Callable[[Stream], bool]:
    def check(stream: Stream) -> bool:
        return any(
            item["kind"] == kind and all(item.get(k) == v for k, v in fields.items())
            for item in activity(stream)
        )

    return check


@pytest_asyncio.fixture
async def staff_cookie(make_user) -> str:
    user = await make_user("root", is_staff=True)
    return await login_cookie(user)


@pytest_asyncio.fixture
async def feed() -> operator_feed.OperatorFeed:
    """The process-wide feed, started on this test's loop (as the server loop would)."""
    get_backend().loop.attach()
    operator_feed.feed.start(asyncio.get_running_loop())
    return operator_feed.feed


@pytest_asyncio.fixture
async def operator_stream(open_stream, staff_cookie, feed) -> Stream:
    """The operator channel opened by a staff user, read up to ``stream-open``."""
    stream = await open_stream("/ops/events/", {"cookie": staff_cookie})
    assert stream.status == 200
    assert stream.headers["content-type"].startswith("text/event-stream")
    return await stream.read_until(lambda s: "stream-open" in s.types)


# -- who may see what ----------------------------------------------------------------------


async def test_dashboard_is_for_staff_and_lists_every_session(make_session, staff_cookie):
    sid = await make_session(title="watched")
    response = await call("GET", "/", headers={"cookie": staff_cookie})
    assert response.status == 200
    assert f'data-session-id="{sid}"'.encode() in response.body
    assert b'id="dashboard-config"' in response.body
    assert f'href="/sessions/{sid}/"'.encode() in response.body
    assert f'href="/admin/agent_sessions/agentsession/{sid}/change/"'.encode() in response.body


async def test_dashboard_hands_its_script_the_live_subscribers_urls(make_session, staff_cookie):
    sid = await make_session(title="watched")
    response = await call("GET", "/", headers={"cookie": staff_cookie})
    match = re.search(
        rb'<script id="dashboard-config" type="application/json">(.*?)</script>', response.body
    )
    assert match, "no dashboard-config"
    config = json.loads(match.group(1))
    session, subscriber = config["placeholder"], config["subscriberPlaceholder"]
    assert config["urls"]["subscribers"] == f"/session/{session}/subscribers"
    assert config["urls"]["disconnect"] == f"/session/{session}/subscribers/{subscriber}/disconnect"
    assert b'id="session-detail"' in response.body
    assert f'data-session-id="{sid}"'.encode() in response.body


async def test_non_staff_get_no_dashboard(make_session, make_user):
    await make_session(title="secret")
    cookie = await login_cookie(await make_user("alice"))
    for headers in ({"cookie": cookie}, {}):
        response = await call("GET", "/", headers=headers)
        assert (response.status, response.headers["location"]) == (302, "/sessions/")
        assert b"secret" not in response.body


async def test_operator_channel_refuses_anonymous_and_non_staff(open_stream, make_user):
    anonymous = await (await open_stream("/ops/events/")).read_to_end()
    assert_error(anonymous, 403, "forbidden")
    cookie = await login_cookie(await make_user("alice"))
    refused = await (await open_stream("/ops/events/", {"cookie": cookie})).read_to_end()
    body = assert_error(refused, 403, "forbidden")
    assert "staff" in body["error"]


@pytest.mark.parametrize(
    ("flags", "allowed"),
    [
        ({"is_staff": True, "is_active": True}, True),
        ({"is_staff": False, "is_active": True}, False),
        ({"is_staff": True, "is_active": False}, False),
    ],
)
async def test_channel_manager_lets_only_active_staff_read_the_operator_channel(
    make_user, flags, allowed
):
    user = await make_user("someone", is_staff=flags["is_staff"])
    user.is_active = flags["is_active"]
    manager = OperatorChannelManager()
    assert manager.can_read_channel(user, OPERATOR_CHANNEL) is allowed
    assert manager.can_read_channel(user, "anything-else") is False
    assert manager.can_read_channel(None, OPERATOR_CHANNEL) is False
    assert manager.is_channel_reliable(OPERATOR_CHANNEL) is False


async def test_channel_manager_gives_the_operator_channel_whatever_is_asked():
    request = RequestFactory().get("/ops/events/", {"channel": "other"})
    request.user = AnonymousUser()
    assert OperatorChannelManager().get_channels_for_request(request, {}) == {OPERATOR_CHANNEL}


# -- the live feed ------------------------------------------------------------------------


async def test_feed_publishes_subscriber_joined_and_left(make_session, stream_of, operator_stream):
    sid = await make_session()
    stream = await stream_of(sid, headers={"x-client-id": "tab-1"})
    await operator_stream.read_until(has_activity("subscriber_joined", session=sid))
    joined = next(i for i in activity(operator_stream) if i["kind"] == "subscriber_joined")
    assert (joined["clientId"], joined["clientAddr"]) == ("tab-1", "127.0.0.1")
    stats = json.loads(next(e.data for e in operator_stream.events if e.type == "stats"))
    assert [row["subscribers"] for row in stats["sessions"] if row["id"] == sid] == [1]
    await stream.disconnect()
    await operator_stream.read_until(
        has_activity("subscriber_left", session=sid, reason="client_disconnect")
    )


async def test_feed_stats_follow_the_bus(make_session, stream_of, operator_stream):
    sid = await make_session()
    await stream_of(sid)
    await publish_many(sid, 3)
    await operator_stream.read_until(has_activity("subscriber_joined", session=sid))
    rows = operator_feed.feed.tick()
    (row,) = [r for r in rows if r["id"] == sid]
    assert (row["subscribers"], row["published"], row["lastEventId"]) == (1, 3, 3)
    await operator_stream.read_until(
        lambda s: any(e.type == "stats" and json.loads(e.data)["tick"] for e in s.events)
    )


@pytest.mark.usefixtures("strict_caps")
async def test_feed_publishes_warnings_and_evictions_with_their_data(
    make_session, stream_of, operator_stream
):
    sid = await make_session()
    stream = await stream_of(sid, query="maxQueued=16")
    await burst(sid, 40)
    await stream.read_to_end()
    # subscriber_left follows the eviction once the stream has ended: wait for it too (it
    # came after client_evicted's read under the Redis backend).
    await operator_stream.read_until(has_activity("subscriber_left", session=sid))
    kinds = [i["kind"] for i in activity(operator_stream) if i["session"] == sid]
    assert kinds[-3:] == ["slow_client_warning", "client_evicted", "subscriber_left"]
    evicted = next(i for i in activity(operator_stream) if i["kind"] == "client_evicted")
    assert (evicted["reason"], evicted["maxQueued"]) == ("queue_overflow", 16)


async def test_feed_publishes_session_opened_and_closed(operator_stream, make_user):
    token = issue_token("*", ["create"], "ops-test")
    created = await call("POST", "/session", headers=bearer(token), json_body={"title": "new one"})
    sid = created.json()["id"]
    await operator_stream.read_until(has_activity("session_opened", session=sid, title="new one"))
    await get_backend().get_live_session(sid)
    await get_backend().close_session(sid, reason="test")
    await operator_stream.read_until(has_activity("session_closed", session=sid))


async def test_dashboard_page_starts_with_live_rows_and_history(make_session, stream_of, feed):
    sid = await make_session()
    await stream_of(sid)
    feed.tick()
    feed.tick()
    snapshot = feed.snapshot()
    assert [row["subscribers"] for row in snapshot["sessions"] if row["id"] == sid] == [1]
    assert len(snapshot["history"]) == 2
    assert [point[2] for point in snapshot["sessionHistory"][sid]] == [1, 1]
    assert snapshot["activity"][-1]["kind"] == "subscriber_joined"


async def test_feed_rows_and_history_carry_the_worst_subscriber_lag(make_session, feed):
    sid = await make_session()
    backend = get_backend()
    live = await backend.get_live_session(sid)
    _, reader = await backend.subscribe(live, max_queued=64)  # attached, never read
    await publish_many(sid, 5)
    (row,) = [r for r in feed.tick() if r["id"] == sid]
    assert row["maxLag"] == 5
    assert feed.snapshot()["history"][-1][3] == 5
    reader.abort()  # the reader goes: no subscriber, no lag
    (row,) = [r for r in feed.tick() if r["id"] == sid]
    assert row["maxLag"] == 0


async def test_feed_history_is_bounded_by_its_span():
    small = operator_feed.OperatorFeed(tick_s=1.0, history_s=3, session_history_s=2)
    for _ in range(5):
        small.tick()
    snapshot = small.snapshot()
    assert len(snapshot["history"]) == 3
    assert all(len(points) <= 2 for points in snapshot["sessionHistory"].values())


# -- the records endpoint -----------------------------------------------------------------


async def test_records_endpoint_is_for_staff(make_session, make_user, staff_cookie):
    sid = await make_session()
    path = f"/ops/sessions/{sid}/records"
    assert_error(await call("GET", path), 403, "forbidden")
    cookie = await login_cookie(await make_user("alice"))
    assert_error(await call("GET", path, headers={"cookie": cookie}), 403, "forbidden")
    headers = {"cookie": staff_cookie}
    response = await call("GET", path, headers=headers)
    assert response.json() == {"session": sid, "connections": [], "incidents": []}
    unknown = "00000000-0000-4000-8000-000000000000"
    missing = await call(
        "GET", f"/ops/sessions/{unknown}/records", headers={"cookie": staff_cookie}
    )
    assert_error(missing, 404, "not_found")  # JSON, like every other error


@pytest.mark.usefixtures("strict_caps")
async def test_records_endpoint_returns_the_exact_eviction_payload(
    make_session, stream_of, staff_cookie
):
    from sessions.ops import records

    sid = await make_session()
    stream = await stream_of(sid, query="maxQueued=16")
    await burst(sid, 40)
    await stream.read_to_end()
    await records.recorder.flush()
    body = (
        await call("GET", f"/ops/sessions/{sid}/records", headers={"cookie": staff_cookie})
    ).json()
    received = next(e.data for e in stream.events if e.type == "client_evicted")
    assert [i["payload"] for i in body["incidents"] if i["kind"] == "client_evicted"] == [received]
    assert body["connections"][0]["endPayload"] == received


async def test_dashboard_view_reads_live_numbers_through_the_server_loop(
    make_session, staff_cookie
):
    # The sync view runs in a worker thread; the live rows come from the captured loop.
    sid = await make_session()
    get_backend().loop.attach()
    live = await get_backend().get_live_session(sid)
    live.bus.subscribe()
    client = AsyncClient()
    client.cookies.load(staff_cookie)
    response = await client.get("/")
    config = response.context["dashboard_config"]
    (row,) = [r for r in config["sessions"] if r["id"] == sid]
    assert (row["live"], row["subscribers"]) == (True, 1)
    assert await sync_to_async(AgentSession.objects.count)() == 1
