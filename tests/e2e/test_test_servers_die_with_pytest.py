"""The test support's servers die with the test process that started them: a pytest killed
with SIGKILL (a CI timeout, a Ctrl-C gone wrong) leaves no ``qwenweb.serve`` or
``redis-server`` running (``tests.support.server.dies_with_this_process``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.server import REPO

pytestmark = pytest.mark.e2e

STAND_IN = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import django
    django.setup()
    from tests.support.redis_server import PrivateRedis
    from tests.support.server import free_port

    redis = PrivateRedis(free_port(), Path(sys.argv[1]), persistent=False).start()
    print(redis.process.pid, flush=True)
    time.sleep(60)
    """
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_server_of_a_killed_test_process_dies_with_it(tmp_path: Path) -> None:
    stand_in = subprocess.Popen(
        [sys.executable, "-c", STAND_IN, str(tmp_path)],
        cwd=REPO,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "qwenweb.settings"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert stand_in.stdout is not None
        server_pid = int(stand_in.stdout.readline())
        assert _alive(server_pid)
        stand_in.send_signal(signal.SIGKILL)
        stand_in.wait(timeout=10)
        deadline = time.monotonic() + 5
        while _alive(server_pid):
            assert time.monotonic() < deadline, f"redis-server {server_pid} outlived its test"
            time.sleep(0.02)
    finally:
        stand_in.kill()
        stand_in.wait(timeout=10)
        assert stand_in.stdout is not None
        stand_in.stdout.close()
        if "server_pid" in locals() and _alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)
