"""Revocation (docs/protocol.md, "Revocation"): older tokens answer 401 ``token_revoked``
and open streams end with ``stream_error`` (``token_revoked`` / ``token_expired``).

Runs under both backends (``make test-redis``). Every wait is bounded: the revocation
must reach the stream within ``REVOKED_WITHIN_S`` (the issue's 2 s).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model

from sessions import token_versions
from sessions.auth import issue_current_token, issue_token
from sessions.token_revocation import revoke_session_tokens, revoke_user_tokens
from tests.integration.conftest import (
    assert_error,
    bearer,
    call,
    close,
    login_cookie,
    publish,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

REVOKED_WITHIN_S = 2.0


async def _token(sid: str, scope: str, user: Any = None) -> str:
    return await database_sync_to_async(issue_current_token)(
        sid, [scope], user.get_username() if user else "svc", user_id=user.pk if user else None
    )


async def _deactivate(user: Any) -> None:
    user.is_active = False
    await database_sync_to_async(user.save)()


async def _ended_with(stream, code: str) -> dict[str, Any]:
    """Read (bounded) until the stream's terminal ``stream_error``; return its data."""
    async with asyncio.timeout(REVOKED_WITHIN_S):
        while "stream_error" not in stream.types:
            await stream.read_chunk()
    error = stream.frame("stream_error")
    assert "id" not in error
    assert error["data"]["code"] == code, error
    await stream.read_to_end()
    return error["data"]


async def _owned_session(make_session, make_user, name: str = "owner"):
    owner = await make_user(name)
    return owner, await make_session(owner=owner)


async def test_deactivating_the_owner_revokes_publish_token_and_ends_read_stream(
    make_session, make_user, stream_of
):
    owner, sid = await _owned_session(make_session, make_user)
    stream = await stream_of(sid, await _token(sid, "read", owner))
    publish_token = await _token(sid, "publish", owner)
    assert (await publish(sid, {"type": "a"}, publish_token)).status == 200
    await _deactivate(owner)
    await _ended_with(stream, "token_revoked")
    assert_error(await publish(sid, {"type": "b"}, publish_token), 401, "token_revoked")


async def test_a_deleted_users_create_token_is_revoked(make_user):
    user = await make_user("gone")
    create = await _token("*", "create", user)
    assert (await call("POST", "/session", headers=bearer(create), json_body={})).status == 201
    await database_sync_to_async(user.delete)()
    await make_user("gone")  # the same username again: a new account
    refused = await call("POST", "/session", headers=bearer(create), json_body={})
    assert_error(refused, 401, "token_revoked")


async def test_a_create_token_makes_the_user_it_names_by_id_the_owner(make_user):
    user = await make_user("alice")
    create = await _token("*", "create", user)
    user.username = "renamed"
    await database_sync_to_async(user.save)()
    created = await call("POST", "/session", headers=bearer(create), json_body={})
    row = await database_sync_to_async(
        lambda: get_user_model().objects.get(agent_sessions__id=created.json()["id"])
    )()
    assert row.pk == user.pk


async def test_login_stream_of_a_deactivated_user_ends(make_session, make_user, open_stream):
    owner, sid = await _owned_session(make_session, make_user)
    stream = await open_stream(f"/session/{sid}/events", {"cookie": await login_cookie(owner)})
    assert stream.status == 200
    await _deactivate(owner)
    await _ended_with(stream, "token_revoked")


async def test_revoking_a_users_tokens_spares_tokens_issued_after(make_session, make_user):
    owner, sid = await _owned_session(make_session, make_user)
    old = await _token(sid, "publish", owner)
    await database_sync_to_async(revoke_user_tokens)(owner.pk)
    new = await _token(sid, "publish", owner)
    assert_error(await publish(sid, {"type": "a"}, old), 401, "token_revoked")
    assert (await publish(sid, {"type": "a"}, new)).status == 200


async def test_revoking_a_sessions_tokens_ends_its_token_streams(make_session, stream_of):
    sid = await make_session()
    stream = await stream_of(sid, await _token(sid, "read"))
    await database_sync_to_async(revoke_session_tokens)(sid)
    await _ended_with(stream, "token_revoked")
    assert (await stream_of(sid, await _token(sid, "read"))).status == 200


async def test_a_token_issued_before_versions_existed_works_until_its_session_is_revoked(
    make_session, make_user
):
    owner, sid = await _owned_session(make_session, make_user)
    legacy = issue_token(sid, ["publish"], owner.get_username())  # no uid, uv, sv
    await database_sync_to_async(revoke_user_tokens)(owner.pk)
    assert (await publish(sid, {"type": "a"}, legacy)).status == 200
    await database_sync_to_async(revoke_session_tokens)(sid)
    assert_error(await publish(sid, {"type": "a"}, legacy), 401, "token_revoked")


async def test_a_closed_sessions_stream_answers_204_to_a_revoked_token(
    make_session, make_user, stream_of
):
    owner, sid = await _owned_session(make_session, make_user)
    read = await _token(sid, "read", owner)  # issued before the close
    await close(sid)
    await database_sync_to_async(revoke_session_tokens)(sid)
    await database_sync_to_async(revoke_user_tokens)(owner.pk)
    stream = await (await stream_of(sid, read)).read_to_end()
    assert (stream.status, stream.body) == (204, b"")


async def test_an_open_sessions_stream_refuses_a_revoked_token_with_401(make_session, stream_of):
    sid = await make_session()
    read = await _token(sid, "read")
    await database_sync_to_async(revoke_session_tokens)(sid)
    stream = await (await stream_of(sid, read)).read_to_end()
    assert_error(stream, 401, "token_revoked")


async def test_the_sweep_ends_a_stream_revoked_where_no_message_came_from(
    make_session, make_user, stream_of
):
    # Another process bumped the version (memory backend: nobody told this one).
    owner, sid = await _owned_session(make_session, make_user)
    stream = await stream_of(sid, await _token(sid, "read", owner))
    await database_sync_to_async(token_versions.bump_user_version)(owner.pk)
    await _ended_with(stream, "token_revoked")


async def test_a_stream_ends_with_token_expired_when_its_token_expires(
    make_session, stream_of, qwenweb_settings, monkeypatch
):
    sid = await make_session()
    lifetime = 60
    signed_at = int(time.time()) - lifetime + 1  # expires within the next second
    monkeypatch.setattr(time, "time", lambda: float(signed_at))  # the signing clock
    read = await _token(sid, "read")
    monkeypatch.undo()
    qwenweb_settings(HEARTBEAT_INTERVAL_S=0.2, TOKEN_LIFETIME_S=lifetime)
    stream = await stream_of(sid, read)
    assert stream.status == 200
    data = await _ended_with(stream, "token_expired")
    assert data["error"]
    assert time.time() >= signed_at + lifetime


async def _demote(user: Any) -> None:
    user.is_staff = False
    await database_sync_to_async(user.save)()


async def test_a_staff_login_stream_on_another_users_session_ends_when_demoted(
    make_session, make_user, open_stream
):
    _, sid = await _owned_session(make_session, make_user)
    staff = await make_user("operator", is_staff=True)
    stream = await open_stream(f"/session/{sid}/events", {"cookie": await login_cookie(staff)})
    assert stream.status == 200
    await _demote(staff)
    await _ended_with(stream, "token_revoked")


async def test_the_sweep_ends_a_staff_stream_whose_rights_went_without_a_signal(
    make_session, make_user, open_stream
):
    _, sid = await _owned_session(make_session, make_user)
    staff = await make_user("operator", is_staff=True)
    stream = await open_stream(f"/session/{sid}/events", {"cookie": await login_cookie(staff)})
    await database_sync_to_async(  # (a queryset update sends no signal)
        lambda: get_user_model().objects.filter(pk=staff.pk).update(is_staff=False)
    )()
    await _ended_with(stream, "token_revoked")


async def test_a_demoted_users_stream_on_their_own_session_goes_on(
    make_session, make_user, open_stream
):
    owner = await make_user("staff-owner", is_staff=True)
    sid = await make_session(owner_id=owner.pk)
    opened = await open_stream(f"/session/{sid}/events", {"cookie": await login_cookie(owner)})
    assert opened.status == 200
    await _demote(owner)
    from sessions.backends import get_backend

    backend = get_backend()
    assert await backend.revocation_sweep.sweep_once() == 0
    assert (await backend.get_live_session(sid)).bus.subscriber_count == 1
