"""Every constant and default of the bus and its route, in one place.

They are listed in docs/protocol.md, "Errors and limits".

Each is named for the rule that fixes it. Plain values: this module imports nothing.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEFAULT_MAX_QUEUED",
    "DEFAULT_MAX_QUEUED_BYTES",
    "DEFAULT_MAX_SUBSCRIBERS",
    "DEFAULT_OVERFLOW_GRACE_S",
    "DEFAULT_RING_MAX_BYTES",
    "DEFAULT_RING_SIZE",
    "EVENT_SCHEMA_VERSION",
    "GRACE_BYTES_RATIO",
    "MAX_EVENT_RING_SIZE",
    "MAX_QUEUED_MAX",
    "MAX_QUEUED_MIN",
    "MAX_SAFE_INTEGER",
    "WARN_RESET_RATIO",
    "WARN_THRESHOLD_RATIO",
]

EVENT_SCHEMA_VERSION: Final = 1
"""Stamped as ``v`` on every frame, synthetic ones included (EB-2, docs/protocol.md "Frames")."""

DEFAULT_RING_SIZE: Final = 8000
"""Events kept per session for replay (EB-1, EB-7)."""

DEFAULT_RING_MAX_BYTES: Final = 64 * 1024 * 1024
"""Bytes a session's ring holds at most (docs/protocol.md, "Ring limits")."""

MAX_EVENT_RING_SIZE: Final = 1_000_000
"""Largest ring size; sizes outside ``[1, 1_000_000]`` are refused (EB-1)."""

DEFAULT_MAX_QUEUED: Final = 256
"""Per-subscriber cap on live frames, and ``?maxQueued`` when absent (EB-6, EB-14)."""

MAX_QUEUED_MIN: Final = 16
"""Smallest ``?maxQueued`` the route accepts; below it is a 400 (EB-14)."""

MAX_QUEUED_MAX: Final = 2048
"""Largest ``?maxQueued`` the route accepts; above it is a 400 (EB-14)."""

DEFAULT_MAX_QUEUED_BYTES: Final = 2 * 1024 * 1024
"""Per-subscriber cap on live serialized bytes, a bus constructor option (EB-1, EB-3)."""

DEFAULT_OVERFLOW_GRACE_S: Final = 1.0
"""Seconds a queue may stay past 75 % of a cap while its consumer is away in one ``send``
before the subscriber counts as slow (warned, then evicted at either cap) (EB-3, EB-4).

A reader that keeps up comes back for frames within milliseconds (under granian a
``send`` returns only once the server's thread gets the interpreter lock back: 2-4 ms
measured while a publisher holds the loop), so this only has to outlast the server's own
latency: a pause of the process, a catch-up batch, a durable commit, a garbage
collection. The byte cap waits for it too, up to :data:`GRACE_BYTES_RATIO` times the cap."""

GRACE_BYTES_RATIO: Final = 2
"""Within the overflow grace a subscriber's live frames may pass its byte cap
(``MAX_QUEUED_BYTES``) up to this many times the cap; a push past that is refused at once,
whatever the grace (``queue_bytes_overflow``, EB-3). So a subscriber holds at most this
many times its byte cap of live frames (4 MiB by default), plus the batch its pump writes."""

DEFAULT_MAX_SUBSCRIBERS: Final = 64
"""Concurrent subscribers per session (EB-1, EB-6, EB-16)."""

WARN_THRESHOLD_RATIO: Final = 0.75
"""``slow_client_warning`` when live frames or bytes reach this share of their cap (EB-4)."""

WARN_RESET_RATIO: Final = 0.375
"""The warning re-arms only when live frames and bytes fall to this share or below (EB-4)."""

MAX_SAFE_INTEGER: Final = 2**53 - 1
"""Largest id, cursor and byte cap: a JavaScript number holds it exactly (EB-1, EB-13)."""
