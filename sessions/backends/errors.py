"""The errors every backend raises, whatever it is built on (no Django, no Redis)."""

from __future__ import annotations

__all__ = ["BackendUnavailableError", "SessionClosedError", "SessionNotFoundError"]


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
