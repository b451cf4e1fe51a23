"""Idempotent publish and close (docs/protocol.md, "Idempotent publish"), on either backend.

``make test-redis`` runs these against the Redis backend, where the key is checked and
stored inside the publish script.
"""

from __future__ import annotations

import pytest

from sessions.auth import issue_token
from tests.integration.conftest import assert_error, bearer, call, publish_many
from tests.support import backend

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def _post(sid: str, path: str, key: str | None, body: object = None):
    headers = bearer(issue_token(sid, ["publish"]))
    if key is not None:
        headers["idempotency-key"] = key
    return await call("POST", f"/session/{sid}/{path}", headers=headers, json_body=body)


async def test_one_publish_posted_twice_with_one_key_answers_one_id_and_streams_once(
    make_session, stream_of
):
    sid = await make_session()
    stream = await stream_of(sid)
    first = await _post(sid, "events", "k-1", {"type": "note", "data": 1})
    again = await _post(sid, "events", "k-1", {"type": "note", "data": 1})
    assert first.json() == again.json()
    assert "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"
    await publish_many(sid, 1)  # a later event: everything before it has been delivered
    await stream.read_until(lambda s: len(s.events) == 2)
    assert [(f["id"], f["type"]) for f in stream.frames] == [(1, "note"), (2, "step")]


async def test_the_key_with_another_body_is_422_and_publishes_nothing(make_session):
    sid = await make_session()
    assert (await _post(sid, "events", "k", {"type": "a"})).status == 200
    assert_error(await _post(sid, "events", "k", {"type": "b"}), 422, "idempotency_key_reused")
    assert await publish_many(sid, 1) == [2]


async def test_a_retry_with_the_same_json_in_another_key_order_is_the_same_request(make_session):
    sid = await make_session()
    first = await _post(sid, "events", "k", {"type": "a", "data": {"x": 1, "y": 2}})
    again = await _post(sid, "events", "k", {"data": {"y": 2, "x": 1}, "type": "a"})
    assert (again.status, again.json()) == (200, first.json())
    assert again.headers["idempotent-replayed"] == "true"
    assert await publish_many(sid, 1) == [2]


async def test_different_keys_publish_twice(make_session):
    sid = await make_session()
    ids = [(await _post(sid, "events", k, {"type": "a"})).json()["id"] for k in ("x", "y")]
    assert ids == [1, 2]


@pytest.mark.parametrize("key", ["", "x" * 129, "caf\u00e9".encode().decode("latin-1"), "a\tb"])
async def test_a_bad_key_is_400_naming_the_header(make_session, key, logs):
    sid = await make_session()
    response = await _post(sid, "events", key, {"type": "a"})
    assert assert_error(response, 400, "invalid_idempotency_key")["header"] == "Idempotency-Key"
    assert "Idempotency-Key" in response.json()["error"]
    assert len([r for r in logs.records if "invalid_idempotency_key" in r.getMessage()]) == 1


async def test_two_key_headers_are_400_not_one_joined_key(make_session):
    # Django joins repeated headers with a comma: "k1,k2" must not become a third key.
    sid = await make_session()
    headers = [*bearer(issue_token(sid, ["publish"])).items()]
    headers += [("idempotency-key", "k1"), ("idempotency-key", "k2")]
    response = await call(
        "POST", f"/session/{sid}/events", headers=headers, json_body={"type": "a"}
    )
    assert assert_error(response, 400, "invalid_idempotency_key")["header"] == "Idempotency-Key"
    assert await publish_many(sid, 1) == [1]  # nothing was published


async def test_keys_beyond_max_keys_are_forgotten_oldest_first(make_session, qwenweb_settings):
    qwenweb_settings(IDEMPOTENCY_MAX_KEYS=2)
    sid = await make_session()
    for key in ("a", "b", "c"):
        await _post(sid, "events", key, {"type": "t"})
    replayed = await _post(sid, "events", "c", {"type": "t"})
    forgotten = await _post(sid, "events", "a", {"type": "t"})
    assert (replayed.json()["id"], replayed.headers.get("idempotent-replayed")) == (3, "true")
    assert (forgotten.json()["id"], forgotten.headers.get("idempotent-replayed")) == (4, None)


async def test_a_close_retried_with_its_key_answers_the_first_close(make_session):
    sid = await make_session()
    first = await _post(sid, "close", "c-1")
    again = await _post(sid, "close", "c-1")
    plain = await _post(sid, "close", None)
    assert first.json() == again.json() == {
        "id": sid, "status": "closed", "lastEventId": 1, "alreadyClosed": False,
    }  # fmt: skip
    assert again.headers["idempotent-replayed"] == "true"
    assert plain.json()["alreadyClosed"] is True


async def test_a_publish_retried_after_the_close_answers_its_first_result(make_session):
    sid = await make_session()
    first = await _post(sid, "events", "p", {"type": "a"})
    await _post(sid, "close", None)
    again = await _post(sid, "events", "p", {"type": "a"})
    assert (again.status, again.json()) == (200, first.json())
    assert_error(await _post(sid, "events", "new", {"type": "a"}), 409, "session_closed")


async def test_a_publish_key_reused_for_the_close_is_422(make_session):
    sid = await make_session()
    await _post(sid, "events", "k", {"type": "a"})
    assert_error(await _post(sid, "close", "k"), 422, "idempotency_key_reused")
    assert (await _post(sid, "close", None)).json()["alreadyClosed"] is False


@pytest.mark.skipif(not backend.USING_REDIS, reason="the Redis store's clock (memory: unit)")
async def test_redis_forgets_a_key_after_its_time_to_live(make_session, monkeypatch):
    from sessions.backends import redis_store

    now = [redis_store._now_ms()]
    monkeypatch.setattr(redis_store, "_now_ms", lambda: now[0])
    sid = await make_session()
    await _post(sid, "events", "k", {"type": "a"})
    now[0] += 899_000
    assert (await _post(sid, "events", "k", {"type": "a"})).json()["id"] == 1
    now[0] += 1_000
    assert (await _post(sid, "events", "k", {"type": "a"})).json()["id"] == 2


@pytest.mark.skipif(not backend.USING_REDIS, reason="Redis keys")
async def test_redis_keeps_at_most_max_keys_per_session(make_session, qwenweb_settings):
    qwenweb_settings(IDEMPOTENCY_MAX_KEYS=3)
    sid = await make_session()
    for n in range(5):
        await _post(sid, "events", f"k{n}", {"type": "a"})
    store = backend.as_redis().store()
    idem, times = store.idempotency_keys(sid)
    assert await store.client.hlen(idem) == await store.client.zcard(times) == 3
    assert sorted(await store.client.hkeys(idem)) == [b"k2", b"k3", b"k4"]


@backend.memory_only("the memory backend's key stores")
async def test_a_closed_sessions_keys_leave_the_process_budget_after_their_time_to_live(
    make_session,
):
    memory = backend.as_memory()
    now = [1000.0]
    memory.clock = lambda: now[0]
    sid = await make_session()
    first = await _post(sid, "events", "p", {"type": "a"})
    await _post(sid, "close", "c")
    assert (memory.key_budget.count, (await _post(sid, "events", "p", {"type": "a"})).json()) == (
        2,
        first.json(),
    )
    now[0] += 900  # IDEMPOTENCY_TTL_S
    other = await make_session()
    await _post(other, "close", None)  # (any close, or the housekeeping, drops expired stores)
    assert memory.key_budget.count == 0
    assert_error(await _post(sid, "events", "p", {"type": "a"}), 409, "session_closed")


async def test_two_integers_beyond_64_bits_under_one_key_are_two_requests(make_session):
    # orjson reads both as one float: a digest of its reading answered the second with the
    # first's id, and the second event was lost without a word.
    sid = await make_session()
    headers = {**bearer(issue_token(sid, ["publish"])), "idempotency-key": "k"}
    path = f"/session/{sid}/events"
    first_body = b'{"type":"n","data":1234567890123456789012345}'
    first = await call("POST", path, headers=headers, body=first_body)
    assert first.status == 200
    other = b'{"type":"n","data":1234567890123456789012399}'
    assert_error(
        await call("POST", path, headers=headers, body=other), 422, "idempotency_key_reused"
    )
    again = await call("POST", path, headers=headers, body=first_body)
    assert (again.status, again.json()) == (200, first.json())
    assert again.headers["idempotent-replayed"] == "true"
