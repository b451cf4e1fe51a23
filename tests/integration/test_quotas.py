"""Quotas, holds and idle unload (docs/protocol.md "Quotas" and "Ring limits"; issue 17).

Through the real ASGI application; both backends unless marked memory-only.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from sessions.auth import issue_token
from sessions.backends import rows
from sessions.models import AgentSession
from sessions.process_state import process_state
from tests.integration.conftest import assert_error, bearer, call, csrf_headers, login_cookie
from tests.integration.conftest import publish as publish_event
from tests.support.backend import as_memory, memory_only

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def test_publish_over_the_event_rate_is_429_naming_it_with_retry_after(
    make_session: Any, qwenweb_settings: Any, logs: pytest.LogCaptureFixture
) -> None:
    qwenweb_settings(PUBLISH_RATE_PER_S=0.5)  # a burst of 1 event (2 s of the rate, >= 1)
    sid = await make_session()
    assert (await publish_event(sid, {"type": "a"})).status == 200
    response = await publish_event(sid, {"type": "b"})
    body = assert_error(response, 429, "rate_limited")
    assert body["quota"] == "PUBLISH_RATE_PER_S"
    assert body["limit"] == 0.5
    assert response.headers["retry-after"] == "2"
    assert body["retryAfterS"] == 2
    assert any("code=rate_limited" in r.getMessage() for r in logs.records)
    other = await make_session()  # another session has buckets of its own
    assert (await publish_event(other, {"type": "a"})).status == 200


async def test_a_retry_of_a_publish_that_went_through_is_answered_over_the_quota(
    make_session: Any, qwenweb_settings: Any
) -> None:
    qwenweb_settings(PUBLISH_RATE_PER_S=0.5)  # a burst of 1 event
    sid = await make_session()
    headers = bearer(issue_token(sid, ["publish"])) | {"idempotency-key": "k-1"}
    first = await call("POST", f"/session/{sid}/events", headers=headers, json_body={"type": "a"})
    assert first.status == 200
    retry = await call("POST", f"/session/{sid}/events", headers=headers, json_body={"type": "a"})
    assert (retry.status, retry.json()) == (200, first.json())
    assert retry.headers["idempotent-replayed"] == "true"
    headers["idempotency-key"] = "k-2"  # a new publish is still over the quota
    fresh = await call("POST", f"/session/{sid}/events", headers=headers, json_body={"type": "b"})
    assert_error(fresh, 429, "rate_limited")


async def test_publish_while_draining_is_503_under_the_memory_backend_only(
    make_session: Any,
) -> None:
    from sessions.backends import get_backend

    sid = await make_session()
    backend = get_backend()
    process_state.draining = True
    try:
        response = await publish_event(sid, {"type": "a"})
    finally:
        process_state.draining = False
    if backend.events_outlive_process:  # Redis: the event outlives the draining process
        assert response.status == 200
    else:
        assert_error(response, 503, "draining")
        assert response.headers["retry-after"]
        assert (await publish_event(sid, {"type": "b"})).json()["id"] == 1  # nothing taken


async def test_publish_over_the_byte_rate_is_429_naming_it(
    make_session: Any, qwenweb_settings: Any
) -> None:
    qwenweb_settings(PUBLISH_BYTES_PER_S=1024)  # a burst of 2048 bytes
    sid = await make_session()
    event = {"type": "blob", "data": "x" * 1500}
    assert (await publish_event(sid, event)).status == 200
    body = assert_error(await publish_event(sid, event), 429, "rate_limited")
    assert body["quota"] == "PUBLISH_BYTES_PER_S"


async def _create(headers: dict[str, str], **body: Any) -> Any:
    return await call("POST", "/session", headers=headers, json_body=body)


async def test_open_sessions_per_user_is_a_quota_for_users_not_staff(
    make_user: Any, qwenweb_settings: Any
) -> None:
    qwenweb_settings(MAX_SESSIONS_PER_USER=2)
    alice = csrf_headers(await login_cookie(await make_user("alice")))
    for _ in range(2):
        assert (await _create(alice)).status == 201
    response = await _create(alice)
    body = assert_error(response, 429, "quota_exceeded")
    assert body["quota"] == "MAX_SESSIONS_PER_USER"
    assert body["limit"] == 2
    assert "retry-after" in response.headers
    # Closing one frees a place.
    first = await database_sync_to_async(
        lambda: AgentSession.objects.filter(owner__username="alice").values_list("pk", flat=True)[0]
    )()
    close = await call(
        "POST", f"/session/{first}/close", headers=bearer(issue_token(first, ["publish"]))
    )
    assert close.status == 200
    assert (await _create(alice)).status == 201
    staff = csrf_headers(await login_cookie(await make_user("olga", is_staff=True)))
    for _ in range(3):
        assert (await _create(staff)).status == 201


async def test_ring_size_above_the_user_limit_is_400_for_users_only(
    make_user: Any, qwenweb_settings: Any
) -> None:
    qwenweb_settings(MAX_USER_RING_SIZE=100)
    alice = csrf_headers(await login_cookie(await make_user("alice")))
    body = assert_error(await _create(alice, ringSize=101), 400, "invalid_request")
    assert (body["field"], body["limit"]) == ("ringSize", 100)
    assert (await _create(alice, ringSize=100)).status == 201
    operator_token = bearer(issue_token("*", ["create"], "ops"))
    assert (await _create(operator_token, ringSize=100_000)).status == 201


# -- memory backend: holds and idle unload -----------------------------------------------


async def _hold(session_id: str, holder: str) -> None:
    await database_sync_to_async(AgentSession.objects.filter(pk=session_id).update)(
        held_by=holder, held_until=timezone.now() + timedelta(seconds=60)
    )


@memory_only("rows held by one memory-backend process")
async def test_a_session_held_by_another_live_process_is_503_naming_the_redis_backend(
    make_session: Any,
) -> None:
    sid = await make_session()
    await _hold(sid, f"{socket.gethostname()}:{os.getppid()}:other")  # alive: our parent
    response = await publish_event(sid, {"type": "a"})
    body = assert_error(response, 503, "session_held_elsewhere")
    assert "Redis backend" in body["error"]
    assert response.headers["retry-after"] == "3"


@memory_only("rows held by one memory-backend process")
async def test_a_hold_of_a_dead_process_on_this_host_is_taken_over(make_session: Any) -> None:
    sid = await make_session()
    dead_pid = 2**22 + 12345  # above pid_max's default: no such process
    await _hold(sid, f"{socket.gethostname()}:{dead_pid}:gone")
    assert (await publish_event(sid, {"type": "a"})).status == 200
    row = await database_sync_to_async(AgentSession.objects.get)(pk=sid)
    assert row.held_by == rows.process_holder()


@memory_only("idle unload of the memory backend's buses")
async def test_idle_bus_is_unloaded_and_reloaded_with_a_new_epoch(
    make_session: Any, qwenweb_settings: Any, stream_of: Any
) -> None:
    qwenweb_settings(IDLE_UNLOAD_S=30.0)
    sid = await make_session()
    first = (await publish_event(sid, {"type": "a"})).json()
    backend = as_memory()
    stale = backend.registry.get(sid)
    assert stale is not None
    assert await backend.unload_idle(1000.0) == 0  # first sight: marked
    assert await backend.unload_idle(1029.0) == 0
    assert await backend.unload_idle(1030.0) == 1  # 30 s without publish or subscriber
    assert backend.registry.get(sid) is None
    row = await database_sync_to_async(AgentSession.objects.get)(pk=sid)
    assert row.held_by == ""
    second = (await publish_event(sid, {"type": "b"})).json()
    assert second["epoch"] != first["epoch"]
    # A request that held the unloaded session publishes into the new bus, never the old.
    third = await backend.publish(stale, {"type": "c"})
    assert third is not None
    assert (third.epoch, third.id) == (second["epoch"], second["id"] + 1)
    assert second["id"] > row.event_id_reserved - 100_000  # above every reserved id
    stream = await stream_of(
        sid, headers={"last-event-id": str(first["id"]), "x-event-epoch": first["epoch"]}
    )
    resync = await stream.read_until_type("state_resync_required")
    assert resync["data"]["reason"] == "epoch_reset"


@memory_only("idle unload of the memory backend's buses")
async def test_a_bus_with_a_subscriber_or_a_publish_is_not_idle(
    make_session: Any, qwenweb_settings: Any, stream_of: Any
) -> None:
    qwenweb_settings(IDLE_UNLOAD_S=30.0)
    sid, busy = await make_session(), await make_session()
    await publish_event(sid, {"type": "a"})
    await publish_event(busy, {"type": "a"})
    stream = await stream_of(sid)
    backend = as_memory()
    await backend.unload_idle(1000.0)
    await publish_event(busy, {"type": "b"})
    assert await backend.unload_idle(1040.0) == 0  # busy published; sid has a subscriber
    assert stream.status == 200
    assert backend.registry.get(sid) is not None
    assert backend.registry.get(busy) is not None


async def test_publish_past_the_json_values_quota_is_429_before_the_body_is_parsed(
    make_session: Any, qwenweb_settings: Any
) -> None:
    qwenweb_settings(PUBLISH_VALUES_PER_S=10)  # a burst of 20 values
    sid = await make_session()
    big = {"type": "a", "data": [{} for _ in range(30)]}  # above the burst: passes once
    assert (await publish_event(sid, big)).status == 200
    response = await publish_event(sid, {"type": "b"})
    body = assert_error(response, 429, "rate_limited")
    assert (body["quota"], body["limit"]) == ("PUBLISH_VALUES_PER_S", 10)
    assert int(response.headers["retry-after"]) >= 2


async def test_the_json_values_quota_of_a_user_spans_their_sessions(
    make_session: Any, qwenweb_settings: Any
) -> None:
    qwenweb_settings(PUBLISH_USER_VALUES_PER_S=10)
    first, second = await make_session(), await make_session()
    big = {"type": "a", "data": list(range(30))}
    token = issue_token(first, ["publish"], "alice")
    assert (await publish_event(first, big, token)).status == 200
    other = issue_token(second, ["publish"], "alice")
    body = assert_error(await publish_event(second, {"type": "b"}, other), 429, "rate_limited")
    assert body["quota"] == "PUBLISH_USER_VALUES_PER_S"
    bob = issue_token(second, ["publish"], "bob")
    assert (await publish_event(second, {"type": "b"}, bob)).status == 200


async def test_bodies_refused_for_too_many_values_are_charged_until_429(
    make_session: Any, qwenweb_settings: Any
) -> None:
    qwenweb_settings(PUBLISH_MAX_VALUES=1000, PUBLISH_VALUES_PER_S=1000)  # a burst of 2000
    sid = await make_session()
    huge = {"type": "a", "data": [{} for _ in range(1500)]}
    for _ in range(2):  # each charged PUBLISH_MAX_VALUES
        assert_error(await publish_event(sid, huge), 413, "too_many_values")
    body = assert_error(await publish_event(sid, huge), 429, "rate_limited")
    assert body["quota"] == "PUBLISH_VALUES_PER_S"


async def test_a_large_body_of_few_values_is_charged_by_its_bytes_even_when_refused(
    make_session: Any, qwenweb_settings: Any
) -> None:
    # A burst of 2000 values; one per 1000 bytes: 1,000 values/s over twice 500 kB/s.
    qwenweb_settings(PUBLISH_VALUES_PER_S=1000, PUBLISH_BYTES_PER_S=500_000)
    sid = await make_session()
    bad = {"type": "a", "data": "x" * 600_000, "unknown": 1}  # 600 values by its bytes
    assert_error(await publish_event(sid, bad), 400, "invalid_event")
    assert_error(await publish_event(sid, bad), 400, "invalid_event")
    assert_error(await publish_event(sid, bad), 400, "invalid_event")  # 1,800 spent
    body = assert_error(await publish_event(sid, bad), 429, "rate_limited")
    assert (body["quota"], body["limit"]) == ("PUBLISH_VALUES_PER_S", 1000)
    assert isinstance(body["limit"], int)  # (the rate is a float setting: 1000, not 1000.0)
