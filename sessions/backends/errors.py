"""The errors every backend raises, whatever it is built on (no Django, no Redis)."""

from __future__ import annotations

__all__ = [
    "BackendStartError",
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


class BackendStartError(Exception):
    """Raised by ``Backend.check_can_start`` when the backend cannot serve at all (its
    message is one line naming what is wrong, e.g. the file)."""


class BackendUnavailableError(Exception):
    """Raised when the shared event store cannot be reached or did not answer in time (503)."""


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


class OutcomeUnknownError(BackendUnavailableError):
    """Raised when a publish may or may not have been stored (a 503 ``outcome_unknown``):
    the shared store timed out or the connection was lost after the command was sent, or
    (``REDIS_WAIT_REPLICAS``) too few replicas confirmed the write in time, so it may not
    survive a failover (docs/deployment.md, "Acknowledged means replicated").

    The publisher retries with the same ``Idempotency-Key``: the retry answers the first
    result if the event was stored, and publishes it once if not.
    """

    code = "outcome_unknown"
    public_message = (
        "outcome unknown: the event store did not confirm the event in time (no answer, a "
        "lost connection or too few replicas) and may have stored it; retry with the same "
        "Idempotency-Key (without one, a retry may publish it twice)"
    )


class QuotaExceededError(Exception):
    """Raised when a request passes a quota (a 429 with ``Retry-After``).

    ``quota`` names the setting (``PUBLISH_RATE_PER_S``, ...), ``limit`` its value,
    ``retry_after_s`` when the request would fit again (whole seconds, ``>= 1``).
    """

    def __init__(self, quota: str, limit: float, retry_after_s: int, message: str) -> None:
        super().__init__(message)
        self.quota, self.limit, self.retry_after_s = quota, limit, retry_after_s
