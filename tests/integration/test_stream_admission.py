"""``GET /session/<id>/events`` through the real ASGI application: what the route checks
before it streams (``sessions/transport/stream.py``): authentication (EB-12),
``Last-Event-ID`` and ``X-Event-Epoch`` (EB-13), ``?maxQueued`` (EB-14), unknown and
closed sessions (EB-15), the subscriber limit (EB-16), the response headers (EB-17).

Protocol: ``docs/protocol.md``, "The stream"; comments name its sections in quotes.
"""

from __future__ import annotations

import time
import uuid
from unittest import mock

import pytest
from django.core import signing

from sessions.auth import TOKEN_SALT, issue_token
from tests.integration.conftest import (
    assert_error,
    bearer,
    burst,
    ids_of,
    load,
    login_cookie,
    publish,
    publish_many,
    records,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


# -- EB-12: authentication ---------------------------------------------------------------


def _forged(session_id: str) -> str:
    payload = {"sid": session_id, "scp": ["read"], "sub": ""}
    return signing.dumps(payload, salt=TOKEN_SALT, key="not-the-server-secret")


def _expired(session_id: str) -> str:
    two_hours_ago = signing.b62_encode(int(time.time()) - 2 * 3600)
    with mock.patch.object(signing.TimestampSigner, "timestamp", return_value=two_hours_ago):
        return issue_token(session_id, ["read"])


BAD_AUTHORIZATION = {
    "no token after scheme": lambda sid: "Bearer",
    "other scheme": lambda sid: "Basic dXNlcjpwYXNz",
    "two tokens": lambda sid: f"Bearer {issue_token(sid, ['read'])} extra",
    "garbage token": lambda sid: "Bearer not-a-token",
    "oversized token": lambda sid: "Bearer " + "x" * 5000,
    "forged": lambda sid: f"Bearer {_forged(sid)}",
    "expired": lambda sid: f"Bearer {_expired(sid)}",
}


async def test_stream_without_credentials_is_401_and_names_nothing(make_session, open_stream):
    # EB-12
    sid = await make_session(title="secret title")
    stream = await (await open_stream(f"/session/{sid}/events")).read_to_end()
    assert_error(stream, 401, "unauthorized")
    assert sid.encode() not in stream.body
    assert b"secret title" not in stream.body


@pytest.mark.parametrize("authorization", BAD_AUTHORIZATION.values(), ids=BAD_AUTHORIZATION)
async def test_stream_with_bad_token_is_401_and_names_nothing(
    make_session, open_stream, authorization
):
    # EB-12
    sid = await make_session(title="secret title")
    headers = {"authorization": authorization(sid)}
    stream = await (await open_stream(f"/session/{sid}/events", headers)).read_to_end()
    assert_error(stream, 401, "unauthorized")
    assert sid.encode() not in stream.body
    assert b"secret title" not in stream.body


@pytest.mark.parametrize(
    "token",
    [
        lambda sid, other: issue_token(other, ["read"]),
        lambda sid, other: issue_token(sid, ["publish"]),
        lambda sid, other: issue_token("*", ["create"]),
    ],
    ids=["another session's token", "publish-only token", "create token"],
)
async def test_stream_with_token_not_granting_read_here_is_403(make_session, stream_of, token):
    # EB-12
    sid, other = await make_session(title="secret title"), await make_session()
    stream = await (await stream_of(sid, token(sid, other))).read_to_end()
    assert_error(stream, 403, "forbidden")
    assert sid.encode() not in stream.body
    assert b"secret title" not in stream.body


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "BeArEr"])
async def test_stream_bearer_scheme_is_case_insensitive(make_session, open_stream, scheme):
    # EB-12
    sid = await make_session()
    headers = {"authorization": f"{scheme} {issue_token(sid, ['read'])}"}
    stream = await open_stream(f"/session/{sid}/events", headers)
    assert stream.status == 200


# -- EB-12: login-session auth (EventSource sends cookies, not Authorization) ------------


async def test_stream_opens_for_logged_in_owner_with_session_cookie(
    make_session, make_user, open_stream
):
    # EB-12
    owner = await make_user("owner")
    sid = await make_session(owner=owner)
    stream = await open_stream(f"/session/{sid}/events", {"cookie": await login_cookie(owner)})
    assert stream.status == 200
    assert (await publish(sid, {"type": "hello"})).status == 200
    assert (await stream.read_until_type("hello"))["id"] == 1


async def test_stream_for_logged_in_non_owner_is_the_404_of_an_unknown_session(
    make_session, make_user, open_stream
):
    # EB-12, "Where this differs": existence never leaks to a logged-in user
    owner, stranger = await make_user("owner"), await make_user("stranger")
    sid = await make_session(owner=owner, title="secret title")
    headers = {"cookie": await login_cookie(stranger)}
    stream = await (await open_stream(f"/session/{sid}/events", headers)).read_to_end()
    unknown = await (await open_stream(f"/session/{uuid.uuid4()}/events", headers)).read_to_end()
    assert assert_error(stream, 404, "not_found") == assert_error(unknown, 404, "not_found")
    assert b"secret title" not in stream.body


async def test_stream_opens_for_logged_in_staff_who_is_not_owner(
    make_session, make_user, open_stream
):
    # EB-12
    owner, staff = await make_user("owner"), await make_user("staff", is_staff=True)
    sid = await make_session(owner=owner)
    stream = await open_stream(f"/session/{sid}/events", {"cookie": await login_cookie(staff)})
    assert stream.status == 200


async def test_stream_with_unknown_session_cookie_is_401(make_session, open_stream):
    # EB-12
    sid = await make_session()
    headers = {"cookie": "sessionid=nosuchsessionkeyatall0123456789"}
    stream = await (await open_stream(f"/session/{sid}/events", headers)).read_to_end()
    assert_error(stream, 401, "unauthorized")


# -- EB-13: Last-Event-ID and X-Event-Epoch ------------------------------------------------

BAD_CURSORS = {
    "empty": b"",
    "leading space": b" 2",
    "trailing space": b"2 ",
    "plus sign": b"+2",
    "minus sign": b"-2",
    "fraction": b"2.0",
    "exponent": b"2e0",
    "hex": b"0x2",
    "comma-joined": b"1,2",
    "too large": b"9007199254740992",
    "non-ASCII digit": "٢".encode(),
    "letters": b"abc",
}


async def _assert_live_only(sid: str, stream) -> None:
    """Publish one event and read up to it: no replay or resync frame came before it."""
    assert stream.status == 200
    assert (await publish(sid, {"type": "live"})).status == 200
    await stream.read_until_type("live")
    assert stream.types == ["live"], stream.types


@pytest.mark.parametrize("cursor", BAD_CURSORS.values(), ids=BAD_CURSORS)
async def test_invalid_last_event_id_gives_live_only_stream_and_one_log_line(
    make_session, stream_of, logs, cursor
):
    # EB-13
    sid = await make_session()
    await publish_many(sid, 3)
    stream = await stream_of(sid, headers={"last-event-id": cursor})
    await _assert_live_only(sid, stream)
    assert len(records(logs, "last_event_id_rejected")) == 1


async def test_two_last_event_id_headers_give_live_only_stream(make_session, open_stream, logs):
    # EB-13
    sid = await make_session()
    await publish_many(sid, 3)
    headers = [*bearer(issue_token(sid, ["read"])).items(), ("last-event-id", "1")]
    stream = await open_stream(f"/session/{sid}/events", [*headers, ("last-event-id", "2")])
    await _assert_live_only(sid, stream)
    assert len(records(logs, "last_event_id_rejected")) == 1


async def test_rejected_last_event_id_is_logged_sanitized_and_clipped(
    make_session, stream_of, logs
):
    # EB-13
    sid = await make_session()
    cursor = b"12\x00\x1b[31m\r\n" + b"9" * 500
    stream = await stream_of(sid, headers={"last-event-id": cursor})
    await _assert_live_only(sid, stream)
    (record,) = records(logs, "last_event_id_rejected")
    message = record.getMessage()
    assert not any(ch in message for ch in "\x00\x1b\r\n")
    assert "9" * 100 not in message
    assert "12[31m" in message
    assert "…" in message


async def test_last_event_id_with_leading_zeros_is_a_valid_cursor(make_session, stream_of):
    # EB-13
    sid = await make_session()
    await publish_many(sid, 3)
    stream = await stream_of(sid, headers={"last-event-id": "0002"})
    await stream.read_until_type("replay_complete")
    assert stream.types == ["step", "replay_complete"]
    assert ids_of(stream.frames) == [3]


async def test_last_event_id_at_max_safe_integer_is_a_valid_cursor(make_session, stream_of):
    # EB-13: 2**53 - 1 is accepted (so it is an epoch reset here, not a live-only stream)
    sid = await make_session()
    await publish_many(sid, 1)
    stream = await stream_of(sid, headers={"last-event-id": str(2**53 - 1)})
    resync = await stream.read_until_type("replay_complete")
    assert stream.frame("state_resync_required")["data"]["reason"] == "epoch_reset"
    assert resync["data"]["replayedCount"] == 1


@pytest.mark.parametrize("epoch", [b"", b"has space", b"bad!", b"x" * 65, "é".encode()])
async def test_invalid_event_epoch_is_ignored_with_a_log_line(make_session, stream_of, logs, epoch):
    # EB-13
    sid = await make_session()
    await publish_many(sid, 2)
    stream = await stream_of(sid, headers={"last-event-id": "1", "x-event-epoch": epoch})
    await stream.read_until_type("replay_complete")
    assert stream.types == ["step", "replay_complete"]
    assert ids_of(stream.frames) == [2]
    assert len(records(logs, "epoch_rejected")) == 1


async def test_matching_event_epoch_replays_after_the_cursor(make_session, stream_of):
    # EB-13, EB-7
    sid = await make_session()
    await publish_many(sid, 2)
    epoch = (await load(sid)).json()["epoch"]
    stream = await stream_of(sid, headers={"last-event-id": "1", "x-event-epoch": epoch})
    await stream.read_until_type("replay_complete")
    assert stream.types == ["step", "replay_complete"]
    assert ids_of(stream.frames) == [2]


async def test_mismatched_event_epoch_gives_epoch_reset_and_replays_whole_ring(
    make_session, stream_of
):
    # EB-13, EB-7
    sid = await make_session()
    await publish_many(sid, 2)
    stream = await stream_of(sid, headers={"last-event-id": "2", "x-event-epoch": "oldEpoch_1"})
    await stream.read_until_type("replay_complete")
    assert stream.frames[0]["data"] == {
        "reason": "epoch_reset",
        "lastDeliveredId": 2,
        "earliestAvailableId": 1,
        "detail": "epoch_mismatch",
    }
    assert ids_of(stream.frames) == [1, 2]


# -- EB-14: ?maxQueued -------------------------------------------------------------------

BAD_MAX_QUEUED = {
    "letters": "maxQueued=abc",
    "below minimum": "maxQueued=15",
    "above maximum": "maxQueued=2049",
    "empty": "maxQueued=",
    "exponent": "maxQueued=1e2",
    "plus sign": "maxQueued=%2B20",
    "fraction": "maxQueued=20.0",
    "negative": "maxQueued=-20",
    "space": "maxQueued=%2020",
    "zero": "maxQueued=0",
    "two values": "maxQueued=20&maxQueued=30",
    "fullwidth digits": "maxQueued=%EF%BC%92%EF%BC%90",
}


@pytest.mark.parametrize("query", BAD_MAX_QUEUED.values(), ids=BAD_MAX_QUEUED)
async def test_invalid_max_queued_is_400(make_session, stream_of, query):
    # EB-14
    sid = await make_session()
    stream = await (await stream_of(sid, query=query)).read_to_end()
    assert_error(stream, 400, "invalid_max_queued")


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("", 256),
        ("maxQueued=16", 16),
        ("maxQueued=2048", 2048),
        ("maxQueued=000016", 16),  # a plain decimal string may have leading zeros
        ("other=1", 256),
    ],
)
@pytest.mark.usefixtures("strict_caps")
async def test_max_queued_sets_the_subscriber_cap(make_session, stream_of, query, expected):
    # EB-14, EB-4: the cap shows in the slow_client_warning of a burst
    sid = await make_session()
    stream = await stream_of(sid, query=query)
    assert stream.status == 200
    await burst(sid, expected)
    warning = await stream.read_until_type("slow_client_warning")
    assert warning["data"]["maxQueued"] == expected


# -- EB-15: unknown and closed sessions --------------------------------------------------


async def test_stream_of_unknown_session_is_404(stream_of):
    # EB-15
    stream = await (await stream_of(str(uuid.uuid4()))).read_to_end()
    assert_error(stream, 404, "not_found")


@pytest.mark.parametrize(
    "raw_id", ["not-a-session", "B9F5B3C2-0D5E-4B8E-9E2F-3C9E1C6B7A10", "1" * 36]
)
async def test_stream_of_malformed_session_id_is_404(make_user, open_stream, raw_id):
    # EB-15 (a staff login passes EB-12 for any session)
    staff = await make_user("staff", is_staff=True)
    headers = {"cookie": await login_cookie(staff)}
    stream = await (await open_stream(f"/session/{raw_id}/events", headers)).read_to_end()
    assert_error(stream, 404, "not_found")


async def test_stream_of_closed_session_is_204_with_empty_body(make_session, stream_of):
    # EB-15
    sid = await make_session(status="closed")
    stream = await (await stream_of(sid)).read_to_end()
    assert stream.status == 204
    assert stream.body == b""


async def test_stream_of_closed_session_without_auth_is_401(make_session, open_stream):
    # EB-12 before EB-15
    sid = await make_session(status="closed")
    stream = await (await open_stream(f"/session/{sid}/events")).read_to_end()
    assert_error(stream, 401, "unauthorized")


async def test_stream_of_closed_session_for_logged_in_non_owner_is_404(
    make_session, make_user, open_stream
):
    # EB-12 before EB-15: a non-owner learns nothing, not even that the session closed
    owner, stranger = await make_user("owner"), await make_user("stranger")
    sid = await make_session(owner=owner, status="closed")
    headers = {"cookie": await login_cookie(stranger)}
    stream = await (await open_stream(f"/session/{sid}/events", headers)).read_to_end()
    assert_error(stream, 404, "not_found")


async def test_checks_run_in_order_auth_then_max_queued_then_lookup(stream_of, open_stream):
    # EB-12, EB-14, EB-15: each answered before any stream byte, in this order
    sid = str(uuid.uuid4())
    anonymous = await open_stream(f"/session/{sid}/events", query="maxQueued=1")
    assert_error(await anonymous.read_to_end(), 401, "unauthorized")
    authorized = await stream_of(sid, query="maxQueued=1")
    assert_error(await authorized.read_to_end(), 400, "invalid_max_queued")


# -- EB-16: subscriber limit -------------------------------------------------------------


async def test_subscriber_over_the_limit_gets_retry_5000_and_one_stream_error(
    make_session, stream_of, qwenweb_settings
):
    # EB-16
    qwenweb_settings(MAX_SUBSCRIBERS=2)
    sid = await make_session()
    await stream_of(sid), await stream_of(sid)
    third = await (await stream_of(sid)).read_to_end()
    assert (third.status, third.headers["retry-after"]) == (200, "5")
    assert third.headers["content-type"] == "text/event-stream"
    assert third.body.startswith(b"retry: 5000\n\nevent: stream_error\ndata: ")
    assert third.types == ["stream_error"]
    assert b"id:" not in third.body
    assert third.frames[0]["data"] == {
        "error": "subscriber limit reached",
        "code": "subscriber_limit_exceeded",
        "limit": 2,
        "retryAfterMs": 5000,
    }


async def test_subscriber_slot_is_free_again_after_a_disconnect(
    make_session, stream_of, qwenweb_settings
):
    # EB-16, EB-20
    qwenweb_settings(MAX_SUBSCRIBERS=1)
    sid = await make_session()
    await (await stream_of(sid)).disconnect()
    stream = await stream_of(sid)
    assert stream.status == 200
    assert "retry-after" not in stream.headers


# -- EB-17: headers ------------------------------------------------------------------------


async def test_stream_headers_are_exactly_the_event_stream_set(make_session, stream_of):
    # EB-17
    sid = await make_session()
    stream = await stream_of(sid)
    assert stream.status == 200
    assert stream.headers == {
        "content-type": "text/event-stream",
        "cache-control": "no-cache, no-transform",
        "x-accel-buffering": "no",
        "vary": "accept-encoding",
        "x-event-epoch": (await load(sid)).json()["epoch"],
    }
