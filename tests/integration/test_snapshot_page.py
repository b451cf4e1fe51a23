"""The bounded snapshot: ``GET /session/<id>?limit=N&before=<id>`` (docs/protocol.md,
"GET /session/<id>"), through the real ASGI application."""

from __future__ import annotations

from typing import Any

import pytest

from sessions.auth import issue_token
from sessions.backends.snapshot import CHUNK_BYTES
from tests.integration.conftest import assert_error, bearer, call, load, publish, publish_many

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def _get(sid: str, query: str = "") -> Any:
    headers = bearer(issue_token(sid, ["read"]))
    return await call("GET", f"/session/{sid}", headers=headers, query=query)


async def _page(sid: str, query: str) -> dict[str, Any]:
    response = await _get(sid, query)
    assert response.status == 200, response.body
    return response.json()


def _ids(body: dict[str, Any]) -> list[int]:
    return [e["id"] for e in body["events"] if "id" in e]


async def test_default_limit_answers_the_newest_events_with_has_older(
    make_session, qwenweb_settings
):
    qwenweb_settings(SNAPSHOT_LIMIT=5)
    sid = await make_session()
    await publish_many(sid, 12)
    body = (await load(sid)).json()
    assert _ids(body) == [8, 9, 10, 11, 12]
    assert body["hasOlder"] is True
    assert body["firstEventId"] == 8
    assert body["lastEventId"] == 12
    assert body["earliestAvailableId"] == 1
    assert isinstance(body["epoch"], str)
    assert body["events"][0]["type"] == "step", "no history_truncated while older events exist"


async def test_limit_and_before_page_back_to_the_start_without_gap_or_overlap(make_session):
    sid = await make_session()
    await publish_many(sid, 23)
    seen: list[int] = []
    query = "limit=10"
    while True:
        body = await _page(sid, query)
        seen[:0] = _ids(body)
        if not body["hasOlder"]:
            break
        query = f"limit=10&before={body['firstEventId']}"
    assert seen == list(range(1, 24))
    assert body["firstEventId"] == 1


async def test_paging_past_a_truncated_ring_ends_with_history_truncated(make_session):
    sid = await make_session(ring_size=6)
    await publish_many(sid, 10)  # the ring keeps 5..10
    body = await _page(sid, "limit=4&before=9")
    assert _ids(body) == [5, 6, 7, 8]
    assert body["hasOlder"] is False
    truncated = {"v": 1, "type": "history_truncated", "data": {"earliestAvailableId": 5}}
    assert body["events"][0] == truncated
    below = await _page(sid, "before=3")
    assert _ids(below) == []
    assert below["hasOlder"] is False
    assert below["firstEventId"] is None


async def test_the_byte_cap_bounds_the_page_and_always_keeps_the_newest(
    make_session, qwenweb_settings
):
    qwenweb_settings(SNAPSHOT_MAX_BYTES=64 * 1024, PUBLISH_MAX_BODY_BYTES=256 * 1024)
    sid = await make_session()
    for n in range(6):
        response = await publish(sid, {"type": "big", "data": str(n) * 20_000})
        assert response.status == 200
    body = await _page(sid, "limit=100")
    assert _ids(body) == [4, 5, 6], "three of about 20 kB fit in 64 KiB"
    assert body["hasOlder"] is True
    huge = await publish(sid, {"type": "big", "data": "x" * 100_000})
    assert huge.status == 200
    assert _ids(await _page(sid, "limit=100")) == [7], "the newest event alone passes the cap"


async def test_the_body_is_streamed_in_pieces_with_the_ring_bytes(make_session):
    sid = await make_session()
    await publish_many(sid, 3)
    for n in range(2):
        assert (await publish(sid, {"type": "big", "data": "y" * (CHUNK_BYTES + n)})).status == 200
    response = await _get(sid)
    assert response.status == 200
    assert response.headers.get("content-type") == "application/json"
    assert "content-length" not in response.headers, "streamed, not built whole first"
    assert _ids(response.json()) == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("query", "field"),
    [("limit=0", "limit"), ("limit=5001", "limit"), ("limit=ten", "limit"), ("limit=-1", "limit"),
     ("limit=", "limit"), ("before=0", "before"), ("before=1.5", "before"),
     ("before=99999999999999999999", "before"), ("limit=%EF%BC%91", "limit"),
     ("limit=1&limit=2", "limit"), ("before=5&before=5", "before")],
)  # fmt: skip
async def test_bad_limit_or_before_is_400_naming_the_field(make_session, query, field):
    sid = await make_session()
    response = await _get(sid, query)
    body = assert_error(response, 400, "invalid_request")
    assert body["field"] == field


# -- ?compact=1 (docs/protocol.md, "Compacted history") -----------------------------------


async def _tokens(sid: str, words: list[str]) -> None:
    for word in words:
        content = {"type": "text", "text": word}
        data = {"sessionUpdate": "agent_message_chunk", "content": content}
        assert (await publish(sid, {"type": "session_update", "data": data})).status == 200


async def test_compact_merges_token_runs_and_keeps_the_page_head(make_session):
    sid = await make_session()
    await _tokens(sid, ["one ", "two "])
    await publish(sid, {"type": "turn_complete", "data": {}})
    await _tokens(sid, ["three ", "four ", "five"])
    plain = await _page(sid, "limit=5")
    body = await _page(sid, "limit=5&compact=1")
    assert {k: v for k, v in body.items() if k != "events"} == {
        k: v for k, v in plain.items() if k != "events"
    }
    entries = [(e["type"], e.get("id"), e.get("firstId"), e.get("lastId")) for e in body["events"]]
    assert entries == [
        ("session_update", 2, None, None),  # a run of one stays the event (limit cut its run)
        ("turn_complete", 3, None, None),
        ("compacted", None, 4, 6),
    ]
    assert body["events"][-1]["data"]["content"]["text"] == "three four five"


async def test_compact_is_a_fraction_of_the_plain_answer_at_the_same_limit(make_session):
    sid = await make_session()
    await _tokens(sid, [f"w{n} " for n in range(200)])
    plain = await _get(sid, "limit=200")
    compact = await _get(sid, "limit=200&compact=1")
    assert len(compact.body) <= 0.15 * len(plain.body)
    [entry] = compact.json()["events"]
    assert (entry["firstId"], entry["lastId"], entry["count"]) == (1, 200, 200)


@pytest.mark.parametrize("query", ["compact=yes", "compact=1&compact=1", "compact="])
async def test_bad_compact_is_400_naming_the_field(make_session, query):
    sid = await make_session()
    assert assert_error(await _get(sid, query), 400, "invalid_request")["field"] == "compact"
