"""A durable log the server cannot use stops it before it serves, with one line naming the
file and a non-zero exit (issue 24, "Faults"; docs/protocol.md, "Durable history"):
``python -m qwenweb.serve`` (granian and daphne) and ``manage.py runserver``."""

from __future__ import annotations

import fcntl
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.server import REPO, free_port, server_env

pytestmark = pytest.mark.own_backend


def unreadable(path: Path) -> None:
    path.write_bytes(b"this is not a database" * 100)


def another_deployments(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('schema', '3'), ('deployment', 'elsewhere')")


COMMANDS = {
    "granian": ("-m", "qwenweb.serve", "-p", "{port}"),
    "daphne": ("-m", "qwenweb.serve", "--server", "daphne", "-p", "{port}"),
    "runserver": ("manage.py", "runserver", "127.0.0.1:{port}", "--noreload"),
}
EXIT_STATUS = {"granian": 2, "daphne": 2, "runserver": 1}
PREFIX = {"granian": "qwenweb.serve: error: ", "daphne": "qwenweb.serve: error: "}


def start(server: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [arg.format(port=free_port()) for arg in COMMANDS[server]]
    return subprocess.run(
        [sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("server", sorted(COMMANDS))
@pytest.mark.parametrize(
    ("spoil", "says"),
    [(unreadable, "is unreadable"), (another_deployments, "belongs to another deployment")],
)
def test_a_log_it_cannot_use_stops_the_server_with_one_line_naming_it(
    e2e_database: Path, server: str, spoil: Callable[[Path], None], says: str
) -> None:
    env = server_env(e2e_database, QWENWEB_BACKEND="durable")
    log = Path(env["QWENWEB_EVENT_LOG_PATH"])
    spoil(log)
    result = start(server, env)
    assert result.returncode == EXIT_STATUS[server], result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    prefix = PREFIX.get(server, "CommandError: ")
    assert line.startswith(f"{prefix}event log {log} {says}"), line


@pytest.mark.parametrize("server", ["granian", "runserver"])
def test_a_log_another_process_holds_stops_the_server_with_one_line(
    e2e_database: Path, server: str
) -> None:
    env = server_env(e2e_database, QWENWEB_BACKEND="durable")
    log = Path(env["QWENWEB_EVENT_LOG_PATH"])
    with open(f"{log}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running server holds it
        result = start(server, env)
    assert result.returncode == EXIT_STATUS[server], result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert f"event log {log} is in use by another process" in line, line
