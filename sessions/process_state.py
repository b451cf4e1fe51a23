"""The process's lifecycle flags: :data:`process_state` (draining, shutting down).

Set by the operator side's shutdown sequence (``sessions.ops.lifecycle``: ``drain`` and
``shutdown``), read by the inner layers that must behave differently from then on: the
stream route (refuses new streams with ``server_draining``; streams it ends record
``server_shutdown``), the backends (``Backend.accepts_publish``), ``/readyz`` (503). They
are state of the process, not announcements, so they live here rather than on
:class:`sessions.hooks.Hooks`.

Concurrency: written and read on the server's event loop (EB-11); each flag only goes
from False to True in a running server (tests reset them with :meth:`ProcessState.reset`).
This module imports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ProcessState", "process_state"]


@dataclass(slots=True)
class ProcessState:
    """Where this process is in its life; both flags start False.

    ``draining``: the graceful drain started (``/readyz`` answers 503, the stream route
    refuses new streams with ``stream_error`` ``server_draining``).
    ``shutting_down``: the shutdown sequence started: streams the server ends from then on
    record ``server_shutdown`` rather than ``server_disconnect``.
    """

    draining: bool = False
    shutting_down: bool = False

    def reset(self) -> None:
        """Clear both flags (a fresh process; for tests). Never raises."""
        self.draining = False
        self.shutting_down = False


process_state = ProcessState()
"""This process's lifecycle flags."""
