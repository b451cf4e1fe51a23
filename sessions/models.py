"""Session metadata kept in the database (the live state is in the event bus)."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models


def new_session_id() -> str:
    """Return a new session id: a UUID4 in its canonical 36-character string form."""
    return str(uuid.uuid4())


class AgentSession(models.Model):
    """One agent session: who owns it, whether it is open, and its id sequence.

    ``event_id_reserved`` is the high-water mark of the event id sequence: every id the
    process serving the session can issue is ``<= event_id_reserved``. It is reserved in
    blocks ahead of use, so a bus rebuilt after a restart starts at
    ``event_id_reserved + 1`` and answers every old cursor with
    ``state_resync_required`` instead of replaying events that merely share its numbers
    (spec section 5, EB-1 ``start_id``, EB-7).
    """

    class Status(models.TextChoices):
        OPEN = "open", "Open"
        CLOSED = "closed", "Closed"

    id = models.CharField(primary_key=True, max_length=36, default=new_session_id, editable=False)
    title = models.CharField(max_length=200, blank=True)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="agent_sessions",
    )
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.OPEN)
    created_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    ring_size = models.PositiveIntegerField(
        null=True, blank=True, help_text="Events kept for replay; empty = the server's setting."
    )
    event_id_reserved = models.BigIntegerField(
        default=0, help_text="High-water mark: every id issued so far is at most this."
    )
    last_event_id = models.BigIntegerField(default=0, help_text="Last id issued, as last saved.")
    events_published = models.BigIntegerField(default=0)
    slow_client_warnings = models.BigIntegerField(default=0)
    evictions = models.BigIntegerField(default=0)
    peak_subscribers = models.PositiveIntegerField(default=0)
    bus_starts = models.PositiveIntegerField(
        default=0, help_text="How many times a server process built this session's bus."
    )

    class Meta:
        ordering = ("-created_at",)
        verbose_name = "agent session"

    def __str__(self) -> str:
        return self.title or self.id

    @property
    def is_closed(self) -> bool:
        """Whether the session is closed (its stream answers 204, EB-15)."""
        return self.status == self.Status.CLOSED


def normalize_session_id(raw: str) -> str | None:
    """Return ``raw`` if it is a session id in canonical form (lowercase UUID), else None.

    Checked before any database query, so a malformed id in a path is a plain 404.
    """
    if len(raw) != 36:
        return None
    try:
        parsed = uuid.UUID(raw)
    except ValueError:
        return None
    return raw if str(parsed) == raw else None
