"""Operators' live subscribers through the ASGI application: list them, disconnect one.

``GET /session/<id>/subscribers`` and ``POST /session/<id>/subscribers/<sid>/disconnect``
(docs/protocol.md, "Endpoints"): staff only, CSRF on the POST, the JSON error envelope;
the disconnected subscriber gets its terminal frame (EB-9 semantics, one subscriber) and
its record names the operator, while its sibling keeps streaming.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import pytest_asyncio
from channels.db import database_sync_to_async

from sessions.auth import issue_token
from sessions.backends import get_backend
from sessions.backends.base import BackendUnavailableError
from sessions.models import SubscriberConnection
from sessions.ops import records
from tests.integration.conftest import (
    Response,
    Stream,
    assert_error,
    bearer,
    call,
    csrf_headers,
    login_cookie,
    publish_many,
)
from tests.integration.conftest import records as log_records

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

ROW_KEYS = {
    "id", "process", "user", "clientId", "address", "transport", "since", "lastEventId", "lag",
    "queuedFrames", "queuedBytes", "bytesPerSecond",
}  # fmt: skip


@pytest_asyncio.fixture
async def staff_cookie(make_user) -> str:
    return await login_cookie(await make_user("root", is_staff=True))


async def listed(session_id: str, cookie: str) -> list[dict[str, Any]]:
    """The rows of ``GET /session/<id>/subscribers`` as staff (asserting 200)."""
    response = await call("GET", f"/session/{session_id}/subscribers", headers={"cookie": cookie})
    assert response.status == 200, response.body
    rows: list[dict[str, Any]] = response.json()["subscribers"]
    return rows


async def disconnect(session_id: str, subscriber_id: str, headers: dict[str, str]) -> Response:
    path = f"/session/{session_id}/subscribers/{subscriber_id}/disconnect"
    return await call("POST", path, headers=headers)


async def two_streams(sid: str, stream_of) -> tuple[Stream, Stream]:
    """Two subscribers that have read their ``retry:`` line (so both are attached)."""
    first = await stream_of(sid, issue_token(sid, ["read"], "reader-1"), {"x-client-id": "tab-1"})
    second = await stream_of(sid, issue_token(sid, ["read"], "reader-2"), {"x-client-id": "tab-2"})
    for stream in (first, second):
        await stream.read_chunk()
    return first, second


# -- the list ------------------------------------------------------------------------------


async def test_staff_see_each_subscriber_with_who_where_cursor_lag_queue_and_rate(
    make_session, stream_of, staff_cookie
):
    sid = await make_session()
    first, second = await two_streams(sid, stream_of)
    ids = await publish_many(sid, 3)
    for stream in (first, second):
        await stream.read_until(lambda s: len(s.events) == 3)
    rows = await listed(sid, staff_cookie)
    assert [(r["user"], r["clientId"], r["address"]) for r in rows] == [
        ("reader-1", "tab-1", "127.0.0.1"),
        ("reader-2", "tab-2", "127.0.0.1"),
    ]
    assert all(set(row) == ROW_KEYS for row in rows)
    assert [row["transport"] for row in rows] == ["sse", "sse"]
    assert [(r["lastEventId"], r["lag"], r["queuedFrames"]) for r in rows] == [(ids[-1], 0, 0)] * 2
    assert all(row["bytesPerSecond"] > 0 for row in rows)  # each was sent retry + 3 frames
    assert rows[0]["since"] <= rows[1]["since"]


async def test_subscriber_ids_are_the_ids_of_their_connection_records(
    make_session, stream_of, staff_cookie
):
    sid = await make_session()
    await two_streams(sid, stream_of)
    rows = await listed(sid, staff_cookie)
    await records.recorder.flush()
    recorded = await database_sync_to_async(
        lambda: {str(pk) for pk in SubscriberConnection.objects.values_list("pk", flat=True)}
    )()
    assert {row["id"] for row in rows} == recorded


async def test_a_session_without_subscribers_lists_none(make_session, staff_cookie):
    sid = await make_session()
    response = await call("GET", f"/session/{sid}/subscribers", headers={"cookie": staff_cookie})
    assert response.status == 200
    assert response.json()["subscribers"] == []
    assert response.json()["process"] == get_backend().process_id


# -- who may ask ----------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["anonymous", "owner", "inactive_staff", "read_token"])
async def test_anyone_but_active_staff_is_refused_403_forbidden_on_both_endpoints(
    make_session, make_user, who
):
    owner = await make_user("alice")
    sid = await make_session(owner=owner)
    headers: dict[str, str] = {}
    if who == "owner":
        headers = csrf_headers(await login_cookie(owner))
    elif who == "inactive_staff":
        staff = await make_user("gone", is_staff=True)
        staff.is_active = False
        await database_sync_to_async(staff.save)()
        headers = csrf_headers(await login_cookie(staff))
    elif who == "read_token":
        headers = bearer(issue_token(sid, ["read", "publish"], "root"))
    listing = await call("GET", f"/session/{sid}/subscribers", headers=headers)
    assert "staff" in assert_error(listing, 403, "forbidden")["error"]
    assert_error(await disconnect(sid, str(uuid.uuid4()), headers), 403, "forbidden")


@pytest.mark.parametrize(
    "raw_id", [str(uuid.uuid4()), "not-a-session"], ids=["unknown", "not-a-session"]
)
async def test_an_unknown_session_is_404_not_found_for_staff(staff_cookie, raw_id):
    listing = await call("GET", f"/session/{raw_id}/subscribers", headers={"cookie": staff_cookie})
    assert_error(listing, 404, "not_found")
    refused = await disconnect(raw_id, str(uuid.uuid4()), csrf_headers(staff_cookie))
    assert_error(refused, 404, "not_found")


@pytest.mark.parametrize(
    "subscriber_id", [str(uuid.uuid4()), "not-a-subscriber"], ids=["unknown", "not-a-subscriber"]
)
async def test_disconnecting_an_unknown_subscriber_is_404_subscriber_not_found(
    make_session, stream_of, staff_cookie, subscriber_id
):
    sid = await make_session()
    stream = await stream_of(sid)
    await stream.read_chunk()
    response = await disconnect(sid, subscriber_id, csrf_headers(staff_cookie))
    assert_error(response, 404, "subscriber_not_found")
    assert get_backend().registry.get(sid).bus.subscriber_count == 1  # type: ignore[union-attr]


async def test_disconnect_without_the_csrf_header_is_403_csrf_failed_and_ends_nothing(
    make_session, stream_of, staff_cookie
):
    sid = await make_session()
    stream = await stream_of(sid)
    await stream.read_chunk()
    (row,) = await listed(sid, staff_cookie)
    response = await disconnect(sid, row["id"], csrf_headers(staff_cookie, with_header=False))
    assert_error(response, 403, "csrf_failed")
    await publish_many(sid, 1)
    await stream.read_until(lambda s: s.types == ["step"])


async def test_get_on_the_disconnect_url_is_405_and_post_on_the_list_is_405(
    make_session, staff_cookie
):
    sid = await make_session()
    path = f"/session/{sid}/subscribers/{uuid.uuid4()}/disconnect"
    response = await call("GET", path, headers={"cookie": staff_cookie})
    assert_error(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "POST"
    listing = await call("POST", f"/session/{sid}/subscribers", headers=csrf_headers(staff_cookie))
    assert_error(listing, 405, "method_not_allowed")
    assert listing.headers["allow"] == "GET, HEAD"


async def test_the_event_store_out_of_reach_is_503_backend_unavailable(
    make_session, staff_cookie, monkeypatch
):
    async def unreachable(session_id: str) -> list[dict[str, Any]]:
        raise BackendUnavailableError("Redis did not answer")

    sid = await make_session()
    monkeypatch.setattr(get_backend(), "list_subscribers", unreachable)
    response = await call("GET", f"/session/{sid}/subscribers", headers={"cookie": staff_cookie})
    assert_error(response, 503, "backend_unavailable")
    assert response.headers["retry-after"] == "3"


# -- disconnecting one ----------------------------------------------------------------------


async def test_disconnecting_one_of_two_ends_it_with_its_terminal_frame_and_the_other_streams_on(
    make_session, stream_of, staff_cookie
):
    sid = await make_session()
    first, second = await two_streams(sid, stream_of)
    target = next(r for r in await listed(sid, staff_cookie) if r["user"] == "reader-1")
    response = await disconnect(sid, target["id"], csrf_headers(staff_cookie))
    assert response.status == 200, response.body
    assert response.json() == {
        "disconnected": True,
        "session": sid,
        "subscriber": target["id"],
        "process": target["process"],
        "relayed": False,
        "by": "root",
    }
    await first.read_to_end()
    assert first.frames[-1]["data"] == {
        "error": "disconnected by the server",
        "code": "server_disconnect",
        "reason": "operator_disconnect",
    }
    (ids,) = [await publish_many(sid, 1)]
    await second.read_until(lambda s: [f.get("id") for f in s.frames] == ids)
    assert [r["user"] for r in await listed(sid, staff_cookie)] == ["reader-2"]


async def test_the_disconnected_subscribers_record_and_log_line_name_the_operator(
    make_session, stream_of, staff_cookie, logs
):
    sid = await make_session()
    stream = await stream_of(sid)
    await stream.read_chunk()
    (row,) = await listed(sid, staff_cookie)
    assert (await disconnect(sid, row["id"], csrf_headers(staff_cookie))).status == 200
    await stream.read_to_end()
    await records.recorder.flush()
    record = await database_sync_to_async(SubscriberConnection.objects.get)(pk=row["id"])
    assert (record.end_reason, record.end_detail) == ("operator_disconnect", "by root")
    assert json.loads(record.end_payload)["data"]["reason"] == "operator_disconnect"
    (line,) = log_records(logs, "operator_disconnect session=")
    assert f"subscriber={row['id']} by=root" in line.getMessage()


async def test_disconnecting_twice_is_404_the_second_time(make_session, stream_of, staff_cookie):
    sid = await make_session()
    stream = await stream_of(sid)
    await stream.read_chunk()
    (row,) = await listed(sid, staff_cookie)
    assert (await disconnect(sid, row["id"], csrf_headers(staff_cookie))).status == 200
    again = await disconnect(sid, row["id"], csrf_headers(staff_cookie))
    assert_error(again, 404, "subscriber_not_found")
