"""``make demo`` twice in a row: the second run continues the same session with its history
(issue 24): its snapshot has the first run's transcript, and a client resuming from a
cursor of the first run gets the events it missed, then ``replay_complete``, no resync."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.server import (
    REPO,
    free_port,
    get_json,
    open_stream,
    server_env,
    wait_for,
)

pytestmark = [pytest.mark.own_backend, pytest.mark.asyncio, pytest.mark.timeout(240)]

WAIT_S = 60.0


class Demo:
    """``manage.py demo`` in a process group of its own, its output collected."""

    def __init__(self, env: dict[str, str], port: int) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "demo", "--port", str(port), "--tokens-per-s", "200"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.output = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in iter(self.process.stdout.readline, b""):
            self.output += line.decode(errors="replace")

    def field(self, name: str) -> str:
        assert wait_for(lambda: re.search(rf"^  {name} +(\S+)$", self.output, re.M), WAIT_S), (
            self.output[-2000:]
        )
        found = re.search(rf"^  {name} +(\S+)$", self.output, re.M)
        assert found is not None
        return found.group(1)

    def stop(self) -> None:
        """SIGTERM, as Ctrl-C: the demo stops its server (which drains and exits)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(60)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
            self._reader.join(10)
            if self.process.stdout is not None:
                self.process.stdout.close()


async def test_make_demo_twice_continues_the_session_with_its_history(tmp_path: Path) -> None:
    env = server_env(tmp_path / "db.sqlite3")
    env.pop("QWENWEB_EVENT_LOG_PATH")  # the default: beside the database
    env.pop("QWENWEB_BACKEND", None)  # the default backend
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    first = Demo(env, port)
    try:
        session_id, token = first.field("session"), first.field("read token")
        snapshot_url = f"{base}/session/{session_id}"
        assert wait_for(lambda: _last_id(snapshot_url, token) >= 10, WAIT_S), first.output[-2000:]
        epoch = get_json(snapshot_url, token)["epoch"]
    finally:
        first.stop()
    before = get_json_after_restart_ids(tmp_path, session_id)
    second = Demo(env, port)
    try:
        assert second.field("session") == session_id, second.output[-2000:]
        token = second.field("read token")
        assert wait_for(lambda: _last_id(snapshot_url, token) > before + 5, WAIT_S)
        page = get_json(f"{snapshot_url}?limit=5000", token)
        ids = [event["id"] for event in page["events"]]
        assert ids[0] == 1  # the first run's transcript
        assert ids == list(range(1, len(ids) + 1))
        assert page["epoch"] == epoch
        client = await open_stream(
            port,
            f"/session/{session_id}/events",
            token,
            [("Last-Event-ID", "5"), ("X-Event-Epoch", epoch)],
        )
        events = await client.read_until(lambda got: any(e.type == "replay_complete" for e in got))
        await client.aclose()
    finally:
        second.stop()
    types = [e.type for e in events]
    assert "state_resync_required" not in types
    replayed = [json.loads(e.data)["id"] for e in events if e.type != "replay_complete"]
    assert replayed[0] == 6
    assert replayed[-1] > before  # the missed events of the first run and the second's


async def test_a_second_demo_on_a_held_log_is_refused_before_it_makes_a_session(
    tmp_path: Path,
) -> None:
    """A second ``make demo`` on another port while the first runs: the durable log is
    held, so it stops with that one line and makes no session; the next demo after the
    first stopped still continues the first one's session (it did not before: the refused
    run's new, empty session was the newest open one)."""
    env = server_env(tmp_path / "db.sqlite3")
    env.pop("QWENWEB_EVENT_LOG_PATH")  # the default: beside the database
    env.pop("QWENWEB_BACKEND", None)  # the default backend
    port = free_port()
    first = Demo(env, port)
    try:
        session_id, token = first.field("session"), first.field("read token")
        snapshot_url = f"http://127.0.0.1:{port}/session/{session_id}"
        # Serving, and its agent published through the log: the log is held.
        assert wait_for(lambda: _last_id(snapshot_url, token) >= 1, WAIT_S), first.output[-2000:]
        second = Demo(env, free_port())
        try:
            assert second.process.wait(WAIT_S) != 0, second.output[-2000:]
        finally:
            second.stop()
        assert "in use by another process" in second.output, second.output[-2000:]
        assert "read token" not in second.output, second.output[-2000:]
        assert _demo_sessions(tmp_path) == [session_id]
    finally:
        first.stop()
    third = Demo(env, port)
    try:
        assert third.field("session") == session_id, third.output[-2000:]
    finally:
        third.stop()


def _demo_sessions(tmp_path: Path) -> list[str]:
    """The ids of the sessions in the test's database (its SQLite file, read directly)."""
    import sqlite3
    import uuid

    with sqlite3.connect(tmp_path / "db.sqlite3") as conn:
        rows = conn.execute("SELECT id FROM agent_sessions_agentsession").fetchall()
    return [str(uuid.UUID(row[0])) for row in rows]  # (SQLite keeps a UUID as 32 hex digits)


def _last_id(url: str, token: str) -> int:
    try:
        return int(get_json(url, token)["lastEventId"] or 0)
    except OSError:
        return 0


def get_json_after_restart_ids(tmp_path: Path, session_id: str) -> int:
    """The last id the first run's log committed for the session (read from its file)."""
    import sqlite3

    with sqlite3.connect(tmp_path / "db.sqlite3.events.sqlite3") as conn:
        found = conn.execute(
            "SELECT max(id) FROM events WHERE session_id = ?", (session_id,)
        ).fetchone()
    return int(found[0])
