"""``GET /session/<id>/readers/<client id>``: is the reader that sent that X-Client-Id on?

The session page polls it while its reading is paused, because a paused fetch body never
shows the stream's end (docs/protocol.md, "Endpoints"). Read access, the error envelope.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sessions.auth import issue_token
from tests.integration.conftest import assert_error, bearer, call, login_cookie

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def status_of(sid: str, client_id: str, headers: dict[str, str]) -> dict[str, Any]:
    response = await call("GET", f"/session/{sid}/readers/{client_id}", headers=headers)
    assert response.status == 200, response.body
    body: dict[str, Any] = response.json()
    return body


async def test_connected_while_the_reader_streams_and_not_after_it_left(make_session, stream_of):
    sid = await make_session()
    reader = issue_token(sid, ["read"], "reader")
    stream = await stream_of(sid, reader, {"x-client-id": "page-abc"})
    await stream.read_chunk()
    assert await status_of(sid, "page-abc", bearer(reader)) == {
        "clientId": "page-abc",
        "connected": True,
        "lastEventId": None,
    }
    assert (await status_of(sid, "page-other", bearer(reader)))["connected"] is False
    await stream.disconnect()
    for _ in range(200):  # the stream detaches once it sees the disconnect: at most 2 s
        if not (await status_of(sid, "page-abc", bearer(reader)))["connected"]:
            break
        await asyncio.sleep(0.01)
    assert (await status_of(sid, "page-abc", bearer(reader)))["connected"] is False


async def test_the_owner_may_ask_with_the_login_session(make_session, make_user):
    owner = await make_user("owner")
    sid = await make_session(owner=owner)
    body = await status_of(sid, "page-x", {"cookie": await login_cookie(owner)})
    assert body["connected"] is False


async def test_refusals_are_json_errors(make_session, make_user):
    sid = await make_session(owner=await make_user("owner"))
    stranger = {"cookie": await login_cookie(await make_user("stranger"))}
    other_token = bearer(issue_token(await make_session(), ["read"], "x"))
    cases = [
        (f"/session/{sid}/readers/page-1", {}, 401, "unauthorized"),
        (f"/session/{sid}/readers/page-1", stranger, 404, "not_found"),
        (f"/session/{sid}/readers/page-1", other_token, 403, "forbidden"),
        ("/session/not-a-uuid/readers/page-1", other_token, 404, "not_found"),
        (f"/session/{sid}/readers/{'x' * 201}", other_token, 400, "invalid_request"),
    ]
    for path, headers, status, code in cases:
        assert_error(await call("GET", path, headers=headers), status, code)
