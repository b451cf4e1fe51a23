"""``manage.py`` commands as processes of their own, on an end-to-end test's SQLite file.

The environment is :func:`tests.support.server.server_env`'s for that file, so that a
command sees the users, sessions and tokens of the server processes sharing it.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tests.support.server import REPO, server_env


def manage(
    database: Path,
    *args: str,
    timeout_s: float = 60,
    check: bool = False,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py *args`` on ``database`` (``env`` added to the environment) and wait.

    Returns the finished process, its stdout and stderr as text. Raises
    :class:`subprocess.TimeoutExpired` after ``timeout_s`` seconds, and with ``check``
    :class:`subprocess.CalledProcessError` when it exits non-zero.
    """
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=server_env(database, **(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=check,
    )


def manage_output(database: Path, *args: str) -> str:
    """The stdout of ``manage.py *args`` on ``database``, which must exit 0 within 60 s
    (:func:`manage` with ``check``; raises as it does)."""
    return manage(database, *args, check=True).stdout


def owned_session(database: Path) -> tuple[str, str, dict[str, str]]:
    """A new user and a session they own, made by commands: ``(username, session id,
    tokens by scope)`` (``create_session --owner``'s ``tokens``: ``read``, ``publish``)."""
    name = f"owner-{secrets.token_hex(4)}"
    code = f"from django.contrib.auth.models import User; User.objects.create_user({name!r})"
    manage_output(database, "shell", "-c", code)
    created = json.loads(manage_output(database, "create_session", "--owner", name))
    return name, created["id"], created["tokens"]


@contextmanager
def manage_process(database: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    """Start ``manage.py *args`` on ``database`` (stdout and stderr piped, as text) and
    yield it; on the way out a process still running is killed and reaped (bounded, 10 s),
    so a failed test leaves none behind."""
    process = subprocess.Popen(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=server_env(database),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=10)
