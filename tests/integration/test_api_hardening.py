"""Bad input to the JSON API gets a clear 4xx and loses nothing (regressions found by review)."""

from __future__ import annotations

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
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def test_integers_beyond_64_bits_keep_their_exact_value(make_session):
    # docs/protocol.md, "Frames": data is any JSON value; orjson would read 2**70 as a float.
    session_id = await make_session()
    response = await call(
        "POST", f"/session/{session_id}/events",
        headers=bearer(issue_token(session_id, ["publish"])),
        body=b'{"type":"t","data":{"big":1180591620717411303424,"neg":-18446744073709551617}}',
    )  # fmt: skip
    assert response.status == 200
    event = (await load(session_id)).json()["events"][-1]
    assert event["data"] == {"big": 2**70, "neg": -(2**64) - 1}


async def test_integers_of_309_digits_and_more_keep_their_exact_value(make_session):
    # orjson reads them as a double that overflows ("infinity"): not a reason to refuse.
    session_id = await make_session()
    big = 10**400 + 7
    response = await call(
        "POST", f"/session/{session_id}/events",
        headers=bearer(issue_token(session_id, ["publish"])),
        body=b'{"type":"t","data":[%d,-%d]}' % (10**308, big),
    )  # fmt: skip
    assert response.status == 200, response.body
    assert (await load(session_id)).json()["events"][-1]["data"] == [10**308, -big]


async def test_an_integer_past_pythons_digit_cap_is_400_naming_it(make_session):
    session_id = await make_session()
    response = await call(
        "POST", f"/session/{session_id}/events",
        headers=bearer(issue_token(session_id, ["publish"])),
        body=b'{"type":"t","data":' + b"9" * 5000 + b"}",
    )  # fmt: skip
    assert "4300 digits" in assert_error(response, 400, "invalid_json")["error"]


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"type":"t","data":[1e400,1234567890123456789012345]}', id="was-409"),
        pytest.param(b'{"type":"t","data":[1e400,1234567890123456789]}', id="was-null"),
        pytest.param(b'{"type":"t","data":123456789012345678901e300}', id="long-mantissa"),
        pytest.param(
            b'{"type":"t","data":1,"_meta":{"a":-1e999,"b":1234567890123456789}}', id="meta"
        ),
    ],
)
async def test_a_number_no_float_holds_is_400_beside_a_long_integer_too(make_session, body):
    # The contract (shared/spec/event-bus.md §5, POST /session/<id>/events): a bad body is
    # 400 with a field error; 409 is for a closed session only. A run of 19 digits sent the
    # body to json, which read 1e400 as infinity: stored as null (200), or refused by the
    # store as 409 session_closed. 1e400 alone was 400.
    session_id = await make_session()
    headers = bearer(issue_token(session_id, ["publish"]))
    response = await call("POST", f"/session/{session_id}/events", headers=headers, body=body)
    assert "out of range" in assert_error(response, 400, "invalid_json")["error"]
    assert (await publish(session_id, {"type": "t", "data": 1})).status == 200


async def test_long_integers_past_their_budget_are_400_before_they_are_converted(make_session):
    # 480 integers of 4,300 digits took 39 ms in one call holding the interpreter's lock.
    session_id = await make_session()
    body = b'{"type":"t","data":[' + b",".join([b"7" * 4300] * 480) + b"]}"
    response = await call(
        "POST", f"/session/{session_id}/events",
        headers=bearer(issue_token(session_id, ["publish"])), body=body,
    )  # fmt: skip
    assert "too long in all" in assert_error(response, 400, "invalid_json")["error"]


@pytest.mark.parametrize(
    "event_type",
    ["client_evicted", "stream_error", "state_resync_required", "replay_complete",
     "slow_client_warning", "session_closed", "history_truncated"],
)  # fmt: skip
async def test_publish_refuses_reserved_control_types(make_session, event_type):
    # SC-12: clients act on these frames, so a publisher may not forge them.
    session_id = await make_session()
    response = await publish(session_id, {"type": event_type, "data": {}})
    assert assert_error(response, 400, "invalid_event")["field"] == "type"


async def test_unknown_field_names_are_sanitized_in_answer_and_log(make_session, logs):
    session_id = await make_session()
    forged = "evil\r\n2026-01-01 00:00:00 CRITICAL qwenweb.fake forged line"
    response = await publish(session_id, {"type": "t", "data": 1, forged: 1})
    body = assert_error(response, 400, "invalid_event")
    assert "\n" not in body["error"]
    assert "\r" not in body["error"]
    lines = [r.getMessage() for r in logs.records if r.name == "qwenweb.api"]
    assert lines
    assert all("\n" not in line and "\r" not in line for line in lines)


async def test_chunked_body_beyond_django_limit_is_413_json(make_session, settings):
    # A body with no Content-Length that exceeds DATA_UPLOAD_MAX_MEMORY_SIZE.
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    session_id = await make_session()
    token = issue_token(session_id, ["publish"])
    response = await call(
        "POST", f"/session/{session_id}/events", headers=bearer(token), body=b" " * 5000
    )
    assert_error(response, 413, "body_too_large")


async def test_a_body_above_djangos_default_cap_but_within_the_limit_is_published(
    make_session, monkeypatch
):
    # docs/protocol.md, "Errors and limits": PUBLISH_MAX_BODY_BYTES governs, not Django's
    # own 2.5 MiB DATA_UPLOAD_MAX_MEMORY_SIZE (which answered a 413 naming the wrong limit).
    from sessions.conf import get_config

    monkeypatch.setenv("QWENWEB_PUBLISH_MAX_BODY_BYTES", str(4 * 1024 * 1024))
    get_config.cache_clear()
    session_id = await make_session()
    body = b'{"type":"big","data":"' + b"x" * (3 * 1024 * 1024) + b'"}'
    response = await call(
        "POST", f"/session/{session_id}/events",
        headers=bearer(issue_token(session_id, ["publish"])), body=body,
    )  # fmt: skip
    assert response.status == 200, response.body[:200]


async def test_other_methods_on_the_events_url_name_every_method_served_there(make_session):
    # GET and HEAD are the stream (EB-12), POST is publish: Allow lists all three.
    session_id = await make_session()
    response = await call("PUT", f"/session/{session_id}/events")
    assert_error(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "GET, HEAD, POST"


async def test_token_for_another_session_gets_403_whether_or_not_session_exists(make_session):
    # EB-12: nothing about a session leaks to a token that has no access to it.
    mine, other = await make_session(), await make_session()
    unknown = "00000000-0000-4000-8000-000000000000"
    read, pub = issue_token(mine, ["read"]), issue_token(mine, ["publish"])
    for target in (other, unknown):
        assert_error(await load(target, read), 403, "forbidden")
        assert_error(await publish(target, {"type": "t"}, pub), 403, "forbidden")


async def test_token_endpoint_reads_a_multipart_body(make_session, make_user):
    user = await make_user("owner")
    session_id = await make_session(owner=user)
    cookie = await login_cookie(user)
    boundary = "XXB"
    part = 'Content-Disposition: form-data; name="scope"\r\n\r\npublish'
    body = f"--{boundary}\r\n{part}\r\n--{boundary}--\r\n"
    headers = {**csrf_headers(cookie), "content-type": f"multipart/form-data; boundary={boundary}"}
    response = await call(
        "POST", f"/session/{session_id}/token", headers=headers, body=body.encode()
    )
    assert response.status == 200, response.body
    assert response.json()["scope"] == "publish"


@pytest.mark.parametrize(
    "body",
    [b'{"scope":"publish"}', b"foo=bar"],  # JSON sent as a form (curl -d), a typo
)
async def test_token_endpoint_refuses_form_fields_it_does_not_know(make_session, make_user, body):
    # It used to ignore them and answer a read token: the caller never learnt of the mistake.
    user = await make_user("owner")
    session_id = await make_session(owner=user)
    headers = {
        **csrf_headers(await login_cookie(user)),
        "content-type": "application/x-www-form-urlencoded",
    }
    response = await call("POST", f"/session/{session_id}/token", headers=headers, body=body)
    assert assert_error(response, 400, "invalid_request")["field"] == body.split(b"=")[0].decode()


async def test_create_session_refuses_unknown_fields(make_user):
    cookie = await login_cookie(await make_user("creator"))
    response = await call(
        "POST", "/session", headers=csrf_headers(cookie), json_body={"title": "x", "bogus": 1}
    )
    assert assert_error(response, 400, "invalid_request")["field"] == "bogus"


async def test_body_that_is_not_utf8_says_so(make_session):
    session_id = await make_session()
    response = await call(
        "POST", f"/session/{session_id}/events",
        headers=bearer(issue_token(session_id, ["publish"])), body=b'{"type":"\xff\xfe"}',
    )  # fmt: skip
    assert "not valid UTF-8" in assert_error(response, 400, "invalid_json")["error"]


async def test_a_form_with_too_many_fields_is_a_json_400(make_session, make_user):
    user = await make_user("owner")
    session_id = await make_session(owner=user)
    headers = {
        **csrf_headers(await login_cookie(user)),
        "content-type": "application/x-www-form-urlencoded",
    }
    body = "&".join(f"f{n}=1" for n in range(1200)).encode()
    response = await call("POST", f"/session/{session_id}/events", headers=headers, body=body)
    assert_error(response, 400, "invalid_request")


async def test_closed_session_snapshot_has_the_open_shape(make_session):
    session_id = await make_session()
    assert (await close(session_id)).status == 200
    snapshot = (await load(session_id)).json()
    assert snapshot["status"] == "closed"
    assert {"ringSize", "earliestAvailableId", "lastEventId", "epoch", "events"} <= set(snapshot)


async def test_database_failure_is_503_json_not_500(make_session, monkeypatch):
    from django.db import OperationalError

    from sessions.backends import get_backend

    async def locked(session_id: str) -> None:
        raise OperationalError("database is locked")

    monkeypatch.setattr(get_backend(), "get_live_session", locked)
    session_id = await make_session()
    assert_error(await load(session_id), 503, "unavailable")


async def test_stream_refuses_a_host_outside_allowed_hosts(make_session):
    # Like Django's own views (get_host), the stream route honours ALLOWED_HOSTS.
    session_id = await make_session()
    headers = {**bearer(issue_token(session_id, ["read"])), "host": "evil.example"}
    response = await call("GET", f"/session/{session_id}/events", headers=headers)
    assert_error(response, 400, "disallowed_host")


async def test_requests_during_close_see_a_closed_session_never_a_new_bus(
    make_session, monkeypatch
):
    # Review finding: a request between bus.close() and the row update rebuilt an open bus.
    import asyncio

    from sessions.backends import get_backend

    session_id = await make_session()
    assert (await publish(session_id, {"type": "t"})).status == 200
    row_written = asyncio.Event()
    release = asyncio.Event()
    backend = get_backend()
    save = backend.save_progress

    async def gated_save(live, **fields):
        row_written.set()
        await release.wait()
        await save(live, **fields)

    monkeypatch.setattr(backend, "save_progress", gated_save)
    closing = asyncio.create_task(close(session_id))
    async with asyncio.timeout(5):
        await row_written.wait()
        monkeypatch.undo()
        response = await publish(session_id, {"type": "t"})
        release.set()
        assert (await closing).status == 200
    assert_error(response, 409, "session_closed")
    assert (await load(session_id)).json()["status"] == "closed"
