"""The operator's pages (``sessions.web.pages``) and the demo endpoint (``sessions.web.demo``),
through the ASGI app.

The page itself (its script, in Chromium) is tested in ``tests/browser``; here: who may
open it, what it hands to the script, and the demo agent's endpoint and task.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid

import orjson
import pytest

from sessions.backends import get_backend
from sessions.web import demo as pages
from tests.integration.conftest import (
    assert_error,
    call,
    close,
    csrf_headers,
    load,
    login_cookie,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def page_config(body: bytes) -> dict[str, object]:
    """The ``session-config`` JSON the template hands to ``session_page.js``."""
    match = re.search(rb'<script id="session-config" type="application/json">(.*?)</script>', body)
    assert match, body[:500]
    config: dict[str, object] = json.loads(match.group(1))
    return config


async def test_session_page_without_login_redirects_to_the_login_page_with_next(make_session):
    sid = await make_session()
    response = await call("GET", f"/sessions/{sid}/")
    assert response.status == 302
    assert response.headers["location"] == f"/accounts/login/?next=/sessions/{sid}/"


async def test_session_page_for_owner_hands_the_script_its_urls(make_user, make_session):
    owner = await make_user("alice")
    sid = await make_session(owner=owner, title="<b>t</b>", ring_size=5)
    response = await call("GET", f"/sessions/{sid}/", headers={"cookie": await login_cookie(owner)})
    assert response.status == 200
    assert b"&lt;b&gt;t&lt;/b&gt;" in response.body  # the title is escaped
    config = page_config(response.body)
    assert config["ringSize"] == 5
    assert config["urls"] == {
        "events": f"/session/{sid}/events",
        "load": f"/session/{sid}",
        "token": f"/session/{sid}/token",
        "demo": f"/sessions/{sid}/demo",
        "list": "/sessions/",
        "publish": f"/session/{sid}/events",
        "reader": f"/session/{sid}/readers/ffffffff-ffff-ffff-ffff-ffffffffffff",
        "subscribers": None,
        "disconnect": None,
    }
    assert config["maxQueued"] == {"min": 16, "max": 2048, "default": 256}
    assert (config["maxQueuedBytes"], config["isOperator"]) == (2 * 1024 * 1024, False)


async def test_session_page_says_whether_its_streams_may_be_gzipped(
    make_user, make_session, qwenweb_settings
):
    owner = await make_user("alice")
    cookie = {"cookie": await login_cookie(owner)}
    plain = await make_session(owner=owner, stream_compression=False)
    gzipped = await make_session(owner=owner)
    for sid, expected in ((plain, False), (gzipped, True)):
        response = await call("GET", f"/sessions/{sid}/", headers=cookie)
        assert page_config(response.body)["streamCompression"] is expected
        word = b"on" if expected else b"off"
        assert b">compression " + word + b"</span>" in response.body
    qwenweb_settings(STREAM_COMPRESSION=False)  # the deployment's switch wins
    response = await call("GET", f"/sessions/{gzipped}/", headers=cookie)
    assert page_config(response.body)["streamCompression"] is False


async def test_owner_gets_the_publish_console_but_not_the_live_subscribers(make_user, make_session):
    owner = await make_user("alice")
    sid = await make_session(owner=owner)
    response = await call("GET", f"/sessions/{sid}/", headers={"cookie": await login_cookie(owner)})
    assert b'id="publish-form"' in response.body
    assert b'id="subscribers"' not in response.body


async def test_staff_get_the_live_subscribers_and_their_urls(make_user, make_session):
    sid = await make_session(owner=await make_user("alice"))
    cookie = await login_cookie(await make_user("root", is_staff=True))
    response = await call("GET", f"/sessions/{sid}/", headers={"cookie": cookie})
    assert b'id="subscribers"' in response.body
    assert b'id="publish-form"' in response.body
    config = page_config(response.body)
    placeholder = config["subscriberPlaceholder"]
    assert config["isOperator"] is True
    assert config["urls"]["subscribers"] == f"/session/{sid}/subscribers"  # type: ignore[index]
    assert config["urls"]["disconnect"] == (  # type: ignore[index]
        f"/session/{sid}/subscribers/{placeholder}/disconnect"
    )


async def test_session_page_of_another_users_session_is_the_404_page(make_user, make_session):
    sid = await make_session(owner=await make_user("alice"))
    cookie = await login_cookie(await make_user("mallory"))
    response = await call("GET", f"/sessions/{sid}/", headers={"cookie": cookie})
    unknown = await call("GET", f"/sessions/{uuid.uuid4()}/", headers={"cookie": cookie})
    assert response.status == unknown.status == 404
    assert b"No session you may see" in response.body
    assert b"No session you may see" in unknown.body


async def test_session_page_for_staff_opens_any_session(make_user, make_session):
    sid = await make_session(owner=await make_user("alice"))
    cookie = await login_cookie(await make_user("root", is_staff=True))
    assert (await call("GET", f"/sessions/{sid}/", headers={"cookie": cookie})).status == 200


@pytest.mark.parametrize(
    "raw",
    [str(uuid.uuid4()), "not-a-uuid", str(uuid.uuid4()).upper()],
    ids=["unknown", "malformed", "unknown-upper-case"],  # the same in every xdist worker
)
async def test_session_page_of_unknown_or_malformed_id_is_404(make_user, raw):
    cookie = await login_cookie(await make_user("alice"))
    assert (await call("GET", f"/sessions/{raw}/", headers={"cookie": cookie})).status == 404


async def test_session_list_shows_own_sessions_and_staff_sees_all(make_user, make_session):
    alice, bob = await make_user("alice"), await make_user("bob")
    await make_session(owner=alice, title="alice-1")
    await make_session(owner=bob, title="bob-1")
    mine = await call("GET", "/sessions/", headers={"cookie": await login_cookie(alice)})
    assert b"alice-1" in mine.body
    assert b"bob-1" not in mine.body
    staff_cookie = await login_cookie(await make_user("root", is_staff=True))
    everyone = await call("GET", "/sessions/", headers={"cookie": staff_cookie})
    assert b"alice-1" in everyone.body
    assert b"bob-1" in everyone.body


@pytest.mark.parametrize("path", ["/sessions/", "/sessions/{sid}/", "/"])
async def test_head_of_a_page_answers_like_get(make_user, make_session, path):
    # require_safe, not require_GET: monitors and link checkers send HEAD (RFC 9110, 9.3.2).
    # (The server drops the body of a HEAD answer: tests/e2e/test_serve_granian.py.)
    staff = await make_user("root", is_staff=True)
    path = path.format(sid=await make_session(owner=staff))
    cookie = {"cookie": await login_cookie(staff)}
    get, head = await call("GET", path, headers=cookie), await call("HEAD", path, headers=cookie)
    assert (head.status, head.headers["content-type"]) == (200, get.headers["content-type"])


async def test_root_redirects_to_the_session_list():
    response = await call("GET", "/")
    assert response.status == 302
    assert response.headers["location"] == "/sessions/"


# -- POST /sessions/<id>/demo ------------------------------------------------------------


async def test_demo_endpoint_without_csrf_token_is_refused(make_user, make_session):
    owner = await make_user("alice")
    sid = await make_session(owner=owner)
    headers = csrf_headers(await login_cookie(owner), with_header=False)
    response = await call("POST", f"/sessions/{sid}/demo", headers=headers)
    assert response.status == 403
    assert not pages.demo_agent_running(sid)


async def test_demo_endpoint_starts_one_agent_per_session_second_is_409(make_user, make_session):
    owner = await make_user("alice")
    sid = await make_session(owner=owner)
    headers = csrf_headers(await login_cookie(owner))
    try:
        started = await call("POST", f"/sessions/{sid}/demo", headers=headers)
        assert started.status == 202
        assert started.json()["started"] is True
        assert pages.demo_agent_running(sid)
        assert_error(
            await call("POST", f"/sessions/{sid}/demo", headers=headers), 409, "demo_running"
        )
    finally:
        pages._demo_agents[sid].cancel()


async def test_demo_endpoint_refuses_strangers_anonymous_and_closed_sessions(
    make_user, make_session
):
    sid = await make_session(owner=await make_user("alice"))
    stranger = csrf_headers(await login_cookie(await make_user("mallory")))
    assert_error(await call("POST", f"/sessions/{sid}/demo", headers=stranger), 404, "not_found")
    anonymous = await call("POST", f"/sessions/{sid}/demo", headers=csrf_headers())
    assert (anonymous.status, anonymous.json()["code"]) == (401, "unauthorized")
    await close(sid)
    root = csrf_headers(await login_cookie(await make_user("root", is_staff=True)))
    assert_error(await call("POST", f"/sessions/{sid}/demo", headers=root), 409, "session_closed")


async def test_demo_agent_publishes_the_whole_script_in_order(make_session):
    sid = await make_session()
    async with asyncio.timeout(5):
        count = await pages.run_demo_agent(sid, chunks_per_s=1e9)
    snapshot = (await load(sid)).json()
    assert count == len(snapshot["events"]) > 100
    assert [e["id"] for e in snapshot["events"]] == list(range(1, count + 1))
    assert snapshot["events"][0]["data"]["sessionUpdate"] == "user_message_chunk"
    assert snapshot["events"][-1]["type"] == "turn_complete"


async def test_a_second_demo_run_counts_its_turns_on_with_tool_call_ids_of_its_own(make_session):
    # `make demo` twice: the session (its history kept) is played again. The page shows
    # one card per toolCallId: a reused id would move the second run's tool calls onto
    # the first run's cards.
    sid = await make_session()
    async with asyncio.timeout(10):
        first = await pages.run_demo_agent(sid, chunks_per_s=1e9)
        second = await pages.run_demo_agent(sid, chunks_per_s=1e9)
    backend = get_backend()  # (caught up: the Redis backend mirrors into the ring)
    live = await backend.caught_up(await backend.get_live_session(sid))
    events = [orjson.loads(frame.json or b"null") for frame in live.bus.ring]
    assert len(events) == first + second == 2 * first
    turns = [e["data"]["turn"] for e in events if e["type"] == "turn_complete"]
    assert turns == [1, 2, 3, 4]
    calls = [
        e["data"]["toolCallId"] for e in events if e["data"].get("sessionUpdate") == "tool_call"
    ]
    assert len(calls) == len(set(calls)) == 4


async def test_demo_agent_stops_quietly_when_the_session_is_closed(make_session):
    sid = await make_session()
    await close(sid)
    async with asyncio.timeout(5):
        assert await pages.run_demo_agent(sid, chunks_per_s=1e9) == 0


async def test_demo_endpoint_answers_a_wrong_method_with_a_json_405(make_user, make_session):
    sid = await make_session(owner=await make_user("alice"))
    response = await call("OPTIONS", f"/sessions/{sid}/demo")
    assert_error(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "GET, POST"


async def test_demo_endpoint_get_says_whether_an_agent_runs(make_user, make_session):
    owner = await make_user("alice")
    sid = await make_session(owner=owner)
    cookie = await login_cookie(owner)
    before = await call("GET", f"/sessions/{sid}/demo", headers={"cookie": cookie})
    assert before.json() == {"sessionId": sid, "running": False}
    try:
        started = await call("POST", f"/sessions/{sid}/demo", headers=csrf_headers(cookie))
        assert started.status == 202
        running = await call("GET", f"/sessions/{sid}/demo", headers={"cookie": cookie})
        assert running.json()["running"] is True
    finally:
        pages._demo_agents[sid].cancel()
    stranger = {"cookie": await login_cookie(await make_user("mallory"))}
    assert_error(await call("GET", f"/sessions/{sid}/demo", headers=stranger), 404, "not_found")
