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
    (docs/protocol.md, "Ids and epochs"; EB-1 ``start_id``, EB-7).
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
    held_by = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="Memory backend: the process (host:pid:token) serving this session.",
    )
    held_until = models.DateTimeField(
        null=True, blank=True, help_text="Its hold lasts until then unless renewed."
    )
    stream_compression = models.BooleanField(
        default=True,
        help_text="Off: this session's streams are never gzipped, whatever the client "
        "accepts (EB-17; docs/protocol.md, Compression).",
    )
    token_version = models.PositiveIntegerField(
        default=0,
        help_text="Tokens of this session issued with a lower version are revoked "
        "(manage.py revoke_tokens --session).",
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


class UserTokenVersion(models.Model):
    """A user's token version: every token carrying the user's id and a lower ``version``
    is revoked (deactivation, deletion, ``manage.py revoke_tokens --user``, the admin).

    No row means version 0. Written by :mod:`sessions.token_revocation`, read (cached for at
    most a second) by :mod:`sessions.token_versions` when a token is verified.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        primary_key=True,
        on_delete=models.CASCADE,
        related_name="qwenweb_token_version",
    )
    version = models.PositiveBigIntegerField(default=0)

    class Meta:
        verbose_name = "user token version"

    def __str__(self) -> str:
        return f"user {self.user_id}: tokens version {self.version}"


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


# -- operator records --------------------------------------------------------------------
#
# Written in batches by `sessions.ops.records` (never on the publish path or in a stream's
# frame loop), pruned by `manage.py prune_records`.


class SubscriberConnection(models.Model):
    """One subscriber connection to a session's stream: who, from where, how much, how it ended.

    The primary key is the connection id the stream generates when the subscriber attaches;
    it also appears as ``subscriber=<id>`` in every log line about this subscriber.
    ``frames_sent`` counts SSE frames written (events and synthetic frames);
    ``bytes_sent`` counts every body byte written (``retry:``, frames, heartbeats).
    ``end_payload`` is the exact JSON of the terminal frame the client received
    (``client_evicted`` or ``stream_error``), as written on the wire.
    """

    class Auth(models.TextChoices):
        TOKEN = "token", "Bearer token"
        LOGIN = "login", "Login session"

    class EndReason(models.TextChoices):
        CLIENT_DISCONNECT = "client_disconnect", "Client disconnected"
        CLIENT_EVICTED = "client_evicted", "Evicted (slow client)"
        STREAM_ERROR = "stream_error", "Stream error"
        SESSION_CLOSED = "session_closed", "Session closed"
        SERVER_DISCONNECT = "server_disconnect", "Disconnected by the server"
        OPERATOR_DISCONNECT = "operator_disconnect", "Disconnected by an operator"
        SERVER_SHUTDOWN = "server_shutdown", "Server shutdown"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="connections")
    auth = models.CharField(max_length=8, choices=Auth.choices)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    subject = models.CharField(
        max_length=150, blank=True, help_text="The username, or the token's subject."
    )
    client_addr = models.CharField(max_length=64, blank=True)
    user_agent = models.CharField(max_length=300, blank=True)
    client_id = models.CharField(
        max_length=200, blank=True, help_text="The X-Client-Id request header, if sent."
    )
    max_queued = models.PositiveIntegerField()
    transport = models.CharField(
        max_length=4,
        choices=(("sse", "Server-Sent Events"), ("ws", "WebSocket")),
        default="sse",
        help_text="How the subscriber is connected: an SSE stream or a WebSocket subscription.",
    )
    resumed_from = models.BigIntegerField(
        null=True, blank=True, help_text="The Last-Event-ID the client sent (valid ones only)."
    )
    opened_at = models.DateTimeField(db_index=True)
    closed_at = models.DateTimeField(null=True, blank=True, db_index=True)
    frames_sent = models.BigIntegerField(default=0)
    bytes_sent = models.BigIntegerField(default=0)
    end_reason = models.CharField(max_length=20, choices=EndReason.choices, blank=True)
    end_detail = models.CharField(max_length=200, blank=True)
    end_payload = models.TextField(blank=True)

    class Meta:
        ordering = ("-opened_at",)
        verbose_name = "subscriber connection"

    def __str__(self) -> str:
        return f"{self.subject or self.client_addr or 'anonymous'} · {self.id}"


class SubscriberIncident(models.Model):
    """One ``slow_client_warning`` or ``client_evicted`` frame written to a subscriber.

    ``payload`` is the exact JSON envelope the client received (the ``data:`` line, with
    its ``_meta.serverTimestamp``); ``reason`` is the warning's ``threshold`` or the
    eviction's ``reason``; ``event_id`` its ``lastEventId`` or ``droppedAfter``.
    """

    class Kind(models.TextChoices):
        SLOW_CLIENT_WARNING = "slow_client_warning", "slow_client_warning"
        CLIENT_EVICTED = "client_evicted", "client_evicted"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    session = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="incidents")
    connection = models.ForeignKey(
        SubscriberConnection, on_delete=models.CASCADE, related_name="incidents"
    )
    kind = models.CharField(max_length=24, choices=Kind.choices)
    reason = models.CharField(max_length=40, blank=True)
    event_id = models.BigIntegerField(null=True, blank=True)
    at = models.DateTimeField(db_index=True)
    payload = models.TextField()

    class Meta:
        ordering = ("-at",)
        verbose_name = "subscriber incident"

    def __str__(self) -> str:
        return f"{self.kind} ({self.reason}) at {self.at:%Y-%m-%d %H:%M:%S}"
