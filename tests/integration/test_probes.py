"""``/healthz``, ``/readyz``, ``/metrics`` through the ASGI application (sessions.ops.probes)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.testing import ApplicationCommunicator

from qwenweb.asgi import application
from sessions.hooks import hooks
from sessions.ops.metrics import metrics
from sessions.process_state import process_state
from tests.integration.conftest import (
    WAIT_S,
    Response,
    _header_dict,
    assert_error,
    call,
    http_scope,
    publish,
    records,
)

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

TOKEN = "metrics-token-0123456789"


@pytest.fixture
def counting() -> Iterator[None]:
    """The process's metrics listener, connected for this test."""
    metrics.forget()
    hooks.connect(metrics)
    try:
        yield
    finally:
        hooks.disconnect(metrics)


async def probe(
    path: str,
    *,
    host: str = "10.0.3.7:8000",
    client: str = "127.0.0.1",
    headers: dict[str, str] | None = None,
    method: str = "GET",
) -> Response:
    """One request with ``Host: host`` from ``client`` (a probe sends an IP as the host)."""
    scope: dict[str, Any] = http_scope(method, path)
    scope["headers"] = [(b"host", host.encode())] + [
        (name.encode(), value.encode()) for name, value in (headers or {}).items()
    ]
    scope["client"] = (client, 40000)
    communicator = ApplicationCommunicator(application, scope)
    await communicator.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await communicator.receive_output(WAIT_S)
    body = await communicator.receive_output(WAIT_S)
    await communicator.wait(WAIT_S)
    return Response(start["status"], _header_dict(start["headers"]), body.get("body", b""))


def sample(text: str, name: str, labels: str = "") -> float:
    """The value of one sample of the exposition ``text`` (0 when absent)."""
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def test_healthz_answers_200_whatever_the_host():
    response = await probe("/healthz", host="10.0.3.7:8000")
    assert response.status == 200
    assert response.json() == {"status": "ok"}


async def test_readyz_answers_200_with_each_check():
    response = await probe("/readyz")
    assert response.status == 200, response.body
    assert response.json() == {"status": "ready", "checks": {"database": "ok", "backend": "ok"}}


async def test_readyz_answers_503_draining_while_healthz_stays_200():
    process_state.draining = True
    assert_error(await probe("/readyz"), 503, "draining")
    assert (await probe("/healthz")).status == 200


async def test_other_urls_still_refuse_a_host_outside_allowed_hosts(logs):
    response = await probe("/capabilities", host="evil.example")
    assert response.status == 400
    assert (await probe("/capabilities", host="testserver")).status == 200


async def test_probe_with_another_method_is_a_json_405():
    response = await probe("/healthz", method="POST")
    assert_error(response, 405, "method_not_allowed")
    assert response.headers["allow"] == "GET, HEAD"


async def test_metrics_from_loopback_answer_prometheus_text():
    response = await probe("/metrics")
    assert response.status == 200
    assert response.headers["content-type"].startswith("text/plain")
    for family in (
        "qwenweb_evictions_total",
        "qwenweb_slow_client_warnings_total",
        "qwenweb_resyncs_total",
        "qwenweb_delivery_latency_seconds",
    ):
        assert f"# TYPE {family.removesuffix('_total')}" in response.body.decode()


async def test_metrics_from_another_address_are_403(logs):
    response = await probe("/metrics", client="10.0.0.9")
    assert_error(response, 403, "forbidden")
    assert len(records(logs, "probe_rejected")) == 1


@pytest.mark.parametrize(
    "header", ["x-forwarded-for", "forwarded", "via", "cf-connecting-ip", "true-client-ip"]
)
async def test_metrics_through_a_proxy_are_403_even_from_loopback(header):
    value = "for=127.0.0.1" if header == "forwarded" else "127.0.0.1"
    response = await probe("/metrics", headers={header: value})
    assert_error(response, 403, "forbidden")


async def test_metrics_with_the_token_answer_from_anywhere(qwenweb_settings):
    qwenweb_settings(METRICS_TOKEN=TOKEN)
    headers = {"authorization": f"Bearer {TOKEN}", "x-forwarded-for": "203.0.113.9"}
    assert (await probe("/metrics", client="10.0.0.9", headers=headers)).status == 200


async def test_metrics_with_a_wrong_token_are_401(qwenweb_settings):
    qwenweb_settings(METRICS_TOKEN=TOKEN)
    response = await probe("/metrics", headers={"authorization": "Bearer wrong-token-000000000"})
    assert_error(response, 401, "invalid_token")


async def test_metrics_off_are_404(qwenweb_settings):
    qwenweb_settings(METRICS=False)
    assert_error(await probe("/metrics"), 404, "not_found")


@pytest.mark.usefixtures("counting")
async def test_subscribers_count_an_open_stream_and_publishes_are_counted(make_session, stream_of):
    before = (await probe("/metrics")).body.decode()
    sid = await make_session()
    stream = await stream_of(sid)
    for _ in range(3):
        assert (await publish(sid, {"type": "note", "data": 1})).status == 200
    await stream.read_until(lambda s: len(s.types) >= 3)
    during = (await probe("/metrics")).body.decode()
    assert sample(during, "qwenweb_subscribers") == sample(before, "qwenweb_subscribers") + 1
    published = sample(during, "qwenweb_events_published_total")
    assert published == sample(before, "qwenweb_events_published_total") + 3
    frames = sample(during, "qwenweb_frames_sent_total")
    assert frames >= sample(before, "qwenweb_frames_sent_total") + 3
    latencies = sample(during, "qwenweb_delivery_latency_seconds_count")
    assert latencies == sample(before, "qwenweb_delivery_latency_seconds_count") + 3
    await stream.disconnect()
    after = (await probe("/metrics")).body.decode()
    assert sample(after, "qwenweb_subscribers") == sample(before, "qwenweb_subscribers")


@pytest.mark.usefixtures("counting")
async def test_rejected_requests_are_counted_by_code():
    before = (await probe("/metrics")).body.decode()
    await call("GET", "/session/not-a-session/events")
    after = (await probe("/metrics")).body.decode()
    name, labels = "qwenweb_rejected_requests_total", '{code="unauthorized"}'
    assert sample(after, name, labels) == sample(before, name, labels) + 1


@pytest.mark.usefixtures("counting")
async def test_every_json_error_answer_is_counted_once_405s_and_view_errors_too():
    # A 405 of the API is answered before the view runs; a 400 by the view (ApiError):
    # both go through api_error_response, which counts (once: no second count in _fail).
    name = "qwenweb_rejected_requests_total"
    before = (await probe("/metrics")).body.decode()
    assert (await call("PUT", "/session")).status == 405
    assert (await call("POST", "/session", json_body={"title": 5})).status in (400, 401)
    after = (await probe("/metrics")).body.decode()
    labels = '{code="method_not_allowed"}'
    assert sample(after, name, labels) == sample(before, name, labels) + 1
    total = sum(
        sample(after, name, f'{{code="{code}"}}') - sample(before, name, f'{{code="{code}"}}')
        for code in ("method_not_allowed", "invalid_request", "unauthorized", "invalid_field")
    )
    assert total == 2
