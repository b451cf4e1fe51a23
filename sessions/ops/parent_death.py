"""Server processes that die with their parent (Linux ``PR_SET_PDEATHSIG``).

A ``kill -9`` of ``python -m qwenweb.serve``'s main process runs none of its code: granian
cannot stop its workers, which would go on serving on the port, reparented to init. So
each worker asks the kernel, as it starts, for :data:`PARENT_DEATH_SIGNAL` when its parent
dies (:func:`die_with_parent`, called by ``qwenweb.granian_server`` before the application
loads). The same holds for the server that ``manage.py demo`` starts: the demo names
itself in :data:`PARENT_PID_ENV` and the server process arms the signal at its start
(:func:`die_with_parent_from_environment`).

What the signal does: until :mod:`sessions.ops.lifecycle` installs its handler (the ASGI
lifespan startup, or the first request under daphne) its default action ends the process
(nothing is served yet, nothing is lost); from then on the handler ends every stream at
once, writes the records and exits within ``ORPHAN_EXIT_S`` (docs/deployment.md,
"Stopping"). granian's main process never installs it: it dies at once, and its workers'
own signals follow.

The kernel sends the signal when the *thread* that forked the process ends, not the
process: granian forks its workers from its main thread (``startup`` and its serve loop,
both on the main thread), and ``manage.py demo`` starts its server from its main thread, so
for both "the thread" is the whole process.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Final

__all__ = [
    "PARENT_DEATH_SIGNAL",
    "PARENT_PID_ENV",
    "die_with_parent",
    "die_with_parent_from_environment",
]

PARENT_DEATH_SIGNAL: Final = signal.SIGUSR2
"""The signal a server process gets when its parent dies (unused by granian and daphne)."""

PARENT_PID_ENV: Final = "QWENWEB_PARENT_PID"
"""The environment variable through which a parent (``manage.py demo``) asks the server it
starts to die with it: the parent's pid. Read once and removed, so the server's own
children (granian's workers) do not take it for theirs."""

_PR_SET_PDEATHSIG: Final = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int, signum: int = PARENT_DEATH_SIGNAL) -> bool:
    """Have the kernel send ``signum`` to this process when its parent ``parent_pid`` dies.

    ``parent_pid`` is the pid the parent had before it started this process (its
    ``os.getpid()``): if this process's parent is already another one (init, a
    subreaper), the parent died before the request could be made and ``signum`` is raised
    at once (the kernel would never send it). Returns False, doing nothing, off Linux.
    Raises ``OSError`` when ``prctl`` refuses.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signum), 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")
    # The race: a parent that died between the fork and the prctl above sends nothing.
    if os.getppid() != parent_pid:
        signal.raise_signal(signum)
    return True


def die_with_parent_from_environment() -> bool:
    """Call :func:`die_with_parent` with the pid in :data:`PARENT_PID_ENV`, if it is set.

    Removes the variable from ``os.environ`` first. Returns whether a parent was named
    (and the signal armed). Raises ``ValueError`` naming the variable when its value is
    not a process id.
    """
    value = os.environ.pop(PARENT_PID_ENV, None)
    if value is None:
        return False
    try:
        parent_pid = int(value)
    except ValueError:
        parent_pid = 0
    if parent_pid <= 0:
        raise ValueError(f"{PARENT_PID_ENV} must be a process id; got {value!r}")
    return die_with_parent(parent_pid)
