"""Admission: who may subscribe to which session from where, shared by every transport.

Rules: EB-12 ... EB-16 (docs/protocol.md, "The stream" and "The WebSocket transport").

A transport turns its own wire into an :class:`AdmissionRequest` (SSE: headers and the
query string; WebSocket: a ``subscribe`` message), then :func:`admit` runs the checks in
the contract's order and attaches a bus subscriber. What comes back is a
:class:`Subscribed` (the subscription, its connection info for the operator side, the
token-expiry timer) or a refusal: :class:`~sessions.errors.ApiError` (a 4xx/503 with
today's codes), :class:`~sessions.backends.base.SessionClosedError` (the SSE 204) or
:class:`SubscriberLimitError` (EB-16). How a refusal reaches the client is the
transport's business; the codes are the same on every transport.

Concurrency: everything runs on the server's event loop; database work goes through
``database_sync_to_async`` (in :mod:`sessions.auth` and Channels' ``get_user``) for one
query at a time.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Final

from channels.auth import get_user
from django.conf import settings
from django.db import DatabaseError
from django.http.cookie import parse_cookie
from django.http.request import split_domain_port, validate_host

from sessions.auth import (
    Principal,
    authenticate,
    check_access,
    check_access_by_row,
    check_token_scope,
    ensure_current,
)
from sessions.backends.base import (
    OPERATOR_DISCONNECT,
    Backend,
    BackendUnavailableError,
    LiveSession,
    SessionClosedError,
    SessionNotFoundError,
)
from sessions.backends.revoked_streams import expired_frame, stream_details
from sessions.bus import (
    DEFAULT_MAX_QUEUED,
    MAX_QUEUED_MAX,
    MAX_QUEUED_MIN,
    Frame,
    SubscriberLimitExceededError,
    Subscription,
    synthetic_frame,
)
from sessions.bus.sweep import MAX_PERIOD_S, sweeper
from sessions.errors import ApiError, backend_unavailable
from sessions.hooks import ConnectionInfo
from sessions.models import SubscriberConnection, normalize_session_id
from sessions.process_state import process_state
from sessions.wire import parse_epoch, parse_last_event_id, sanitize_for_log

__all__ = [
    "DRAIN_RETRY_MS",
    "LIMIT_RETRY_MS",
    "AdmissionRequest",
    "Subscribed",
    "SubscriberLimitError",
    "admit",
    "drain_frame",
    "drain_retry_ms",
    "host_allowed",
    "login_user_from_cookie",
    "max_queued_or_error",
    "parse_cursor",
]

logger = logging.getLogger("qwenweb.stream")

LIMIT_RETRY_MS: Final = 5000
"""``retry:`` (ms) of the EB-16 answer when the subscriber limit is reached."""
DRAIN_RETRY_MS: Final = (1000, 3000)
"""Range (ms) of the jittered ``retry:`` of a stream ended or refused by the drain: clients
of one process never come back in step (docs/protocol.md, "Graceful drain")."""

CLIENT_DISCONNECT: Final = SubscriberConnection.EndReason.CLIENT_DISCONNECT.value
STREAM_ERROR: Final = SubscriberConnection.EndReason.STREAM_ERROR.value
SERVER_SHUTDOWN: Final = SubscriberConnection.EndReason.SERVER_SHUTDOWN.value
_SERVER_DISCONNECT: Final = SubscriberConnection.EndReason.SERVER_DISCONNECT.value
_OPERATOR_DISCONNECT: Final = SubscriberConnection.EndReason.OPERATOR_DISCONNECT.value
_BUS_END_REASONS: Final = {
    "evicted": SubscriberConnection.EndReason.CLIENT_EVICTED.value,
    "closed": SubscriberConnection.EndReason.SESSION_CLOSED.value,
    "disconnected": SubscriberConnection.EndReason.SERVER_DISCONNECT.value,
}


class SubscriberLimitError(Exception):
    """Raised by :func:`admit` when the session has ``limit`` subscribers (EB-16)."""

    def __init__(self, live: LiveSession, limit: int) -> None:
        super().__init__(f"subscriber limit {limit} reached")
        self.live, self.limit = live, limit


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """One request to subscribe, in transport-neutral terms.

    ``authorization``: an ``Authorization`` value (``Bearer <token>``) or None, then
    ``load_user()`` gives the login user (None: nobody). ``last_event_id`` / ``epoch``:
    the cursor and its epoch as the client sent them (text; EB-13: an invalid one is
    absent, with a log line, never an error: :func:`parse_cursor`). ``max_queued``: the
    parsed cap, or the :class:`ApiError` its parser found (raised after authentication,
    in the contract's order); ``option_error``: another option's refusal (SSE's
    ``compress``), raised right after. ``transport``: ``"sse"`` or ``"ws"`` (the records say which).
    """

    session_id: str
    authorization: bytes | str | None
    load_user: Callable[[], Awaitable[Any]]
    last_event_id: bytes | str | None
    epoch: bytes | str | None
    max_queued: int | ApiError
    client_id: str = ""
    client_addr: str = ""
    user_agent: str = ""
    transport: str = "sse"
    option_error: ApiError | None = None


@dataclass(slots=True)
class Subscribed:
    """An admitted subscriber: its session, its bus subscription and who it is.

    ``info`` is what the operator side is told (:meth:`Hooks.connection_opened`);
    ``principal`` who authenticated. Call :meth:`release` when the transport is done
    with it (idempotent).
    """

    live: LiveSession
    subscription: Subscription
    principal: Principal
    info: ConnectionInfo
    expiry: _Expiry | None

    def release(self) -> None:
        """Detach the subscriber and stop its expiry timer. Idempotent, never raises."""
        self.subscription.abort()
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None

    def ended_by_bus(self) -> tuple[str, str] | None:
        """The end reason when the bus ended the subscription (EB-5, EB-9), else None.

        A subscriber disconnected while the server shuts down ended because of the
        shutdown; one an operator disconnected (``end_note`` reason
        ``operator_disconnect``) is ``(operator_disconnect, "by <who>")``.
        """
        subscription = self.subscription
        reason = _BUS_END_REASONS.get(subscription.end_reason or "")
        if reason == _SERVER_DISCONNECT and process_state.shutting_down:
            reason = SERVER_SHUTDOWN
        note = subscription.end_note
        if reason == _SERVER_DISCONNECT and note and note.get("reason") == OPERATOR_DISCONNECT:
            return _OPERATOR_DISCONNECT, f"by {note.get('by') or 'an operator'}"
        return (reason, "") if reason is not None else None

    def renew(self, principal: Principal) -> None:
        """Judge the subscriber by ``principal``'s credentials from now on (a token refresh).

        The revocation details and the expiry timer follow the new token; the queue and
        the cursor are untouched. A subscription that has ended (evicted, closed,
        released) is left as it is: no expiry timer is armed for it. Never raises.
        """
        if self.subscription.ended:
            return
        self.principal = principal
        details = dict(self.subscription.details or {})
        details.update(_credential_details(principal, self.live.owner_id))
        self.subscription.details = details
        if self.expiry is not None:
            self.expiry.cancel()
        self.expiry = _end_at_expiry(self.live, self.subscription, principal)


async def admit(backend: Backend, request: AdmissionRequest) -> Subscribed:
    """Run the checks of EB-12 ... EB-16 in order and attach a bus subscriber.

    Raises:
        ApiError: the first check that failed (401, 403, 400, 404, 503), today's codes.
        SessionClosedError: a closed session the caller may read (SSE answers 204).
        SubscriberLimitError: the session's subscriber limit (EB-16).
    """
    raw_session_id = request.session_id
    session_id = normalize_session_id(raw_session_id)
    principal = await authenticate(  # EB-12; revocation is checked after the lookup
        request.authorization, request.load_user, check_versions=False
    )
    check_token_scope(principal, session_id or "", "read")
    cursor = parse_cursor(request.last_event_id, request.epoch, raw_session_id)  # EB-13
    if isinstance(request.max_queued, ApiError):  # EB-14
        raise request.max_queued
    if request.option_error is not None:
        raise request.option_error
    if session_id is None:  # EB-15
        raise ApiError(404, "not_found", "unknown session")
    try:
        live = await backend.get_live_session(session_id)
    except SessionNotFoundError:
        raise ApiError(404, "not_found", "unknown session") from None
    except BackendUnavailableError as exc:
        await check_access_by_row(principal, session_id, "read")  # an outage tells no ids
        raise backend_unavailable(exc) from None
    except SessionClosedError as closed:
        check_access(principal, session_id, closed.owner_id, "read")  # EB-12 before EB-15
        raise
    check_access(principal, session_id, live.owner_id, "read")
    # A closed session answered above whatever the token's version: the client stops.
    try:
        await ensure_current(principal)
    except DatabaseError as exc:
        raise ApiError(
            503, "unavailable", "the database is busy; try again", log_extra=f" error={exc!r}"
        ) from None
    return await _subscribe(backend, live, principal, request, cursor)


async def _subscribe(
    backend: Backend,
    live: LiveSession,
    principal: Principal,
    request: AdmissionRequest,
    cursor: tuple[int | None, str | None],
) -> Subscribed:
    last_event_id, epoch = cursor
    max_queued = request.max_queued
    assert isinstance(max_queued, int)
    info = ConnectionInfo(
        id=uuid.uuid4(),
        session_id=live.session_id,
        auth=principal.auth,
        user_id=principal.user_id,
        subject=principal.name[:150],
        client_addr=request.client_addr[:64],
        user_agent=request.user_agent,
        client_id=request.client_id,
        max_queued=max_queued,
        resumed_from=last_event_id,
        transport=request.transport,
    )
    try:
        live, subscription = await backend.subscribe(
            live,
            last_event_id=last_event_id,
            max_queued=max_queued,
            epoch=epoch,
            label=info.label,
            details={
                "user": info.subject,
                "clientId": info.client_id,
                "address": info.client_addr,
                "transport": info.transport,
                **_credential_details(principal, live.owner_id),
            },
        )
    except SubscriberLimitExceededError as exc:
        raise SubscriberLimitError(live, exc.limit) from None
    except BackendUnavailableError as exc:
        raise backend_unavailable(exc) from None
    expiry = _end_at_expiry(live, subscription, principal)
    return Subscribed(live, subscription, principal, info, expiry)


def parse_cursor(
    raw_cursor: bytes | str | None, raw_epoch: bytes | str | None, session_id: str
) -> tuple[int | None, str | None]:
    """EB-13: the strict cursor and its epoch; invalid ones are absent, with a log line.

    The epoch counts only together with a valid cursor. Never raises.
    """
    last_event_id = parse_last_event_id(raw_cursor)
    if raw_cursor is not None and last_event_id is None:
        logger.warning(
            "last_event_id_rejected session=%s value=%r (treated as absent)",
            sanitize_for_log(session_id),
            sanitize_for_log(raw_cursor),
        )
    epoch = parse_epoch(raw_epoch)
    if raw_epoch is not None and epoch is None:
        logger.warning(
            "epoch_rejected session=%s value=%r (ignored)",
            sanitize_for_log(session_id),
            sanitize_for_log(raw_epoch),
        )
    return last_event_id, epoch if last_event_id is not None else None


def max_queued_or_error(values: list[str] | None) -> int | ApiError:
    """EB-14: absent → 256; one plain decimal in ``[16, 2048]``; else the 400 to answer."""
    if not values:
        return DEFAULT_MAX_QUEUED
    raw = values[0]
    if (
        len(values) == 1
        and raw.isascii()
        and raw.isdigit()
        and len(raw.lstrip("0")) <= 4  # any number of leading zeros; bounds int()
        and MAX_QUEUED_MIN <= int(raw) <= MAX_QUEUED_MAX
    ):
        return int(raw)
    problem = "must be given once" if len(values) > 1 else "must be a decimal integer"
    return ApiError(
        400,
        "invalid_max_queued",
        f"maxQueued {problem} in [{MAX_QUEUED_MIN}, {MAX_QUEUED_MAX}]",
        log_extra=f" value={sanitize_for_log(','.join(values))!r}",
    )


async def login_user_from_cookie(cookie_header: bytes | None) -> Any:
    """The user of the Django login session named by a ``Cookie`` header, or None.

    Loaded here, only for requests without a bearer token, rather than by Channels'
    session middleware, which would wrap ``send`` for every message of the stream.
    """
    cookies = parse_cookie((cookie_header or b"").decode("latin-1"))
    session_key = cookies.get(settings.SESSION_COOKIE_NAME)
    if not session_key:
        return None
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=session_key)
    return await get_user({"session": store})


def host_allowed(raw_host: bytes | None, server: Any) -> bool:
    """Whether the request's host is in ``ALLOWED_HOSTS`` (Django's rules, incl. DEBUG).

    ``raw_host``: the ``Host`` header, or None (then the scope's ``server`` is used).
    """
    host = str((server or ("", None))[0]) if raw_host is None else raw_host.decode("latin-1")
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    domain, _port = split_domain_port(host)
    return bool(domain) and validate_host(domain, allowed)


def drain_retry_ms() -> int:
    """A reconnection time drawn uniformly from :data:`DRAIN_RETRY_MS` (ms)."""
    low, high = DRAIN_RETRY_MS
    return low + secrets.randbelow(high - low + 1)


def drain_frame(retry_ms: int) -> Frame:
    """The terminal frame of a stream the drain ends or refuses (``server_draining``).

    Shape: ``{"v": 1, "type": "stream_error", "data": {"error": ..., "code":
    "server_draining", "retryAfterMs": retry_ms}}``; its block starts with ``retry:
    <retry_ms>`` (a ``RetryFrame``), so every client reconnects after its own time.
    """
    return synthetic_frame(
        "stream_error",
        {
            "error": "the server is shutting down; reconnect",
            "code": "server_draining",
            "retryAfterMs": retry_ms,
        },
        retry_ms=retry_ms,
    )


def _credential_details(principal: Principal, owner_id: int | None) -> dict[str, Any]:
    """What revocation needs to know about a subscriber (``Backend.revoke``, the sweep)."""
    claims = principal.claims
    if claims is None:
        return stream_details(
            auth="login",
            user_id=principal.user_id,
            user_version=None,
            session_version=None,
            # Opened on staff rights alone: ends when the user is no longer staff.
            via_staff=principal.is_staff and owner_id != principal.user_id,
        )
    return stream_details(
        auth="token",
        user_id=claims.user_id,
        user_version=claims.user_version,
        session_version=claims.session_version,
    )


def _end_at_expiry(
    live: LiveSession, subscription: Subscription, principal: Principal
) -> _Expiry | None:
    """End the subscription with ``stream_error`` (``token_expired``) when its token expires
    (up to :data:`~sessions.bus.sweep.MAX_PERIOD_S` later).

    The client then asks for a fresh token and resumes with its cursor. None for a login
    session (no expiry). Never raises.
    """
    claims = principal.claims
    if claims is None or claims.expires_at is None:
        return None
    return _Expiry(live, subscription, max(0.0, claims.expires_at - time.time()))


class _Expiry:
    """A token's expiry as a deadline of the loop's :class:`~sessions.bus.sweep.Sweeper`
    (a timer handle and its callback per stream were 0.8 KiB of an idle stream)."""

    __slots__ = ("_sweeper", "live", "subscription")

    def __init__(self, live: LiveSession, subscription: Subscription, delay_s: float) -> None:
        self.live = live
        self.subscription = subscription
        loop = asyncio.get_running_loop()
        self._sweeper = sweeper(loop)
        self._sweeper.call_at(self, loop.time() + delay_s, _Expiry._fire, MAX_PERIOD_S)

    def _fire(self) -> None:
        self.live.bus.disconnect(self.subscription, "token_expired", frame=expired_frame())

    def cancel(self) -> None:
        """Forget the deadline. Idempotent, never raises."""
        self._sweeper.cancel(self)
