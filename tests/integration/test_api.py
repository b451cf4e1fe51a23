"""The JSON endpoints of ``docs/protocol.md`` ("Endpoints"), through the real ASGI application.

Each test names the endpoint (a subsection of "Endpoints") and the rules it checks. Every
4xx answer is JSON ``{"error": ..., "code": ...}`` (``sessions.web.responses``).
"""

from __future__ import annotations

import json
import uuid

import pytest

from sessions.auth import issue_token
from tests.integration.conftest import (
    assert_error,
    bearer,
    call,
    close,
    csrf_headers,
    load,
    login_cookie,
    publish,
    publish_many,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def _creator() -> dict[str, str]:
    """Headers of a service that holds a ``create`` token (POST /session)."""
    return bearer(issue_token("*", ["create"]))


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


# -- POST /session -------------------------------------------------------------------------


async def test_create_with_create_token_is_201_with_id_urls_and_tokens(stream_of):
    # POST /session
    response = await call("POST", "/session", headers=_creator(), json_body={})
    assert response.status == 201
    body = response.json()
    sid = body["id"]
    assert str(uuid.UUID(sid)) == sid
    assert body["status"] == "open"
    assert body["urls"]["events"] == f"http://testserver/session/{sid}/events"
    assert body["urls"]["load"] == f"http://testserver/session/{sid}"
    assert (await publish(sid, {"type": "a"}, body["tokens"]["publish"])).status == 200
    assert (await stream_of(sid, body["tokens"]["read"])).status == 200


async def test_create_keeps_title_and_ring_size(make_session):
    # POST /session
    response = await call(
        "POST", "/session", headers=_creator(), json_body={"title": "T", "ringSize": 2}
    )
    sid = response.json()["id"]
    await publish_many(sid, 3)
    snapshot = (await load(sid)).json()
    assert snapshot["title"] == "T"
    assert snapshot["ringSize"] == 2
    assert [e.get("id") for e in snapshot["events"]] == [None, 2, 3]


async def test_create_without_auth_is_401():
    # POST /session, EB-12
    response = await call("POST", "/session", json_body={})
    assert_error(response, 401, "unauthorized")


async def test_create_with_read_token_is_403(make_session):
    # POST /session
    token = issue_token(await make_session(), ["read"])
    response = await call("POST", "/session", headers=bearer(token), json_body={})
    assert_error(response, 403, "forbidden")


async def test_create_by_logged_in_user_without_csrf_header_is_403_csrf_failed(make_user):
    # POST /session: a browser request must pass the CSRF check
    cookie = await login_cookie(await make_user("alice"))
    headers = csrf_headers(cookie, with_header=False)
    response = await call("POST", "/session", headers=headers, json_body={})
    assert_error(response, 403, "csrf_failed")


async def test_create_by_logged_in_user_with_csrf_makes_them_owner(make_user, open_stream):
    # POST /session, EB-12 login-session auth
    cookie = await login_cookie(await make_user("alice"))
    response = await call("POST", "/session", headers=csrf_headers(cookie), json_body={})
    assert response.status == 201
    sid = response.json()["id"]
    stream = await open_stream(f"/session/{sid}/events", {"cookie": cookie})
    assert stream.status == 200


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"title": 5}, "title"),
        ({"title": "x" * 201}, "title"),
        ({"title": "a\u0000b"}, "title"),
        ({"title": "two\nlines"}, "title"),
        ({"title": "a\u202eb"}, "title"),  # right-to-left override
        ({"title": "a\u2066b"}, "title"),  # left-to-right isolate
        ({"title": "a\u2028b"}, "title"),  # line separator
        ({"title": "\ufeffa"}, "title"),  # byte order mark
        ({"ringSize": 0}, "ringSize"),
        ({"ringSize": 1_000_001}, "ringSize"),
        ({"ringSize": "8"}, "ringSize"),
        ({"ringSize": True}, "ringSize"),
        ({"ringSize": 2.5}, "ringSize"),
        ({"streamCompression": "false"}, "streamCompression"),
        ({"streamCompression": 0}, "streamCompression"),
        ({"streamCompression": None}, "streamCompression"),
    ],
)
async def test_create_with_bad_field_is_400_naming_it(body, field):
    # POST /session
    response = await call("POST", "/session", headers=_creator(), json_body=body)
    assert assert_error(response, 400, "invalid_request")["field"] == field


# -- GET /session/<id> ---------------------------------------------------------------------


async def test_load_returns_the_snapshot(make_session, stream_of):
    # GET /session/<id>
    sid = await make_session(title="T")
    await publish_many(sid, 2)
    await stream_of(sid)
    snapshot = (await load(sid)).json()
    assert snapshot["id"] == sid
    assert snapshot["title"] == "T"
    assert snapshot["status"] == "open"
    assert snapshot["lastEventId"] == 2
    assert snapshot["subscriberCount"] == 1
    assert isinstance(snapshot["epoch"], str)
    assert snapshot["earliestAvailableId"] == 1
    assert [(e["id"], e["type"], e["data"]) for e in snapshot["events"]] == [
        (1, "step", {"n": 0}),
        (2, "step", {"n": 1}),
    ]


async def test_load_starts_with_history_truncated_when_the_ring_dropped_events(make_session):
    # GET /session/<id>
    sid = await make_session(ring_size=2)
    await publish_many(sid, 4)
    events = (await load(sid)).json()["events"]
    assert events[0] == {"v": 1, "type": "history_truncated", "data": {"earliestAvailableId": 3}}
    assert [e["id"] for e in events[1:]] == [3, 4]


async def test_load_without_dropped_events_has_no_history_truncated(make_session):
    # GET /session/<id>
    sid = await make_session(ring_size=2)
    await publish_many(sid, 2)
    assert [e["id"] for e in (await load(sid)).json()["events"]] == [1, 2]


async def test_load_epoch_matches_the_stream_header(make_session, stream_of):
    # GET /session/<id>, EB-17
    sid = await make_session()
    stream = await stream_of(sid)
    assert (await load(sid)).json()["epoch"] == stream.headers["x-event-epoch"]


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        (lambda sid: {}, 401, "unauthorized"),
        (lambda sid: {"authorization": "Bearer forged"}, 401, "unauthorized"),
        (lambda sid: bearer(issue_token(sid, ["publish"])), 403, "forbidden"),
        (lambda sid: bearer(issue_token(str(uuid.uuid4()), ["read"])), 403, "forbidden"),
    ],
    ids=["no auth", "bad token", "publish-only token", "another session's token"],
)
async def test_load_refuses_callers_without_read_access(make_session, headers, status, code):
    # GET /session/<id>, EB-12
    sid = await make_session(title="secret title")
    response = await call("GET", f"/session/{sid}", headers=headers(sid))
    assert_error(response, status, code)
    assert sid.encode() not in response.body
    assert b"secret title" not in response.body


@pytest.mark.parametrize("raw_id", ["new-uuid", "not-a-session"])
async def test_load_of_unknown_or_malformed_session_is_404(raw_id):
    # GET /session/<id>, EB-15
    sid = str(uuid.uuid4()) if raw_id == "new-uuid" else raw_id
    assert_error(await load(sid), 404, "not_found")


# -- POST /session/<id>/events -------------------------------------------------------------


async def test_publish_returns_contiguous_ids(make_session):
    # POST /session/<id>/events, "Frames"
    sid = await make_session()
    assert await publish_many(sid, 5) == [1, 2, 3, 4, 5]


async def test_publish_returns_the_id_and_the_epoch(make_session):
    # POST /session/<id>/events
    sid = await make_session()
    body = (await publish(sid, {"type": "a", "data": None})).json()
    assert body == {"id": 1, "epoch": (await load(sid)).json()["epoch"]}


async def test_publish_with_read_token_is_403(make_session):
    # POST /session/<id>/events
    sid = await make_session()
    response = await publish(sid, {"type": "a"}, issue_token(sid, ["read"]))
    assert_error(response, 403, "forbidden")
    assert (await load(sid)).json()["lastEventId"] == 0


async def test_publish_without_auth_is_401(make_session):
    # POST /session/<id>/events, EB-12
    sid = await make_session()
    response = await call("POST", f"/session/{sid}/events", json_body={"type": "a"})
    assert_error(response, 401, "unauthorized")


BAD_EVENT_BODIES = {
    "not JSON": (b"{not json", "invalid_json", ""),
    "empty": (b"", "invalid_json", ""),
    "not an object": (b"[1, 2]", "invalid_event", ""),
    "missing type": (b'{"data": 1}', "invalid_event", "type"),
    "empty type": (b'{"type": ""}', "invalid_event", "type"),
    "type not a string": (b'{"type": 5}', "invalid_event", "type"),
    "type with CR": (b'{"type": "a\\rb"}', "invalid_event", "type"),
    "type with LF": (b'{"type": "a\\nb"}', "invalid_event", "type"),
    "type with NUL": (b'{"type": "a\\u0000b"}', "invalid_event", "type"),
    "unknown key": (b'{"type": "a", "colour": 1}', "invalid_event", "colour"),
    "_meta not an object": (b'{"type": "a", "_meta": [1]}', "invalid_event", "_meta"),
    "data nested 100 deep": (
        json.dumps({"type": "a", "data": _nested(100)}).encode(),
        "invalid_event",
        "data",
    ),
    "originatorClientId not a string": (
        b'{"type": "a", "originatorClientId": 1}',
        "invalid_event",
        "originatorClientId",
    ),
}


@pytest.mark.parametrize(("body", "code", "field"), BAD_EVENT_BODIES.values(), ids=BAD_EVENT_BODIES)
async def test_publish_bad_body_is_400_naming_the_field(make_session, body, code, field):
    # POST /session/<id>/events: "bad body -> 400 with a field error"
    sid = await make_session()
    headers = {**bearer(issue_token(sid, ["publish"])), "content-type": "application/json"}
    response = await call("POST", f"/session/{sid}/events", headers=headers, body=body)
    error = assert_error(response, 400, code)
    assert error.get("field") == field, error
    assert (await load(sid)).json()["lastEventId"] == 0


async def test_publish_body_over_the_limit_is_413(make_session, qwenweb_settings):
    # POST /session/<id>/events (PUBLISH_MAX_BODY_BYTES)
    qwenweb_settings(PUBLISH_MAX_BODY_BYTES=64)
    sid = await make_session()
    response = await publish(sid, {"type": "a", "data": "x" * 64})
    assert_error(response, 413, "body_too_large")
    assert (await load(sid)).json()["lastEventId"] == 0


async def test_publish_body_at_the_limit_is_accepted(make_session, qwenweb_settings):
    # POST /session/<id>/events (PUBLISH_MAX_BODY_BYTES)
    qwenweb_settings(PUBLISH_MAX_BODY_BYTES=64)
    sid = await make_session()
    event = {"type": "a", "data": ""}
    event["data"] = "x" * (64 - len(json.dumps(event)))
    assert (await publish(sid, event)).json()["id"] == 1


async def test_publish_keeps_caller_meta_timestamp_and_originator(make_session, stream_of):
    # "Frames", POST /session/<id>/events
    sid = await make_session()
    stream = await stream_of(sid)
    event = {"type": "a", "data": [1], "_meta": {"serverTimestamp": 5, "k": "v"}}
    await publish(sid, {**event, "originatorClientId": "tab-1"})
    frame = await stream.read_until_type("a")
    assert frame["_meta"] == {"serverTimestamp": 5, "k": "v"}
    assert frame["originatorClientId"] == "tab-1"


async def test_publish_by_logged_in_owner_needs_the_csrf_header(make_session, make_user):
    # POST /session/<id>/events: browser requests pass the CSRF check
    owner = await make_user("owner")
    sid = await make_session(owner=owner)
    cookie, path = await login_cookie(owner), f"/session/{sid}/events"
    refused = await call(
        "POST", path, headers=csrf_headers(cookie, with_header=False), json_body={"type": "a"}
    )
    assert_error(refused, 403, "csrf_failed")
    accepted = await call("POST", path, headers=csrf_headers(cookie), json_body={"type": "a"})
    assert accepted.json()["id"] == 1


async def test_publish_to_closed_session_is_409(make_session):
    # POST /session/<id>/events
    sid = await make_session()
    await close(sid)
    assert_error(await publish(sid, {"type": "a"}), 409, "session_closed")


async def test_publish_to_unknown_session_is_404():
    # POST /session/<id>/events
    assert_error(await publish(str(uuid.uuid4()), {"type": "a"}), 404, "not_found")


# -- POST /session/<id>/close --------------------------------------------------------------


async def test_close_is_idempotent(make_session):
    # POST /session/<id>/close
    sid = await make_session()
    await publish_many(sid, 2)
    first, second = (await close(sid)).json(), (await close(sid)).json()
    assert first == {"id": sid, "status": "closed", "lastEventId": 3, "alreadyClosed": False}
    assert second == {**first, "alreadyClosed": True}


async def test_closed_session_stream_is_204_and_load_says_closed(make_session, stream_of):
    # POST /session/<id>/close, EB-15
    sid = await make_session()
    await close(sid)
    stream = await (await stream_of(sid)).read_to_end()
    assert stream.status == 204
    assert stream.body == b""
    snapshot = (await load(sid)).json()
    assert snapshot["status"] == "closed"
    assert snapshot["lastEventId"] == 1


async def test_close_by_logged_in_owner_with_csrf(make_session, make_user):
    # POST /session/<id>/close
    owner = await make_user("owner")
    sid = await make_session(owner=owner)
    headers = csrf_headers(await login_cookie(owner))
    response = await call("POST", f"/session/{sid}/close", headers=headers)
    assert response.json()["alreadyClosed"] is False


async def test_close_with_read_token_is_403(make_session):
    # POST /session/<id>/close
    sid = await make_session()
    assert_error(await close(sid, issue_token(sid, ["read"])), 403, "forbidden")
    assert (await load(sid)).json()["status"] == "open"


# -- POST /session/<id>/token --------------------------------------------------------------


async def _token(sid: str, headers: dict[str, str], body: object = None):
    return await call("POST", f"/session/{sid}/token", headers=headers, json_body=body or {})


async def test_token_for_logged_in_owner_opens_the_stream(make_session, make_user, stream_of):
    # POST /session/<id>/token, EB-12
    owner = await make_user("owner")
    sid = await make_session(owner=owner)
    response = await _token(sid, csrf_headers(await login_cookie(owner)))
    body = response.json()
    assert response.status == 200
    assert body["scope"] == "read"
    assert body["sessionId"] == sid
    assert (await stream_of(sid, body["token"])).status == 200


async def test_token_with_publish_scope_publishes(make_session, make_user):
    # POST /session/<id>/token
    owner = await make_user("owner")
    sid = await make_session(owner=owner)
    headers = csrf_headers(await login_cookie(owner))
    token = (await _token(sid, headers, {"scope": "publish"})).json()["token"]
    assert (await publish(sid, {"type": "a"}, token)).json()["id"] == 1


async def test_token_for_anonymous_is_401(make_session):
    # POST /session/<id>/token
    sid = await make_session()
    assert_error(await _token(sid, csrf_headers()), 401, "unauthorized")


async def test_token_for_non_owner_is_404(make_session, make_user):
    # POST /session/<id>/token: the stranger cannot tell the session exists
    owner, stranger = await make_user("owner"), await make_user("stranger")
    sid = await make_session(owner=owner)
    response = await _token(sid, csrf_headers(await login_cookie(stranger)))
    assert_error(response, 404, "not_found")


@pytest.mark.parametrize("scope", ["write", "create", "", 5])
async def test_token_with_bad_scope_is_400(make_session, make_user, scope):
    # POST /session/<id>/token
    owner = await make_user("owner")
    sid = await make_session(owner=owner)
    response = await _token(sid, csrf_headers(await login_cookie(owner)), {"scope": scope})
    assert assert_error(response, 400, "invalid_request")["field"] == "scope"


async def test_token_without_csrf_header_is_403_json_csrf_failed(make_session, make_user):
    # POST /session/<id>/token (CSRF-protected); sessions.web.responses: every 4xx is JSON with
    # error and code
    owner = await make_user("owner")
    sid = await make_session(owner=owner)
    headers = csrf_headers(await login_cookie(owner), with_header=False)
    assert_error(await _token(sid, headers), 403, "csrf_failed")


# -- GET /capabilities and wrong methods ---------------------------------------------------


async def test_capabilities_shape():
    # GET /capabilities
    response = await call("GET", "/capabilities")
    body = response.json()
    assert response.status == 200
    assert body["v"] == 1
    assert {"session_events", "slow_client_warning", "typed_event_schema"} <= set(body["features"])
    assert body["maxQueued"] == {"min": 16, "max": 2048, "default": 256}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/capabilities"),
        ("GET", "/session"),
        ("GET", "/session/{sid}/close"),
        ("GET", "/session/{sid}/token"),
        ("DELETE", "/session/{sid}/events"),
    ],
)
async def test_wrong_method_is_405_json(make_session, method, path):
    # "Endpoints"; sessions.web.responses: every 4xx is JSON with error and code
    sid = await make_session()
    response = await call(method, path.format(sid=sid), headers=_creator())
    assert_error(response, 405, "method_not_allowed")


@pytest.mark.parametrize(
    ("method", "suffix"), [("GET", ""), ("POST", "/events"), ("POST", "/close")]
)
async def test_logged_in_non_owner_gets_the_404_of_an_unknown_session(
    make_session, make_user, method, suffix
):
    # "Where this differs": a logged-in user cannot tell which sessions exist
    sid = await make_session(owner=await make_user("owner"), title="secret")
    headers = csrf_headers(await login_cookie(await make_user("stranger")))
    body = {"type": "t"} if suffix == "/events" else None
    found = await call(method, f"/session/{sid}{suffix}", headers=headers, json_body=body)
    unknown = await call(
        method, f"/session/{uuid.uuid4()}{suffix}", headers=headers, json_body=body
    )
    assert assert_error(found, 404, "not_found") == assert_error(unknown, 404, "not_found")


KEPT_TITLES = [
    "👨\u200d👩\u200d👧 family",  # zero-width joiners
    "مرحبا",
    "क्\u200dष",
    "dash: a–b",
]


@pytest.mark.parametrize("title", KEPT_TITLES)
async def test_create_keeps_titles_in_any_script_with_joiners(title):
    response = await call("POST", "/session", headers=_creator(), json_body={"title": title})
    assert response.status == 201, response.body
    assert response.json()["title"] == title
