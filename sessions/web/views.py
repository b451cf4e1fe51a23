"""The session API: thin async views over the backend (docs/protocol.md, "Endpoints").

Every error is JSON ``{"error": <what is wrong>, "code": <machine code>}`` with a 4xx
status and one log line on ``qwenweb.api`` (:mod:`sessions.web.responses`). Requests
authenticate with ``Authorization: Bearer <token>`` or, from a browser, with the Django
login session; the latter must pass the CSRF check on unsafe methods
(:mod:`sessions.auth` holds the access policy).

``GET /session/<id>/events`` (the stream) is served by :mod:`sessions.transport.stream`,
routed in front of Django by ``qwenweb.asgi``.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from channels.db import database_sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import reverse

from sessions.auth import (
    Principal,
    authenticate,
    check_access,
    check_token_scope,
    issue_token,
)
from sessions.backends import get_backend
from sessions.backends.base import LiveSession, SessionClosedError, SessionNotFoundError
from sessions.bus import DEFAULT_MAX_QUEUED, MAX_EVENT_RING_SIZE, MAX_QUEUED_MAX, MAX_QUEUED_MIN
from sessions.conf import get_config
from sessions.errors import ApiError
from sessions.models import AgentSession, normalize_session_id
from sessions.queries import request_user, session_row
from sessions.web.responses import api_view, enforce_csrf
from sessions.web.validation import MAX_TITLE_LENGTH, parse_json_body, validate_publish_body
from sessions.wire import sanitize_for_log

logger = logging.getLogger("qwenweb.api")

CAPABILITIES: Final = {
    "v": 1,
    "features": [
        "session_events",
        "last_event_id_replay",
        "state_resync_required",
        "replay_complete",
        "slow_client_warning",
        "client_evicted",
        "typed_event_schema",
        "epoch",
        "heartbeat",
    ],
    "maxQueued": {"min": MAX_QUEUED_MIN, "max": MAX_QUEUED_MAX, "default": DEFAULT_MAX_QUEUED},
}


async def _authenticate(request: HttpRequest) -> Principal:
    """Who is calling (:func:`sessions.auth.authenticate`); a login session must also pass
    the CSRF check on unsafe methods."""
    principal = await authenticate(
        request.headers.get("Authorization"), lambda: request_user(request)
    )
    if principal.claims is None and request.method not in ("GET", "HEAD", "OPTIONS"):
        enforce_csrf(request)
    return principal


def _session_id_or_404(raw: str) -> str:
    session_id = normalize_session_id(raw)
    if session_id is None:
        raise ApiError(404, "not_found", "unknown session")
    return session_id


async def _row_or_404(session_id: str) -> AgentSession:
    """Return the session's row, read without keeping a connection (``sessions.queries``).

    Raises ``ApiError`` 404 when there is none (deleted meanwhile).
    """
    row = await session_row(session_id)
    if row is None:
        raise ApiError(404, "not_found", "unknown session")
    return row


def session_urls(request: HttpRequest, session_id: str) -> dict[str, str]:
    """Return the absolute URLs of a session's endpoints."""
    return {
        "events": request.build_absolute_uri(reverse("session-events", args=[session_id])),
        "load": request.build_absolute_uri(reverse("session-detail", args=[session_id])),
        "close": request.build_absolute_uri(reverse("session-close", args=[session_id])),
        "token": request.build_absolute_uri(reverse("session-token", args=[session_id])),
    }


# -- views ------------------------------------------------------------------------------


@api_view("GET", "HEAD")
async def capabilities(request: HttpRequest) -> HttpResponse:
    """``GET /capabilities``: what this server supports."""
    return JsonResponse(CAPABILITIES)


@api_view("POST")
async def create_session(request: HttpRequest) -> HttpResponse:
    """``POST /session``: create a session; 201 with its id, URLs and read/publish tokens.

    Body (optional JSON object): ``title`` (str, <= 200 chars), ``ringSize`` (int in
    ``[1, 1_000_000]``). Auth: a logged-in user (CSRF-checked) or a ``create`` token.
    """
    principal = await _authenticate(request)
    if principal.claims is not None and "create" not in principal.claims.scopes:
        raise ApiError(403, "forbidden", "this token does not grant create access")
    body = parse_json_body(request, required=False)
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_request", "body must be a JSON object", field="")
    title = body.get("title", "")
    if not isinstance(title, str) or len(title) > MAX_TITLE_LENGTH:
        raise ApiError(
            400,
            "invalid_request",
            "title must be a string of at most 200 characters",
            field="title",
        )
    ring_size = body.get("ringSize")
    if ring_size is not None and (
        not isinstance(ring_size, int)
        or isinstance(ring_size, bool)
        or not 1 <= ring_size <= MAX_EVENT_RING_SIZE
    ):
        raise ApiError(
            400,
            "invalid_request",
            f"ringSize must be an integer in [1, {MAX_EVENT_RING_SIZE}]",
            field="ringSize",
        )
    row = await _create_row(title, ring_size, principal)
    logger.info("session_created session=%s by=%s", row.id, sanitize_for_log(principal.name))
    return JsonResponse(
        {
            "id": row.id,
            "title": row.title,
            "status": row.status,
            "urls": session_urls(request, row.id),
            "tokens": {
                "read": issue_token(row.id, ["read"], principal.name),
                "publish": issue_token(row.id, ["publish"], principal.name),
            },
        },
        status=201,
    )


async def _create_row(title: str, ring_size: int | None, principal: Principal) -> AgentSession:
    row: AgentSession = await database_sync_to_async(_create_row_sync)(title, ring_size, principal)
    return row


def _create_row_sync(title: str, ring_size: int | None, principal: Principal) -> AgentSession:
    owner_id = principal.user_id
    if owner_id is None and principal.claims is not None and principal.claims.subject:
        from django.contrib.auth import get_user_model

        owner_id = (
            get_user_model()
            .objects.filter(username=principal.claims.subject)
            .values_list("pk", flat=True)
            .first()
        )
    return AgentSession.objects.create(title=title, ring_size=ring_size, owner_id=owner_id)


async def _open_session(principal: Principal, session_id: str, scope: str) -> LiveSession:
    """Check access and return the loaded session.

    A token is checked before anything is loaded, so it learns nothing about sessions it
    has no access to (always 403). Raises ``ApiError`` 403/404, or
    ``SessionClosedError`` after the access check.
    """
    check_token_scope(principal, session_id, scope)
    try:
        live = await get_backend().get_live_session(session_id)
    except SessionNotFoundError:
        raise ApiError(404, "not_found", "unknown session") from None
    except SessionClosedError as closed:
        check_access(principal, session_id, closed.owner_id, scope)
        raise
    check_access(principal, session_id, live.owner_id, scope)
    return live


@api_view("GET", "HEAD")
async def load_session(request: HttpRequest, session_id: str) -> HttpResponse:
    """``GET /session/<id>``: the snapshot a client rebuilds from after a resync.

    Needs ``read`` access. 404 unknown; a closed session answers the same shape with
    ``"status": "closed"``, no epoch and no events. The snapshot holds every event
    published before the request, on any process (``Backend.snapshot``).
    """
    session_id = _session_id_or_404(session_id)
    principal = await _authenticate(request)
    try:
        body = await get_backend().snapshot(await _open_session(principal, session_id, "read"))
    except SessionClosedError:
        row = await _row_or_404(session_id)
        return JsonResponse(
            {
                "id": row.id,
                "title": row.title,
                "status": row.status,
                "createdAt": row.created_at.isoformat(),
                "closedAt": row.closed_at.isoformat() if row.closed_at else None,
                "lastEventId": row.last_event_id,
                "epoch": None,
                "subscriberCount": 0,
                "ringSize": row.ring_size or get_config().ring_size,
                "earliestAvailableId": None,
                "events": [],
            }
        )
    return HttpResponse(body, content_type="application/json")


@api_view("POST", served_elsewhere=("GET", "HEAD"))  # GET, HEAD: the stream route
async def session_events(request: HttpRequest, session_id: str) -> HttpResponse:
    """``POST /session/<id>/events``: publish one event; 200 ``{"id": N, "epoch": ...}``.

    Needs ``publish`` access. 400 names the bad field; 409 when the session is closed;
    413 when the body exceeds ``PUBLISH_MAX_BODY_BYTES``. (``GET`` is the stream, served
    by ``sessions.transport.stream`` in front of Django.)
    """
    session_id = _session_id_or_404(session_id)
    principal = await _authenticate(request)
    check_token_scope(principal, session_id, "publish")  # learns nothing more without it
    event = validate_publish_body(parse_json_body(request, required=True))
    try:
        live = await _open_session(principal, session_id, "publish")
    except SessionClosedError:
        raise ApiError(409, "session_closed", "the session is closed") from None
    try:
        published = await get_backend().publish(live, event)
    except SessionClosedError:  # closed on another process meanwhile
        raise ApiError(409, "session_closed", "the session is closed") from None
    except SessionNotFoundError:  # deleted meanwhile
        raise ApiError(404, "not_found", "unknown session") from None
    if published is None:
        raise ApiError(409, "session_closed", "the session is closed")
    return JsonResponse({"id": published.id, "epoch": published.epoch})


@api_view("POST")
async def close_session(request: HttpRequest, session_id: str) -> HttpResponse:
    """``POST /session/<id>/close``: publish ``session_closed``, close the bus.

    Needs ``publish`` access. Idempotent: closing a closed session answers 200 with
    ``"alreadyClosed": true``.
    """
    session_id = _session_id_or_404(session_id)
    principal = await _authenticate(request)
    try:
        await _open_session(principal, session_id, "publish")
        last_id = await get_backend().close_session(
            session_id, reason="closed", closed_by=principal.name
        )
    except SessionClosedError:
        row = await _row_or_404(session_id)
        return JsonResponse(
            {
                "id": session_id,
                "status": "closed",
                "lastEventId": row.last_event_id,
                "alreadyClosed": True,
            }
        )
    return JsonResponse(
        {"id": session_id, "status": "closed", "lastEventId": last_id, "alreadyClosed": False}
    )


_FORM_TYPES: Final = ("application/x-www-form-urlencoded", "multipart/form-data")


@api_view("POST")
async def session_token(request: HttpRequest, session_id: str) -> HttpResponse:
    """``POST /session/<id>/token``: a short-lived token for the logged-in owner or staff.

    CSRF-checked. Body (optional, JSON or form): ``scope`` = ``read`` (default) or
    ``publish``. Returns ``{"token", "scope", "sessionId", "expiresInS"}``.
    """
    session_id = _session_id_or_404(session_id)
    user = await request_user(request)
    if not user.is_authenticated or not user.is_active:
        raise ApiError(401, "unauthorized", "log in to obtain a token")
    enforce_csrf(request)
    if request.content_type in _FORM_TYPES:
        scope: Any = request.POST.get("scope", "read")
    else:
        body = parse_json_body(request, required=False)
        scope = body.get("scope", "read") if isinstance(body, dict) else None
    if scope not in ("read", "publish"):
        raise ApiError(400, "invalid_request", "scope must be 'read' or 'publish'", field="scope")
    row = await session_row(session_id)
    if row is None:
        raise ApiError(404, "not_found", "unknown session")
    principal = Principal(None, user.pk, user.is_staff, user.get_username())
    check_access(principal, session_id, row.owner_id, scope)
    return JsonResponse(
        {
            "token": issue_token(session_id, [scope], principal.name),
            "scope": scope,
            "sessionId": session_id,
            "expiresInS": get_config().token_lifetime_s,
        }
    )
