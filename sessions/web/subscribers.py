"""Operators' live subscribers: list a session's current subscribers, disconnect one.

Routes (``sessions/urls.py``; docs/protocol.md, "Endpoints"):

- ``GET /session/<id>/subscribers`` — every current subscriber of the session in every
  server process (:meth:`Backend.list_subscribers`).
- ``POST /session/<id>/subscribers/<subscriber id>/disconnect`` — end that one subscriber
  with a terminal ``stream_error`` (code ``server_disconnect``, reason
  ``operator_disconnect``); its record ends ``operator_disconnect``, ``by <operator>``.

- ``GET /session/<id>/readers/<client id>`` — whether a reader that sent
  ``X-Client-Id: <client id>`` is connected now: the session page polls it while its reading
  is paused, to learn that the server evicted it (it cannot see the stream's end unread).

The first two are for active staff with a login session only (a bearer token names no operator):
anyone else gets 403 ``forbidden`` before anything about the session is looked up. The
``POST`` also needs the CSRF header (403 ``csrf_failed``). Thin glue over the backend:
the event store out of reach is the usual 503 of :func:`sessions.web.responses.api_view`.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Final

from django.http import HttpRequest, HttpResponse, JsonResponse

from sessions.auth import authenticate, check_access_by_row, is_operator
from sessions.backends import get_backend
from sessions.backends.base import OPERATOR_DISCONNECT
from sessions.errors import ApiError
from sessions.models import normalize_session_id
from sessions.queries import request_user, session_row
from sessions.web.responses import api_view, enforce_csrf
from sessions.wire import sanitize_for_log

__all__ = [
    "SUBSCRIBER_PLACEHOLDER",
    "disconnect_subscriber",
    "reader_status",
    "session_subscribers",
]

logger = logging.getLogger("qwenweb.api")

SUBSCRIBER_PLACEHOLDER: Final = "ffffffff-ffff-ffff-ffff-ffffffffffff"
"""Stands for the subscriber id in the disconnect URL handed to the pages' scripts (the
session id's placeholder, where there is one, is all zeros)."""


async def _operator_name(request: HttpRequest) -> str:
    """The logged-in active staff user's name; a 403 ``forbidden`` for anyone else.

    A request with ``Authorization`` is refused too: a token is never an operator.
    """
    if "Authorization" not in request.headers:
        user = await request_user(request)
        if is_operator(user):
            return str(user.get_username())
    raise ApiError(403, "forbidden", "operators only: log in as a staff user")


async def _known_session(raw_session_id: str) -> str:
    """The normalized id of an existing session (open or closed), else a 404 ``not_found``."""
    session_id = normalize_session_id(raw_session_id)
    if session_id is None or await session_row(session_id) is None:
        raise ApiError(404, "not_found", "unknown session")
    return session_id


@api_view("GET", "HEAD")
async def session_subscribers(request: HttpRequest, session_id: str) -> HttpResponse:
    """``GET /session/<id>/subscribers``: the session's current subscribers, oldest first.

    Shape: ``{"process": <this process>, "subscribers": [{"id", "process", "user",
    "clientId", "address", "since" (epoch s), "lastEventId" (None before any event), "lag"
    (events behind the head), "queuedFrames", "queuedBytes", "bytesPerSecond"}]}``, over
    every server process; another process's rows are at most one report interval
    (``PROCESS_TTL_S / 4``) old. A closed session has none. Costs no work per frame: the
    rows read each queue's counters and a byte counter the stream keeps per ``send``.

    Errors: 403 ``forbidden`` (not active staff), 404 ``not_found``, 503.
    """
    await _operator_name(request)
    session_id = await _known_session(session_id)
    backend = get_backend()
    rows = await backend.list_subscribers(session_id)
    return JsonResponse({"process": backend.process_id, "subscribers": rows})


MAX_CLIENT_ID_LENGTH: Final = 200
"""The longest ``X-Client-Id`` kept (the stream keeps its first 200 characters)."""


@api_view("GET", "HEAD")
async def reader_status(request: HttpRequest, session_id: str, client_id: str) -> HttpResponse:
    """``GET /session/<id>/readers/<client id>``: is a reader with that ``X-Client-Id`` on?

    For the session page, whose paused reader may be evicted by the server unseen (a paused
    ``fetch`` body is not read, so its end is not noticed either). Needs ``read`` access: a
    read token of the session, or the login session of its owner or active staff.

    Shape: ``{"clientId", "connected" (a current subscriber sent that X-Client-Id),
    "lastEventId" (the highest id sent to such a subscriber; None when none is connected
    or before any event)}``, over every server process (another process's rows are at most
    ``PROCESS_TTL_S / 4`` old). A closed session has no readers.

    Errors: 400 ``invalid_request`` (client id over 200 characters), 401, 403 ``forbidden``
    (a token of another session), 404 ``not_found``, 503.
    """
    normalized = normalize_session_id(session_id)
    if normalized is None:
        raise ApiError(404, "not_found", "unknown session")
    if len(client_id) > MAX_CLIENT_ID_LENGTH:
        raise ApiError(
            400, "invalid_request", "client id is longer than 200 characters", field="clientId"
        )
    principal = await authenticate(
        request.headers.get("Authorization"), lambda: request_user(request)
    )
    await check_access_by_row(principal, normalized, "read")
    rows = [
        row
        for row in await get_backend().list_subscribers(normalized)
        if row.get("clientId") == client_id
    ]
    sent = [row["lastEventId"] for row in rows if row.get("lastEventId") is not None]
    return JsonResponse(
        {"clientId": client_id, "connected": bool(rows), "lastEventId": max(sent, default=None)}
    )


@api_view("POST")
async def disconnect_subscriber(
    request: HttpRequest, session_id: str, subscriber_id: str
) -> HttpResponse:
    """``POST /session/<id>/subscribers/<subscriber id>/disconnect``: end one subscriber.

    The subscriber gets, after what is already queued for it, the terminal frame
    ``stream_error`` ``{"code": "server_disconnect", "reason": "operator_disconnect"}``
    and its stream ends; the session and every other subscriber go on, and the client may
    reconnect with its cursor. Its record ends ``operator_disconnect`` with detail
    ``by <operator>``; one log line names the operator. Works across processes: a
    subscriber of another process is ended there (the backend relays the request).

    Shape: ``{"disconnected": true, "session", "subscriber", "process" (where it was),
    "relayed" (whether it was asked of another process), "by"}``.

    Errors: 403 ``forbidden`` (not active staff), 403 ``csrf_failed``, 404 ``not_found``
    (session), 404 ``subscriber_not_found`` (no current subscriber with that id), 503.
    """
    operator = await _operator_name(request)
    enforce_csrf(request)
    session_id = await _known_session(session_id)
    backend = get_backend()
    row = _find(await backend.list_subscribers(session_id), subscriber_id)
    local = row["process"] == backend.process_id
    found = await backend.disconnect_subscriber(
        session_id, row["id"], reason=OPERATOR_DISCONNECT, by=operator
    )
    if not found:
        raise ApiError(404, "subscriber_not_found", "no such subscriber (it may have left)")
    logger.info(
        "operator_disconnect session=%s subscriber=%s by=%s process=%s relayed=%s",
        session_id,
        row["id"],
        sanitize_for_log(operator),
        sanitize_for_log(str(row["process"])),
        not local,
    )
    return JsonResponse(
        {
            "disconnected": True,
            "session": session_id,
            "subscriber": row["id"],
            "process": row["process"],
            "relayed": not local,
            "by": operator,
        }
    )


def _find(rows: list[dict[str, Any]], subscriber_id: str) -> dict[str, Any]:
    """The row of ``subscriber_id`` (a connection id, any UUID spelling), else a 404."""
    try:
        wanted = str(uuid.UUID(subscriber_id))
    except ValueError:
        wanted = None
    for row in rows:
        if wanted is not None and row.get("id") == wanted:
            return row
    raise ApiError(404, "subscriber_not_found", "no such subscriber (it may have left)")
