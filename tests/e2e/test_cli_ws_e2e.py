"""``manage.py tail_session --transport ws`` against real server processes on 127.0.0.1.

The same command over SSE is the reference: the WebSocket prints the same lines and
resumes the same way (issue 27; docs/protocol.md, "The WebSocket transport").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.manage import manage, manage_process
from tests.support.server import (
    RemoteSession,
    ServerProcess,
    request_json,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(150),  # a server start and two manage.py processes, on a loaded machine
]


@pytest.fixture(params=["serve", "daphne"])
def any_server(
    request: pytest.FixtureRequest, serve_server: ServerProcess, daphne_server: ServerProcess
) -> ServerProcess:
    return serve_server if request.param == "serve" else daphne_server


def test_tail_over_ws_prints_what_sse_prints_for_the_same_resume(
    any_server: ServerProcess, e2e_database: Path
) -> None:
    # EB-7 replay after the cursor, then replay_complete; byte for byte the SSE lines.
    session = RemoteSession.create(any_server.base_url)
    for n in range(10):
        session.publish("note", {"n": n, "text": "wörld 🙂"})
    common = ("--url", any_server.base_url, "--token", session.read_token)
    args = ("tail_session", session.id, *common, "--last-event-id", "3", "--max-events", "8")
    over_sse = manage(e2e_database, *args, "--transport", "sse")
    over_ws = manage(e2e_database, *args, "--transport", "ws")
    assert over_sse.returncode == 0, over_sse.stderr
    assert over_ws.returncode == 0, over_ws.stderr
    lines = over_ws.stdout.splitlines()
    assert [int(line.split()[0]) for line in lines[:7]] == list(range(4, 11))
    assert lines[7].split()[:2] == ["-", "replay_complete"]
    # Synthetic frames carry the time they were written: compare them without it.
    assert lines[:7] == over_sse.stdout.splitlines()[:7]


def test_tail_over_ws_follows_until_the_session_closes(
    any_server: ServerProcess, e2e_database: Path
) -> None:
    # EB-15: after session_closed the resubscribe is refused with session_closed: exit 0.
    session = RemoteSession.create(any_server.base_url)
    for n in range(3):
        session.publish("note", {"n": n})
    with manage_process(
        e2e_database, "tail_session", session.id, "--url", any_server.base_url,
        "--token", session.read_token, "--last-event-id", "0", "--transport", "ws",
    ) as follower:  # fmt: skip
        assert follower.stdout is not None
        head = [follower.stdout.readline() for _ in range(4)]
        assert [line.split()[1] for line in head] == ["note", "note", "note", "replay_complete"]
        live = session.publish("note", {"n": "live"})
        assert follower.stdout.readline().split()[0] == str(live)
        status, _ = request_json(
            "POST", f"{any_server.base_url}/session/{session.id}/close", token=session.publish_token
        )
        assert status == 200
        out, err = follower.communicate(timeout=30)
    assert follower.returncode == 0, err
    assert "session_closed" in out
    assert "session ended (session_closed)" in err
