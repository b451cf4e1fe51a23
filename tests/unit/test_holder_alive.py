"""``rows.holder_alive``: whether the process holding a session's row may still run.

A server killed with SIGKILL whose parent died too is reparented; where pid 1 does not
reap (a container's init), its pid stays as a zombie. Its holds must count as let go, or
the restarted server refuses its own sessions (``session_held_elsewhere``) until they
lapse (CI: tests/e2e/test_durable_torn.py).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

from sessions.backends import rows


def _holder(pid: int) -> str:
    return f"{socket.gethostname()}:{pid}:0000"


def _wait_zombie(pid: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            if stat.read().rpartition(")")[2].split()[0] == "Z":
                return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not become a zombie")


def test_a_running_process_holds() -> None:
    assert rows.holder_alive(rows.process_holder())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert rows.holder_alive(_holder(child.pid))
    finally:
        child.kill()
        child.wait(timeout=10)


def test_an_unreaped_zombie_does_not_hold() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        _wait_zombie(child.pid)  # ended, not yet reaped: its pid still answers kill(0)
        os.kill(child.pid, 0)
        assert not rows.holder_alive(_holder(child.pid))
    finally:
        child.wait(timeout=10)


def test_a_reaped_process_does_not_hold() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=10)
    assert not rows.holder_alive(_holder(child.pid))


def test_another_host_or_an_unreadable_name_holds() -> None:
    assert rows.holder_alive(f"elsewhere.invalid:{os.getpid()}:0000")
    assert rows.holder_alive("not-a-holder")
