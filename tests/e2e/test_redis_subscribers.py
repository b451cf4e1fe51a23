"""Live subscribers across server processes: list every process's, disconnect one elsewhere.

Two ``python -m qwenweb.serve`` processes with ``QWENWEB_BACKEND=redis`` on one SQLite
file with a staff user, under a Redis key prefix of their own (deleted at the end; the
shared Redis is never flushed). A raw-socket reader on each; the staff user works through
process A's JSON API over HTTP, as the session page does (login cookie, CSRF header).
Every wait is bounded. This is issue 15's first "Done when".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import (
    RawSSEClient,
    RemoteSession,
    ServerProcess,
    open_stream,
    redis_cluster,
    wait_for,
)
from tests.support.staff import USERNAME, StaffClient

pytestmark = [pytest.mark.e2e, pytest.mark.own_backend, pytest.mark.asyncio]

PROCESS_TTL_S = 2.0
"""Each process reports its subscribers every PROCESS_TTL_S / 4 = 0.5 s."""
WAIT_S = 10.0

Start = Callable[[str], ServerProcess]


@pytest.fixture
def start(staff_database: Path, tmp_path: Path) -> Iterator[Start]:
    """``start(name)``: a server process of this test's cluster (Redis, a prefix of its own)."""
    with redis_cluster(
        staff_database, tmp_path,
        QWENWEB_PROCESS_TTL_S=str(PROCESS_TTL_S), QWENWEB_RECORDS_FLUSH_INTERVAL_S="0.2",
    ) as cluster:  # fmt: skip
        yield cluster


async def poll(check: Callable[[], Any], what: str) -> Any:
    """Call ``check()`` (blocking HTTP) until it returns something truthy; bounded."""
    found: list[Any] = []

    def done() -> bool:
        found.append(check())
        return bool(found[-1])

    assert await asyncio.to_thread(wait_for, done, WAIT_S, 0.1), f"{what}: last {found[-1:]}"
    return found[-1]


def rows_with_client_ids(staff: StaffClient, session_id: str, *ids: str) -> list[Any] | None:
    """The subscriber rows once every ``X-Client-Id`` in ``ids`` is listed, else None."""
    status, body = staff.call_json("GET", f"/session/{session_id}/subscribers", csrf=False)
    assert status == 200, body
    rows: list[Any] = body["subscribers"]
    return rows if {row["clientId"] for row in rows} >= set(ids) else None


def ended_record(staff: StaffClient, session_id: str, connection_id: str) -> Any:
    """The connection record ``connection_id`` once its end is written (any process), else None."""
    connections = staff.get_json(f"/ops/sessions/{session_id}/records")["connections"]
    return next((c for c in connections if c["id"] == connection_id and c["endReason"]), None)


async def reader(server: ServerProcess, session: RemoteSession, client_id: str) -> RawSSEClient:
    stream = await open_stream(
        server.port, session.events_path, session.read_token, [("X-Client-Id", client_id)]
    )
    await stream.read_until(lambda _: stream.body.startswith(b"retry:"), timeout_s=WAIT_S)
    return stream


async def test_staff_on_a_list_both_processes_readers_and_disconnect_the_one_on_b(
    start: Start,
) -> None:
    a, b = start("a"), start("b")
    session = RemoteSession.create(a.base_url)
    on_a = await reader(a, session, "reader-on-a")
    on_b = await reader(b, session, "reader-on-b")
    try:
        staff = StaffClient(a.base_url).login()
        rows = await poll(
            lambda: rows_with_client_ids(staff, session.id, "reader-on-a", "reader-on-b"),
            "both processes' subscribers listed on A",
        )
        by_client = {row["clientId"]: row for row in rows}
        assert by_client["reader-on-a"]["process"] != by_client["reader-on-b"]["process"]
        target = by_client["reader-on-b"]
        path = f"/session/{session.id}/subscribers/{target['id']}/disconnect"
        status, answer = staff.call_json("POST", path)
        assert (status, answer["relayed"], answer["by"]) == (200, True, USERNAME), answer
        await on_b.read_to_end(timeout_s=WAIT_S)
        assert json.loads(on_b.events[-1].data)["data"] == {
            "error": "disconnected by the server",
            "code": "server_disconnect",
            "reason": "operator_disconnect",
        }
        published = session.publish("after", {"n": 1})
        await on_a.read_until(
            lambda events: any(json.loads(e.data).get("id") == published for e in events),
            timeout_s=WAIT_S,
        )
        assert not on_a.ended
        record = await poll(
            lambda: ended_record(staff, session.id, target["id"]), "the reader's record on B"
        )
        assert (record["endReason"], record["endDetail"]) == (
            "operator_disconnect",
            f"by {USERNAME}",
        )
    finally:
        on_a.close()
        on_b.close()
