"""CORS for the bearer-token API and the stream (docs/protocol.md, "Cross-origin requests").

The stream is a raw ASGI route in front of Django; both go through ``sessions.cors``.
"""

from __future__ import annotations

import pytest

from sessions.auth import issue_token
from tests.integration.conftest import bearer, call, publish, records

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

APP = "https://app.example.com"
OTHER = "https://evil.example.com"


@pytest.fixture
def allow_app(qwenweb_settings):
    qwenweb_settings(CORS_ALLOWED_ORIGINS=[APP])


def _cors(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.startswith("access-control-")}


async def _publish_from(sid: str, origin: str):
    token = issue_token(sid, ["publish"])
    headers = {**bearer(token), "origin": origin}
    return await call("POST", f"/session/{sid}/events", headers=headers, json_body={"type": "a"})


async def test_an_allowed_origin_gets_its_origin_back_and_the_exposed_headers(
    allow_app, make_session
):
    response = await _publish_from(await make_session(), APP)
    assert response.status == 200
    assert response.headers["access-control-allow-origin"] == APP
    exposed = response.headers["access-control-expose-headers"]
    assert "X-Event-Epoch" in exposed
    assert "Idempotent-Replayed" in exposed
    assert "Origin" in response.headers["vary"]
    assert "access-control-allow-credentials" not in response.headers


async def test_a_disallowed_origin_is_served_without_cors_headers_and_one_log_line(
    allow_app, make_session, logs
):
    response = await _publish_from(await make_session(), OTHER)
    assert response.status == 200
    assert _cors(response.headers) == {}
    assert len(records(logs, "cors_refused")) == 1


async def test_by_default_no_other_origin_is_allowed(make_session, logs):
    response = await _publish_from(await make_session(), APP)
    assert _cors(response.headers) == {}
    assert len(records(logs, "cors_refused")) == 1


async def test_a_same_origin_request_needs_no_cors_and_logs_nothing(allow_app, make_session, logs):
    response = await _publish_from(await make_session(), "http://testserver")
    assert _cors(response.headers) == {}
    assert records(logs, "cors_refused") == []


async def test_the_api_answers_a_preflight_with_methods_headers_and_max_age(allow_app):
    headers = {"origin": APP, "access-control-request-method": "POST"}
    response = await call("OPTIONS", "/session", headers=headers)
    assert response.status == 204
    assert response.headers["access-control-allow-origin"] == APP
    assert response.headers["access-control-allow-methods"] == "POST, OPTIONS"
    allowed = response.headers["access-control-allow-headers"]
    for name in ("Authorization", "Content-Type", "Last-Event-ID", "X-Event-Epoch",
                 "Idempotency-Key", "X-Client-Id"):  # fmt: skip
        assert name in allowed
    assert response.headers["access-control-max-age"] == "600"


async def test_a_preflight_from_a_disallowed_origin_gets_no_cors_headers(allow_app, logs):
    headers = {"origin": OTHER, "access-control-request-method": "POST"}
    response = await call("OPTIONS", "/session", headers=headers)
    assert _cors(response.headers) == {}
    assert len(records(logs, "cors_refused")) == 1


async def test_the_events_url_preflight_allows_the_stream_and_publish(allow_app, make_session):
    sid = await make_session()
    headers = {"origin": APP, "access-control-request-method": "GET"}
    response = await call("OPTIONS", f"/session/{sid}/events", headers=headers)
    assert response.status == 204
    assert response.headers["access-control-allow-methods"] == "GET, HEAD, POST, OPTIONS"
    assert "Last-Event-ID" in response.headers["access-control-allow-headers"]


async def test_the_stream_carries_cors_headers_for_an_allowed_origin(
    allow_app, make_session, stream_of
):
    sid = await make_session()
    stream = await stream_of(sid, headers={"origin": APP})
    assert stream.status == 200
    assert stream.headers["access-control-allow-origin"] == APP
    assert "X-Event-Epoch" in stream.headers["access-control-expose-headers"]


async def test_the_stream_refuses_cors_to_another_origin_with_one_log_line(
    allow_app, make_session, stream_of, logs
):
    stream = await stream_of(await make_session(), headers={"origin": OTHER})
    assert stream.status == 200
    assert _cors(stream.headers) == {}
    assert len(records(logs, "cors_refused")) == 1


async def test_a_refused_stream_still_carries_cors_so_the_page_reads_the_error(
    allow_app, open_stream
):
    stream = await open_stream("/session/not-a-session/events", {"origin": APP})
    await stream.read_to_end()
    assert stream.status == 401
    assert stream.headers["access-control-allow-origin"] == APP


async def test_a_plain_publish_still_works_with_cors_configured(allow_app, make_session):
    assert (await publish(await make_session(), {"type": "a"})).status == 200
