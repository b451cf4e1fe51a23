"""``sessions.ops.parent_death``: the kernel's parent-death signal, and its race.

Each check runs in a child interpreter of its own (the signal is a property of the calling
process): what it reads back with ``PR_GET_PDEATHSIG`` and which signal it received.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from sessions.ops import parent_death
from sessions.ops.parent_death import PARENT_DEATH_SIGNAL, PARENT_PID_ENV

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's"
)

PROBE = """
import ctypes, os, signal, sys
from sessions.ops.parent_death import die_with_parent
received = []
signal.signal(signal.SIGUSR2, lambda signum, frame: received.append(signum))
die_with_parent({parent})
armed = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(armed), 0, 0, 0)  # PR_GET_PDEATHSIG
print(armed.value, received)
"""


def probe(parent: str) -> str:
    """Run :data:`PROBE` in a child interpreter; its line ``<armed signal> <received>``."""
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROBE.format(parent=parent))],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout.strip()


def test_die_with_parent_arms_the_signal_for_the_parent_it_names():
    assert probe("os.getppid()") == f"{int(PARENT_DEATH_SIGNAL)} []"


def test_a_parent_already_gone_raises_the_signal_at_once():
    # The process's parent is not the one named: it died before the signal was armed,
    # and the kernel will never send it.
    assert probe("os.getppid() + 1_000_000") == f"{int(PARENT_DEATH_SIGNAL)} [{signal.SIGUSR2}]"


def test_the_environment_names_the_parent_once(monkeypatch: pytest.MonkeyPatch):
    armed: list[int] = []

    def die_with_parent(parent_pid: int) -> bool:
        armed.append(parent_pid)
        return True

    monkeypatch.setattr(parent_death, "die_with_parent", die_with_parent)
    monkeypatch.setenv(PARENT_PID_ENV, str(os.getppid()))
    assert parent_death.die_with_parent_from_environment() is True
    assert PARENT_PID_ENV not in os.environ  # the server's own children do not inherit it
    assert parent_death.die_with_parent_from_environment() is False
    assert armed == [os.getppid()]


@pytest.mark.parametrize("value", ["", "demo", "0", "-3"])
def test_a_parent_pid_that_is_not_a_pid_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, value: str
):
    monkeypatch.setenv(PARENT_PID_ENV, value)
    with pytest.raises(ValueError, match=f"^{PARENT_PID_ENV} must be a process id; got "):
        parent_death.die_with_parent_from_environment()
