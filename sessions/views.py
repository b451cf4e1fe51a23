"""The session API (spec section 5): thin async views over ``sessions.runtime``.

Every error is JSON ``{"error": <what is wrong>, "code": <machine code>}`` with a 4xx
status and one log line on ``qwenweb.api``. Requests authenticate with
``Authorization: Bearer <token>`` (``sessions.auth``) or, from a browser, with the Django
login session; the latter must pass the CSRF check on unsafe methods.

``GET /session/<id>/events`` (the stream) is served by ``sessions.stream``, routed in
front of Django by ``qwenweb.asgi``.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final

import orjson
from channels.db import database_sync_to_async
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt

from sessions import runtime
from sessions.auth import TokenClaims, TokenError, issue_token, parse_bearer, verify_token
from sessions.bus import MAX_EVENT_RING_SIZE
from sessions.conf import get_config
from sessions.models import AgentSession, normalize_session_id
from sessions.queries import request_user, session_row
from sessions.sse import sanitize_for_log

logger = logging.getLogger("qwenweb.api")

MAX_QUEUED_MIN: Final = 16
MAX_QUEUED_MAX: Final = 2048
MAX_QUEUED_DEFAULT: Final = 256
MAX_DATA_DEPTH: Final = 64
MAX_TYPE_LENGTH: Final = 200
MAX_TITLE_LENGTH: Final = 200
_PUBLISH_FIELDS: Final = frozenset({"type", "data", "_meta", "originatorClientId"})
#: Types the bus and the route make up (synthetic frames) or the server publishes itself:
#: a publisher may not forge them, since clients act on them (SC-12).
RESERVED_TYPES: Final = frozenset(
    {
        "slow_client_warning",
        "client_evicted",
        "state_resync_required",
        "replay_complete",
        "stream_error",
        "history_truncated",
        "session_closed",
    }
)
# A run of 19+ digits may be an integer beyond 64 bits, which orjson reads as a float.
_LONG_DIGITS: Final = re.compile(rb"[0-9]{19,}")

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
    "maxQueued": {"min": MAX_QUEUED_MIN, "max": MAX_QUEUED_MAX, "default": MAX_QUEUED_DEFAULT},
}


class ApiError(Exception):
    """Raised inside a view to answer ``status`` with a JSON error body."""

    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra


def error_response(status: int, code: str, message: str, **extra: Any) -> JsonResponse:
    """Return ``{"error": message, "code": code, **extra}`` with ``status``."""
    return JsonResponse({"error": message, "code": code, **extra}, status=status)


def _fail(request: HttpRequest, exc: ApiError) -> JsonResponse:
    logger.warning(
        "api_rejected method=%s path=%s status=%d code=%s error=%s",
        request.method,
        sanitize_for_log(request.path, 120),
        exc.status,
        exc.code,
        sanitize_for_log(exc.message, 200),
    )
    response = error_response(exc.status, exc.code, exc.message, **exc.extra)
    if exc.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="qwenweb"'
    return response


class _CsrfCheck(CsrfViewMiddleware):
    def _reject(self, request: HttpRequest, reason: str) -> HttpResponse:
        raise ApiError(403, "csrf_failed", f"CSRF check failed: {reason}")


def _enforce_csrf(request: HttpRequest) -> None:
    check = _CsrfCheck(lambda r: HttpResponse())
    check.process_request(request)
    check.process_view(request, lambda r: HttpResponse(), (), {})


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a token's claims, or a logged-in user."""

    claims: TokenClaims | None
    user_id: int | None
    is_staff: bool
    name: str


async def _authenticate(request: HttpRequest) -> Principal:
    header = request.headers.get("Authorization")
    if header is not None:
        try:
            claims = verify_token(parse_bearer(header))
        except TokenError as exc:
            raise ApiError(401, "unauthorized", str(exc)) from None
        return Principal(claims, None, False, claims.subject)
    user = await request_user(request)
    if not user.is_authenticated:
        raise ApiError(
            401, "unauthorized", "authentication required: send Authorization: Bearer <token>"
        )
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        _enforce_csrf(request)
    return Principal(None, user.pk, user.is_staff, user.get_username())


def _check_access(principal: Principal, session_id: str, owner_id: int | None, scope: str) -> None:
    if principal.claims is not None:
        if not principal.claims.grants(session_id, scope):
            raise ApiError(403, "forbidden", f"this token does not grant {scope} access here")
    elif not (principal.is_staff or (owner_id is not None and owner_id == principal.user_id)):
        raise ApiError(403, "forbidden", "only the session's owner or staff may do this")


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


def _parse_json_body(request: HttpRequest, *, required: bool) -> Any:
    """Return the request's JSON body; ``{}`` when empty and not ``required``.

    Raises ``ApiError``: 413 above ``PUBLISH_MAX_BODY_BYTES`` (declared or chunked), 400
    when it is not JSON (NaN and Infinity are not JSON). Integers beyond 64 bits keep
    their exact value (orjson would read them as floats).
    """
    limit = get_config().publish_max_body_bytes
    too_large = ApiError(413, "body_too_large", f"body exceeds {limit} bytes", limit=limit)
    try:
        declared = int(request.headers.get("Content-Length") or 0)
    except ValueError:
        raise ApiError(400, "invalid_request", "Content-Length is not a number") from None
    if declared > limit:
        raise too_large
    try:
        body = request.body
    except RequestDataTooBig:
        raise too_large from None
    if len(body) > limit:
        raise too_large
    if not body.strip():
        if required:
            raise ApiError(400, "invalid_json", "a JSON object body is required", field="")
        return {}
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "invalid_json", f"body is not valid JSON: {exc}", field="") from None
    if _LONG_DIGITS.search(body):
        parsed = json.loads(body, parse_constant=_reject_constant)  # orjson validated it
    return parsed


def _reject_constant(name: str) -> Any:
    raise ApiError(400, "invalid_json", f"body is not valid JSON: {name} is not allowed", field="")


def _json_depth_exceeds(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def validate_publish_body(body: Any) -> dict[str, Any]:
    """Return the event to publish from a request body, or raise a 400 ``ApiError``.

    Shape: ``{"type": str (1..200 chars, no CR/LF/NUL), "data": any JSON (nesting <= 64),
    "_meta": object (optional), "originatorClientId": str (optional)}``; other keys are
    refused so a typo is not silently dropped. The error names the field.
    """
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_event", "body must be a JSON object", field="")
    unknown = sorted(sanitize_for_log(key, 40) for key in set(body) - _PUBLISH_FIELDS)
    if unknown:
        raise ApiError(
            400, "invalid_event", f"unknown field(s): {', '.join(unknown[:5])}", field=unknown[0]
        )
    event_type = body.get("type")
    if not isinstance(event_type, str) or not event_type:
        raise ApiError(400, "invalid_event", "type must be a non-empty string", field="type")
    if len(event_type) > MAX_TYPE_LENGTH or any(ch in event_type for ch in "\r\n\0"):
        raise ApiError(
            400,
            "invalid_event",
            f"type must be at most {MAX_TYPE_LENGTH} characters without CR, LF or NUL",
            field="type",
        )
    if event_type in RESERVED_TYPES:
        raise ApiError(
            400,
            "invalid_event",
            f"type {event_type!r} is reserved for frames the server makes",
            field="type",
        )
    if "_meta" in body and not isinstance(body["_meta"], dict):
        raise ApiError(400, "invalid_event", "_meta must be an object", field="_meta")
    originator = body.get("originatorClientId")
    if originator is not None and (not isinstance(originator, str) or len(originator) > 200):
        raise ApiError(
            400,
            "invalid_event",
            "originatorClientId must be a string of at most 200 characters",
            field="originatorClientId",
        )
    if _json_depth_exceeds(body.get("data"), MAX_DATA_DEPTH) or _json_depth_exceeds(
        body.get("_meta"), MAX_DATA_DEPTH
    ):
        raise ApiError(
            400,
            "invalid_event",
            f"data is nested deeper than {MAX_DATA_DEPTH} levels",
            field="data",
        )
    return body


def session_urls(request: HttpRequest, session_id: str) -> dict[str, str]:
    """Return the absolute URLs of a session's endpoints."""
    return {
        "events": request.build_absolute_uri(reverse("session-events", args=[session_id])),
        "load": request.build_absolute_uri(reverse("session-detail", args=[session_id])),
        "close": request.build_absolute_uri(reverse("session-close", args=[session_id])),
        "token": request.build_absolute_uri(reverse("session-token", args=[session_id])),
    }


_View = Callable[..., Coroutine[Any, Any, HttpResponse]]


def api_view(*methods: str) -> Callable[[_View], _View]:
    """Make an async view a JSON API endpoint accepting ``methods``.

    Other methods get a JSON 405 with ``Allow``; an ``ApiError`` raised inside becomes its
    JSON error and one log line; a database failure, or the Redis backend out of reach,
    becomes a JSON 503 (never a 500 page).
    CSRF is checked by ``_authenticate`` for login-session callers only (bearer tokens are
    not ambient credentials), so Django's middleware is told to skip these views.
    """

    def decorate(view: _View) -> _View:
        @csrf_exempt
        @functools.wraps(view)
        async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in methods:
                response = error_response(
                    405, "method_not_allowed", f"use {' or '.join(methods)} here"
                )
                response["Allow"] = ", ".join(methods)
                return response
            try:
                return await view(request, *args, **kwargs)
            except ApiError as exc:
                return _fail(request, exc)
            except DatabaseError as exc:
                logger.error(
                    "database_unavailable method=%s path=%s error=%s",
                    request.method,
                    sanitize_for_log(request.path, 120),
                    sanitize_for_log(str(exc), 200),
                )
                return error_response(503, "unavailable", "the database is busy; try again")
            except runtime.BackendUnavailableError as exc:
                logger.error(
                    "backend_unavailable method=%s path=%s error=%s",
                    request.method,
                    sanitize_for_log(request.path, 120),
                    sanitize_for_log(str(exc), 200),
                )
                response = error_response(
                    503,
                    "backend_unavailable",
                    "the event store (Redis) is unavailable; try again shortly",
                )
                response["Retry-After"] = "3"
                return response

        return wrapper

    return decorate


# -- views ------------------------------------------------------------------------------


@api_view("GET", "HEAD")
async def capabilities(request: HttpRequest) -> HttpResponse:
    """``GET /capabilities``: what this server supports (section 5)."""
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
    body = _parse_json_body(request, required=False)
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


async def _open_session(principal: Principal, session_id: str, scope: str) -> runtime.LiveSession:
    """Check access and return the loaded session.

    A token is checked before anything is loaded, so it learns nothing about sessions it
    has no access to (always 403). Raises ``ApiError`` 403/404, or
    ``runtime.SessionClosedError`` after the access check.
    """
    if principal.claims is not None:
        _check_access(principal, session_id, None, scope)
    try:
        live = await runtime.get_live_session(session_id)
    except runtime.SessionNotFoundError:
        raise ApiError(404, "not_found", "unknown session") from None
    except runtime.SessionClosedError as closed:
        _check_access(principal, session_id, closed.owner_id, scope)
        raise
    _check_access(principal, session_id, live.owner_id, scope)
    return live


@api_view("GET", "HEAD")
async def load_session(request: HttpRequest, session_id: str) -> HttpResponse:
    """``GET /session/<id>``: the snapshot a client rebuilds from after a resync (section 5).

    Needs ``read`` access. 404 unknown; a closed session answers the same shape with
    ``"status": "closed"``, no epoch and no events. The snapshot holds every event
    published before the request, on any process (``runtime.caught_up``).
    """
    session_id = _session_id_or_404(session_id)
    principal = await _authenticate(request)
    try:
        live = await runtime.caught_up(await _open_session(principal, session_id, "read"))
    except runtime.SessionClosedError:
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
    subscribers = None
    if runtime.using_redis():  # every process's subscribers, not only this one's
        stats = (await runtime.operator_stats([session_id])).get(session_id)
        subscribers = stats.subscriber_count if stats is not None else 0
    return HttpResponse(runtime.snapshot_json(live, subscribers), content_type="application/json")


@api_view("POST")
async def session_events(request: HttpRequest, session_id: str) -> HttpResponse:
    """``POST /session/<id>/events``: publish one event; 200 ``{"id": N, "epoch": ...}``.

    Needs ``publish`` access. 400 names the bad field; 409 when the session is closed;
    413 when the body exceeds ``PUBLISH_MAX_BODY_BYTES``. (``GET`` is the stream, served
    by ``sessions.stream`` in front of Django.)
    """
    session_id = _session_id_or_404(session_id)
    principal = await _authenticate(request)
    if principal.claims is not None:  # a token without publish access learns nothing more
        _check_access(principal, session_id, None, "publish")
    event = validate_publish_body(_parse_json_body(request, required=True))
    try:
        live = await _open_session(principal, session_id, "publish")
    except runtime.SessionClosedError:
        raise ApiError(409, "session_closed", "the session is closed") from None
    try:
        published = await runtime.publish(live, event)
    except runtime.SessionClosedError:  # closed on another process meanwhile
        raise ApiError(409, "session_closed", "the session is closed") from None
    except runtime.SessionNotFoundError:  # deleted meanwhile
        raise ApiError(404, "not_found", "unknown session") from None
    if published is None:
        raise ApiError(409, "session_closed", "the session is closed")
    return JsonResponse({"id": published.id, "epoch": published.epoch})


@api_view("POST")
async def close_session(request: HttpRequest, session_id: str) -> HttpResponse:
    """``POST /session/<id>/close``: publish ``session_closed``, close the bus (section 5).

    Needs ``publish`` access. Idempotent: closing a closed session answers 200 with
    ``"alreadyClosed": true``.
    """
    session_id = _session_id_or_404(session_id)
    principal = await _authenticate(request)
    try:
        await _open_session(principal, session_id, "publish")
        last_id = await runtime.close_session(session_id, reason="closed", closed_by=principal.name)
    except runtime.SessionClosedError:
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
    if not user.is_authenticated:
        raise ApiError(401, "unauthorized", "log in to obtain a token")
    _enforce_csrf(request)
    if request.content_type in _FORM_TYPES:
        scope: Any = request.POST.get("scope", "read")
    else:
        body = _parse_json_body(request, required=False)
        scope = body.get("scope", "read") if isinstance(body, dict) else None
    if scope not in ("read", "publish"):
        raise ApiError(400, "invalid_request", "scope must be 'read' or 'publish'", field="scope")
    row = await session_row(session_id)
    if row is None:
        raise ApiError(404, "not_found", "unknown session")
    principal = Principal(None, user.pk, user.is_staff, user.get_username())
    _check_access(principal, session_id, row.owner_id, scope)
    return JsonResponse(
        {
            "token": issue_token(session_id, [scope], principal.name),
            "scope": scope,
            "sessionId": session_id,
            "expiresInS": get_config().token_lifetime_s,
        }
    )
