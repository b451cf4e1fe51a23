"""The errors every backend raises, whatever it is built on (no Django, no Redis)."""

from __future__ import annotations

__all__ = [
    "BackendUnavailableError",
    "OutcomeUnknownError",
    "QuotaExceededError",
    "SessionClosedError",
    "SessionHeldElsewhereError",
    "SessionNotFoundError",
]


class SessionNotFoundError(LookupError):
    """Raised when no session has the given id (a 404, EB-15)."""


class SessionClosedError(Exception):
    """Raised when the session is closed (a 204 for streams, EB-15; a 409 for publish).

    ``owner_id`` lets a caller finish its access check (EB-12 comes before EB-15).
    """

    def __init__(self, session_id: str, owner_id: int | None) -> None:
        super().__init__(session_id)
        self.owner_id = owner_id


class BackendUnavailableError(Exception):
    """Raised when the shared event store cannot be reached or did not answer in time (503)."""


class OutcomeUnknownError(BackendUnavailableError):
    """Raised when a publish ran but its replication could not be confirmed in time (a 503
    ``outcome_unknown``): the event may or may not survive a failover, and a retry with
    the same ``Idempotency-Key`` answers its first result once it is confirmed.

    The Redis backend with ``REDIS_WAIT_REPLICAS`` (docs/deployment.md, "Acknowledged means
    replicated").
    """

    code = "outcome_unknown"
    public_message = (
        "the event was written but not confirmed on enough replicas in time: its outcome is "
        "unknown; retry with the same Idempotency-Key"
    )


class SessionHeldElsewhereError(BackendUnavailableError):
    """Raised by the memory backend for a session another live process on the same
    database holds (a 503 ``session_held_elsewhere``, docs/protocol.md "Errors and limits").

    ``holder`` is that process's ``host:pid:token``; ``code`` and ``public_message`` are
    what the answer says.
    """

    code = "session_held_elsewhere"

    def __init__(self, session_id: str, holder: str) -> None:
        super().__init__(f"session {session_id} is held by {holder}")
        self.holder = holder
        self.public_message = (
            "another server process using the memory backend on this database serves this "
            "session; run one process per database, or use the Redis backend "
            "(BACKEND = 'redis') to run several"
        )


class QuotaExceededError(Exception):
    """Raised when a request passes a quota (a 429 with ``Retry-After``).

    ``quota`` names the setting (``PUBLISH_RATE_PER_S``, ...), ``limit`` its value,
    ``retry_after_s`` when the request would fit again (whole seconds, ``>= 1``).
    """

    def __init__(self, quota: str, limit: float, retry_after_s: int, message: str) -> None:
        super().__init__(message)
        self.quota, self.limit, self.retry_after_s = quota, limit, retry_after_s
