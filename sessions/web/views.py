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
import unicodedata
from collections.abc import AsyncIterator, Iterator
from typing import Any, Final

from channels.db import database_sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import reverse

from sessions.auth import (
    Principal,
    authenticate,
    check_access,
    check_access_by_row,
    check_token_scope,
    issue_current_token,
)
from sessions.backends import get_backend
from sessions.backends.base import (
    BackendUnavailableError,
    IdempotencyKey,
    IdempotencyKeyReusedError,
    LiveSession,
    Published,
    QuotaExceededError,
    SessionClosedError,
    SessionNotFoundError,
    SnapshotPage,
)
from sessions.bus import (
    DEFAULT_MAX_QUEUED,
    MAX_EVENT_RING_SIZE,
    MAX_QUEUED_MAX,
    MAX_QUEUED_MIN,
    MAX_SAFE_INTEGER,
)
from sessions.conf import SNAPSHOT_MAX_LIMIT, get_config
from sessions.errors import ApiError, quota_exceeded
from sessions.models import AgentSession, normalize_session_id
from sessions.queries import request_user, session_row
from sessions.web.offload import json_values_bound, off_loop_if_heavy, parse_cost
from sessions.web.responses import api_view, enforce_csrf
from sessions.web.validation import (
    MAX_TITLE_LENGTH,
    idempotency_key,
    parse_json,
    read_body,
    refuse_unknown_fields,
    validate_publish_body,
)
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


_CREATE_FIELDS: Final = frozenset({"title", "ringSize", "streamCompression"})


_TITLE_REFUSED: Final = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"  # bidi
    "\u2028\u2029\ufeff"  # line and paragraph separators, byte order mark
)
"""Format characters a title may not hold: the bidirectional marks, embeddings, overrides
and isolates (a title could turn the text around it in the lists: CVE-2021-42574's
"Trojan Source"), the Unicode line breaks and the BOM. Other format characters stay
(zero-width joiners build emoji and Indic text)."""


def _printable(text: str) -> bool:
    """No control character (NUL included: PostgreSQL's text refuses it; a newline or an
    escape in a title would also reach the pages and the log lines) and none of
    :data:`_TITLE_REFUSED`."""
    return not any(unicodedata.category(char) == "Cc" or char in _TITLE_REFUSED for char in text)


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
    ``[1, 1_000_000]``; at most ``MAX_USER_RING_SIZE`` for a user who is not staff, else
    400), ``streamCompression`` (bool, default true; false: the session's streams are
    never gzipped, EB-17; anything else 400). Auth: a logged-in user (CSRF-checked) or a
    ``create`` token. A user (not staff) with ``MAX_SESSIONS_PER_USER`` open sessions
    gets 429 ``quota_exceeded`` (docs/protocol.md, "Quotas").
    """
    principal = await _authenticate(request)
    if principal.claims is not None and "create" not in principal.claims.scopes:
        raise ApiError(403, "forbidden", "this token does not grant create access")
    body = await _optional_json_body(request)
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_request", "body must be a JSON object", field="")
    refuse_unknown_fields(body, _CREATE_FIELDS, "invalid_request")
    title = body.get("title", "")
    if not isinstance(title, str) or len(title) > MAX_TITLE_LENGTH or not _printable(title):
        raise ApiError(
            400,
            "invalid_request",
            "title must be a string of at most 200 characters without control characters, "
            "bidirectional controls or line separators",
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
    compression = body.get("streamCompression", True)
    if not isinstance(compression, bool):
        raise ApiError(
            400,
            "invalid_request",
            "streamCompression must be true or false",
            field="streamCompression",
        )
    try:
        row, tokens = await database_sync_to_async(_create_row_sync)(
            title, ring_size, principal, compression
        )
    except QuotaExceededError as exc:
        raise quota_exceeded(exc) from None
    logger.info("session_created session=%s by=%s", row.id, sanitize_for_log(principal.name))
    return JsonResponse(
        {
            "id": row.id,
            "title": row.title,
            "status": row.status,
            "streamCompression": row.stream_compression,
            "urls": session_urls(request, row.id),
            "tokens": tokens,
        },
        status=201,
    )


def _create_row_sync(
    title: str, ring_size: int | None, principal: Principal, stream_compression: bool = True
) -> tuple[AgentSession, dict[str, str]]:
    """Create the row and its read and publish tokens (with the owner's id and versions).

    The owner: the logged-in user; for a token, the user whose id it carries (checked
    current by ``authenticate``); for a token issued before ids were carried, the user
    whose username is its subject, if any.
    """
    claims = principal.claims
    owner_id = principal.user_id
    if owner_id is None and claims is not None:
        owner_id = claims.user_id
        if owner_id is None and claims.subject:
            from django.contrib.auth import get_user_model

            owner_id = (
                get_user_model()
                .objects.filter(username=claims.subject)
                .values_list("pk", flat=True)
                .first()
            )
    _check_owner_quotas(owner_id, ring_size)
    row = AgentSession.objects.create(
        title=title, ring_size=ring_size, owner_id=owner_id, stream_compression=stream_compression
    )
    tokens = {
        scope: issue_current_token(row.id, [scope], principal.name, user_id=owner_id)
        for scope in ("read", "publish")
    }
    return row, tokens


def _check_owner_quotas(owner_id: int | None, ring_size: int | None) -> None:
    """The creation quotas of a user who is not staff (docs/protocol.md, "Quotas"):
    ``ringSize`` at most ``MAX_USER_RING_SIZE`` (400) and at most ``MAX_SESSIONS_PER_USER``
    open sessions (:class:`QuotaExceededError`). Sessions without an owner (operator
    tokens) and staff have none. Checked when the row is created (not locked: two
    concurrent creations may both pass)."""
    if owner_id is None:
        return
    from django.contrib.auth import get_user_model

    if get_user_model().objects.filter(pk=owner_id, is_staff=True).exists():
        return
    config = get_config()
    if ring_size is not None and ring_size > config.max_user_ring_size:
        raise ApiError(
            400,
            "invalid_request",
            f"ringSize must be at most {config.max_user_ring_size} (MAX_USER_RING_SIZE)",
            field="ringSize",
            limit=config.max_user_ring_size,
        )
    limit = config.max_sessions_per_user
    open_count = AgentSession.objects.filter(
        owner_id=owner_id, status=AgentSession.Status.OPEN
    ).count()
    if open_count >= limit:
        raise QuotaExceededError(
            "MAX_SESSIONS_PER_USER",
            limit,
            60,
            f"at most {limit} open sessions per user (MAX_SESSIONS_PER_USER); close one",
        )


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
    except BackendUnavailableError:
        await check_access_by_row(principal, session_id, scope)  # an outage tells no ids
        raise
    except SessionClosedError as closed:
        check_access(principal, session_id, closed.owner_id, scope)
        raise
    check_access(principal, session_id, live.owner_id, scope)
    return live


@api_view("GET", "HEAD")
async def load_session(
    request: HttpRequest, session_id: str
) -> HttpResponse | StreamingHttpResponse:
    """``GET /session/<id>?limit=N&before=<id>&compact=1``: the snapshot a client rebuilds from.

    Needs ``read`` access. Answers the newest ``limit`` events (default ``SNAPSHOT_LIMIT``,
    at most ``SNAPSHOT_MAX_LIMIT``) with an id below ``before``, within
    ``SNAPSHOT_MAX_BYTES``, with ``hasOlder`` / ``firstEventId`` to page back; written out
    as it is read (``SnapshotPage.chunks``). 400 ``invalid_request`` (``field`` ``limit`` or
    ``before``) for a value that is not an integer in range (``compact``: not 0 or 1);
    ``compact=1`` merges runs of token events (:meth:`SnapshotPage.compacted`, the same
    ``limit`` of raw events); 404 unknown; a closed session answers the same shape with
    ``"status": "closed"`` and ``closedAt``: the history the backend still holds
    (``CLOSED_HISTORY_S``), else no epoch and no events. The snapshot holds every event
    published before the request, on any process.
    """
    session_id = _session_id_or_404(session_id)
    limit = _query_int(request, "limit", SNAPSHOT_MAX_LIMIT)
    before = _query_int(request, "before", MAX_SAFE_INTEGER)
    compact = _query_flag(request, "compact")
    principal = await _authenticate(request)
    try:
        live = await _open_session(principal, session_id, "read")
        page = await get_backend().snapshot(live, limit=limit, before=before)
    except SessionClosedError:
        page = await _closed_snapshot(await _row_or_404(session_id), limit, before)
    if compact:
        page = page.compacted()
    if request.method == "HEAD":
        return HttpResponse(content_type="application/json")
    return StreamingHttpResponse(_aiter(page.chunks()), content_type="application/json")


async def _closed_snapshot(
    row: AgentSession, limit: int | None, before: int | None
) -> SnapshotPage:
    """A closed session's snapshot: the history the backend still holds (``CLOSED_HISTORY_S``)
    with ``closedAt``, else the same shape with no events and no epoch."""
    closed_at = row.closed_at.isoformat() if row.closed_at else None
    page = await get_backend().closed_snapshot(row, limit=limit, before=before)
    if page is not None:
        return SnapshotPage({**page.head, "closedAt": closed_at}, page.events)
    head = {
        "id": row.id,
        "title": row.title,
        "status": row.status,
        "createdAt": row.created_at.isoformat(),
        "closedAt": closed_at,
        "lastEventId": row.last_event_id,
        "epoch": None,
        "subscriberCount": 0,
        "ringSize": row.ring_size or get_config().ring_size,
        "earliestAvailableId": None,
        "firstEventId": None,
        "hasOlder": False,
    }
    return SnapshotPage(head, ())


async def _aiter(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    # An async iterator: Django would otherwise collect a sync one into a list first.
    for chunk in chunks:
        yield chunk


def _query_flag(request: HttpRequest, name: str) -> bool:
    """The query parameter ``name`` as ``0``/``1`` (absent: False).

    Raises ``ApiError`` 400 ``invalid_request`` with ``field`` = ``name`` for any other value
    or a repeated parameter.
    """
    values = request.GET.getlist(name)
    if values and (len(values) > 1 or values[0] not in ("0", "1")):
        raise ApiError(400, "invalid_request", f"{name} must be given once, as 0 or 1", field=name)
    return values == ["1"]


def _query_int(request: HttpRequest, name: str, maximum: int) -> int | None:
    """The query parameter ``name`` as an integer in [1, ``maximum``], or None when absent.

    Raises ``ApiError`` 400 ``invalid_request`` with ``field`` = ``name`` otherwise, also
    when it is given more than once (as for the stream's ``maxQueued``).
    """
    values = request.GET.getlist(name)
    if not values:
        return None
    raw = values[0]
    if not (
        len(values) == 1
        and raw.isascii()
        and raw.isdigit()
        and len(raw) <= 16
        and 1 <= int(raw) <= maximum
    ):
        problem = "must be given once" if len(values) > 1 else "must be"
        raise ApiError(
            400,
            "invalid_request",
            f"{name} {problem} an integer in [1, {maximum}]",
            field=name,
            limit=maximum,
        )
    return int(raw)


REPLAYED_HEADER: Final = "Idempotent-Replayed"
"""Set to ``true`` on an answer that repeats an idempotent request's first result."""


def _key_reused(idempotency: IdempotencyKey) -> ApiError:
    return ApiError(
        422,
        "idempotency_key_reused",
        "this Idempotency-Key was first sent with another request; use a new key",
        log_extra=f" key={sanitize_for_log(idempotency.key, 60)!r}",
    )


async def _recall(session_id: str, idempotency: IdempotencyKey | None) -> Published | None:
    """The first result of ``idempotency`` in a session found closed (None: unknown)."""
    if idempotency is None:
        return None
    try:
        return await get_backend().recall(session_id, idempotency)
    except IdempotencyKeyReusedError:
        raise _key_reused(idempotency) from None


def _published_response(published: Published) -> HttpResponse:
    response = JsonResponse({"id": published.id, "epoch": published.epoch})
    if published.replayed:
        response[REPLAYED_HEADER] = "true"
    return response


def _publisher(principal: Principal) -> str:
    """Whom the JSON-values quota charges: the user, else the token's subject."""
    claims = principal.claims
    user_id = principal.user_id if claims is None else claims.user_id
    return f"user:{user_id}" if user_id is not None else f"name:{principal.name}"


def _parse_publish(
    request: HttpRequest, body: bytes
) -> tuple[IdempotencyKey | None, dict[str, Any]]:
    """The key and the event of a publish (CPU in proportion to the body's JSON values:
    run on the body workers). Raises ``ApiError`` 400 (key first, then the body)."""
    idempotency = idempotency_key(request, "events")
    return idempotency, validate_publish_body(parse_json(body, required=True))


async def _optional_json_body(request: HttpRequest) -> Any:
    """The request's JSON body, ``{}`` when empty (:func:`parse_json`), parsed off the loop
    when large (:func:`off_loop_if_heavy`). Raises ``ApiError`` 400 / 413."""
    raw = read_body(request)
    return await off_loop_if_heavy(raw, json_values_bound(raw), parse_json, raw, required=False)


@api_view("POST", served_elsewhere=("GET", "HEAD"))  # GET, HEAD: the stream route
async def session_events(request: HttpRequest, session_id: str) -> HttpResponse:
    """``POST /session/<id>/events``: publish one event; 200 ``{"id": N, "epoch": ...}``.

    Needs ``publish`` access. 400 names the bad field; 409 when the session is closed; 413
    when the body exceeds ``PUBLISH_MAX_BODY_BYTES``, 413 ``too_many_values`` when it holds
    more than ``PUBLISH_MAX_VALUES`` JSON values (charged that many); 429 ``rate_limited``
    past the session's ``PUBLISH_RATE_PER_S`` / ``PUBLISH_BYTES_PER_S``, or past the JSON
    values of ``PUBLISH_VALUES_PER_S`` (session) / ``PUBLISH_USER_VALUES_PER_S`` (user),
    charged before the body is parsed (off the loop when large: ``sessions.web.offload``);
    503 ``draining`` while a memory-backend process drains (the event would be lost with
    it). With an ``Idempotency-Key`` a repeat answers the first result
    (``Idempotent-Replayed: true``, over a quota too) and publishes nothing; the key with
    another body is 422 ``idempotency_key_reused``. (``GET`` is the stream, served by
    ``sessions.transport.stream`` in front of Django.)
    """
    session_id = _session_id_or_404(session_id)
    principal = await _authenticate(request)
    check_token_scope(principal, session_id, "publish")  # learns nothing more without it
    body = read_body(request)
    config = get_config()
    values, limit = json_values_bound(body), config.publish_max_values
    quota = get_backend().values_quota
    if values > limit:  # one parse holds the GIL, the loop's too: bounded per body
        try:  # its count was work too: a flood of refused bodies meets the quota
            quota.charge(session_id, _publisher(principal), limit)
        except QuotaExceededError as exc:
            raise quota_exceeded(exc) from None
        raise ApiError(
            413,
            "too_many_values",
            f"body holds more than {limit} JSON values (PUBLISH_MAX_VALUES; counted as "
            "1 + its '[', '{' and ',' characters)",
            limit=limit,
        )
    cost = parse_cost(body, values, config.publish_values_per_s, config.publish_bytes_per_s)
    try:
        quota.charge(session_id, _publisher(principal), cost)
    except QuotaExceededError as exc:
        raise quota_exceeded(exc) from None
    idempotency, event = await off_loop_if_heavy(body, values, _parse_publish, request, body)
    try:
        live = await _open_session(principal, session_id, "publish")
    except SessionClosedError:
        replay = await _recall(session_id, idempotency)
        if replay is not None:  # published before the session closed: its first answer
            return _published_response(replay)
        raise ApiError(409, "session_closed", "the session is closed") from None
    backend = get_backend()
    if not backend.takes_publishes():
        raise ApiError(
            503,
            "draining",
            "the server is draining and keeps events in this process only: publish "
            "again once it has restarted",
        )
    try:
        backend.check_publish_quota(live, len(request.body))  # (a keyed retry counts too)
        published = await backend.publish(live, event, idempotency=idempotency)
    except QuotaExceededError as exc:
        # A retry of a publish that already went through gets its first answer, not 429.
        replay = await _recall(session_id, idempotency)
        if replay is not None:
            return _published_response(replay)
        raise quota_exceeded(exc) from None
    except IdempotencyKeyReusedError:
        assert idempotency is not None
        raise _key_reused(idempotency) from None
    except SessionClosedError:  # closed on another process meanwhile
        raise ApiError(409, "session_closed", "the session is closed") from None
    except SessionNotFoundError:  # deleted meanwhile
        raise ApiError(404, "not_found", "unknown session") from None
    if published is None:
        replay = await _recall(session_id, idempotency)
        if replay is not None:
            return _published_response(replay)
        raise ApiError(409, "session_closed", "the session is closed")
    return _published_response(published)


def _closed_response(session_id: str, last_id: int, *, already: bool) -> JsonResponse:
    return JsonResponse(
        {"id": session_id, "status": "closed", "lastEventId": last_id, "alreadyClosed": already}
    )


@api_view("POST")
async def close_session(request: HttpRequest, session_id: str) -> HttpResponse:
    """``POST /session/<id>/close``: publish ``session_closed``, close the bus.

    Needs ``publish`` access. Idempotent: closing a closed session answers 200 with
    ``"alreadyClosed": true``; with the ``Idempotency-Key`` that closed it, the first
    answer again (``"alreadyClosed": false``, ``Idempotent-Replayed: true``).
    """
    session_id = _session_id_or_404(session_id)
    principal = await _authenticate(request)
    idempotency = idempotency_key(request, "close")
    try:
        await _open_session(principal, session_id, "publish")
        closed = await get_backend().close_session(
            session_id, reason="closed", closed_by=principal.name, idempotency=idempotency
        )
    except IdempotencyKeyReusedError:
        assert idempotency is not None
        raise _key_reused(idempotency) from None
    except SessionClosedError:
        replay = await _recall(session_id, idempotency)
        if replay is not None:
            response = _closed_response(session_id, replay.id, already=False)
            response[REPLAYED_HEADER] = "true"
            return response
        row = await _row_or_404(session_id)
        return _closed_response(session_id, row.last_event_id, already=True)
    return _closed_response(session_id, closed.id, already=False)


_FORM_TYPES: Final = ("application/x-www-form-urlencoded", "multipart/form-data")
_TOKEN_FIELDS: Final = frozenset({"scope"})
_TOKEN_FORM_FIELDS: Final = frozenset({"scope", "csrfmiddlewaretoken"})


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
        form = {key: request.POST.get(key) for key in request.POST}
        # (curl -d '{"scope": ...}' sends JSON as a form: refuse it rather than ignore it)
        refuse_unknown_fields(form, _TOKEN_FORM_FIELDS, "invalid_request")
        scope: Any = form.get("scope", "read")
    else:
        body = await _optional_json_body(request)
        if not isinstance(body, dict):
            raise ApiError(400, "invalid_request", "body must be a JSON object", field="")
        refuse_unknown_fields(body, _TOKEN_FIELDS, "invalid_request")
        scope = body.get("scope", "read")
    if scope not in ("read", "publish"):
        raise ApiError(400, "invalid_request", "scope must be 'read' or 'publish'", field="scope")
    row = await session_row(session_id)
    if row is None:
        raise ApiError(404, "not_found", "unknown session")
    principal = Principal(None, user.pk, user.is_staff, user.get_username())
    check_access(principal, session_id, row.owner_id, scope)
    token = await database_sync_to_async(issue_current_token)(
        session_id, [scope], principal.name, user_id=user.pk
    )
    return JsonResponse(
        {
            "token": token,
            "scope": scope,
            "sessionId": session_id,
            "expiresInS": get_config().token_lifetime_s,
        }
    )
