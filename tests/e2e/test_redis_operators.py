"""The admin across server processes: cluster counts and actions that reach all.

Two (or three) ``python -m qwenweb.serve`` processes with ``QWENWEB_BACKEND=redis``, one
SQLite file with a staff user, and a Redis key prefix of their own at 127.0.0.1:6379 (its
keys are deleted at the end; the shared Redis is never flushed). The admin is driven over
HTTP as a browser would (login form, CSRF token, action form). Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sessions.wire import ServerSentEvent
from tests.support.server import (
    RawSSEClient,
    RemoteSession,
    ServerProcess,
    open_stream,
    redis_cluster,
    wait_for,
)
from tests.support.staff import StaffClient

pytestmark = [pytest.mark.e2e, pytest.mark.own_backend, pytest.mark.asyncio]

PROCESS_TTL_S = 2.0
WAIT_S = 10.0
CHANGELIST = "/admin/agent_sessions/agentsession/"

Start = Callable[[str], ServerProcess]


@pytest.fixture
def start(staff_database: Path, tmp_path: Path) -> Iterator[Start]:
    """``start(name)``: a server process in this test's cluster (Redis backend, own prefix)."""
    with redis_cluster(
        staff_database, tmp_path, QWENWEB_PROCESS_TTL_S=str(PROCESS_TTL_S)
    ) as cluster:
        yield cluster


def cell(page: str, session_id: str, field: str) -> str:
    """The text of column ``field`` in the changelist row of ``session_id``."""
    row = next(r for r in page.split("<tr") if f'value="{session_id}"' in r)
    match = re.search(rf'<td class="field-{field}[^"]*">(.*?)</td>', row, re.S)
    assert match, f"no column {field} in {row}"
    return re.sub(r"<[^>]+>", "", match.group(1)).strip()


def messages(page: str) -> list[str]:
    """The admin's messages on ``page`` (success, warning, error), as text."""
    listed = re.search(r'<ul class="messagelist">(.*?)</ul>', page, re.S)
    items = re.findall(r"<li[^>]*>(.*?)</li>", listed.group(1), re.S) if listed else []
    return [re.sub(r"<[^>]+>", "", item).strip() for item in items]


async def subscribers_shown(staff: StaffClient, session_id: str, expected: str) -> str:
    """Wait (bounded) until the changelist shows ``expected`` subscribers; return the page."""
    pages: list[str] = []

    def shown() -> bool:
        pages.append(staff.get_text(CHANGELIST))
        return cell(pages[-1], session_id, "subscribers") == expected

    assert await asyncio.to_thread(wait_for, shown, WAIT_S, 0.1), cell(
        pages[-1], session_id, "subscribers"
    )
    return pages[-1]


def act(staff: StaffClient, action: str, session_id: str) -> list[str]:
    """Run an admin action on one session; return the messages of the page it ends on."""
    page = staff.post_form(
        CHANGELIST, {"action": action, "_selected_action": [session_id], "index": "0"}
    )
    return messages(page)


def last_frame(stream: RawSSEClient) -> tuple[str, dict[str, object]]:
    event: ServerSentEvent = stream.events[-1]
    return event.type, json.loads(event.data)


async def test_changelist_on_any_process_shows_the_subscribers_of_all(start: Start) -> None:
    """A subscriber on A, one on B: the admin on A, and on C (nothing loaded), shows 2."""
    a, b = start("a"), start("b")
    session = RemoteSession.create(a.base_url)
    on_a = await open_stream(a.port, session.events_path, session.read_token)
    on_b = await open_stream(b.port, session.events_path, session.read_token)
    try:
        page = await subscribers_shown(StaffClient(a.base_url).login(), session.id, "2")
        assert cell(page, session.id, "source") == "live"
        staff_c = StaffClient(start("c").base_url).login()
        await subscribers_shown(staff_c, session.id, "2")
        detail = staff_c.get_text(f"{CHANGELIST}{session.id}/change/")
        assert "<th>subscribers</th><td>2</td>" in detail
        assert "sum over every live server process" in detail
    finally:
        on_a.close()
        on_b.close()


async def test_disconnect_in_the_admin_on_b_ends_the_stream_on_a_too(start: Start) -> None:
    a, b = start("a"), start("b")
    session = RemoteSession.create(a.base_url)
    on_a = await open_stream(a.port, session.events_path, session.read_token)
    on_b = await open_stream(b.port, session.events_path, session.read_token)
    try:
        staff = StaffClient(b.base_url).login()
        await subscribers_shown(staff, session.id, "2")  # A runs its store (and listener)
        shown = act(staff, "disconnect_all_subscribers", session.id)
        assert shown == [
            "Disconnected 1 subscriber(s) in this process; told 1 other server process(es) "
            "to disconnect theirs."
        ]
        for stream in (on_a, on_b):
            await stream.read_to_end(timeout_s=WAIT_S)
            kind, frame = last_frame(stream)
            assert (kind, frame["data"]) == (
                "stream_error",
                {"error": "disconnected by the server", "code": "server_disconnect",
                 "reason": "operator operator"},
            )  # fmt: skip
    finally:
        on_a.close()
        on_b.close()


async def test_disconnect_from_a_process_that_loaded_nothing_reaches_every_process(
    start: Start,
) -> None:
    a, b = start("a"), start("b")
    session = RemoteSession.create(a.base_url)
    on_a = await open_stream(a.port, session.events_path, session.read_token)
    on_b = await open_stream(b.port, session.events_path, session.read_token)
    try:
        staff = StaffClient(start("c").base_url).login()
        await subscribers_shown(staff, session.id, "2")
        shown = act(staff, "disconnect_all_subscribers", session.id)
        assert shown == [
            "Disconnected 0 subscriber(s) in this process; told 2 other server process(es) "
            "to disconnect theirs."
        ]
        for stream in (on_a, on_b):
            await stream.read_to_end(timeout_s=WAIT_S)
            assert last_frame(stream)[1]["data"]["code"] == "server_disconnect"  # type: ignore[index]
        await subscribers_shown(staff, session.id, "0")
    finally:
        on_a.close()
        on_b.close()


async def test_close_in_the_admin_on_a_ends_the_stream_on_b(start: Start) -> None:
    """A has loaded nothing (its admin adopts the request's loop); B's stream gets
    ``session_closed``; both processes answer 204 afterwards."""
    a, b = start("a"), start("b")
    session = RemoteSession.create(b.base_url)
    on_b = await open_stream(b.port, session.events_path, session.read_token)
    try:
        session.publish("step")
        staff = StaffClient(a.base_url).login()
        await subscribers_shown(staff, session.id, "1")
        assert act(staff, "close_sessions", session.id) == [
            "Closed 1 session(s) in every server process."
        ]
        await on_b.read_to_end(timeout_s=WAIT_S)
        assert [e.type for e in on_b.events] == ["step", "session_closed"]
        assert last_frame(on_b)[1]["data"] == {"reason": "operator", "closedBy": "operator"}
    finally:
        on_b.close()
    for server in (a, b):
        again = await open_stream(server.port, session.events_path, session.read_token)
        again.close()
        assert again.status == 204
    assert cell(staff.get_text(CHANGELIST), session.id, "status") == "Closed"
