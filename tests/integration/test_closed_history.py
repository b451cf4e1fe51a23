"""Closed sessions stay readable (issue 25): ``GET /session/<id>`` of a closed session
answers the history the backend still holds, within ``CLOSED_HISTORY_S`` (docs/protocol.md,
"GET /session/<id>", closed session). Runs with either backend (``make test-redis``)."""

from __future__ import annotations

from typing import Any

import pytest

from sessions.auth import issue_token
from tests.integration.conftest import bearer, call, close, load, publish_many

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def _ids(body: dict[str, Any]) -> list[int]:
    return [e["id"] for e in body["events"] if "id" in e]


async def test_a_closed_session_answers_its_history_with_the_end_state(make_session):
    sid = await make_session(title="reviewed later")
    await publish_many(sid, 2)
    assert (await close(sid)).status == 200
    body = (await load(sid)).json()
    assert body["status"] == "closed"
    assert body["closedAt"]
    assert _ids(body) == [1, 2, 3]
    assert body["events"][-1]["type"] == "session_closed"
    assert (body["lastEventId"], body["firstEventId"], body["hasOlder"]) == (3, 1, False)
    assert (body["earliestAvailableId"], body["subscriberCount"]) == (1, 0)


async def test_a_closed_sessions_history_pages_back_with_before(make_session):
    sid = await make_session()
    await publish_many(sid, 4)
    await close(sid)
    headers = bearer(issue_token(sid, ["read"]))
    response = await call("GET", f"/session/{sid}", headers=headers, query="before=5&limit=2")
    body = response.json()
    assert _ids(body) == [3, 4]
    assert (body["firstEventId"], body["hasOlder"]) == (3, True)


async def test_without_retention_a_closed_session_answers_no_events(make_session, qwenweb_settings):
    qwenweb_settings(CLOSED_HISTORY_S=0)
    sid = await make_session()
    await publish_many(sid, 2)
    await close(sid)
    body = (await load(sid)).json()
    assert body["status"] == "closed"
    assert (body["events"], body["epoch"], body["earliestAvailableId"]) == ([], None, None)
    assert body["lastEventId"] == 3
