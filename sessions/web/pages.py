"""The user's pages: the session list and the live session page.

Routes (``sessions/urls.py``):

- ``GET /sessions/`` — the logged-in user's sessions (staff see all), with a "new session"
  button that calls ``POST /session`` (login + CSRF, :mod:`sessions.web.views`).
- ``GET /sessions/<id>/`` — the live session page: a template plus
  ``static/qwenweb/session_page.js``, which reads the stream with ``fetch``, the
  reconnecting client of ``static/qwenweb/sse.js`` and its hand-written parser
  (``sse_parser.js``; SC-1 ... SC-13). Login required
  (redirect to ``LOGIN_URL``), owner or active staff; anyone else gets the 404 page of
  an unknown id.

The pages are plain synchronous views (Django runs them in its thread pool under ASGI).
The demo agent's endpoint is :mod:`sessions.web.demo`.
"""

from __future__ import annotations

from typing import Final

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_safe

from sessions.auth import can_view, is_operator
from sessions.backends import get_backend
from sessions.backends.base import BackendUnavailableError
from sessions.bus import DEFAULT_MAX_QUEUED, MAX_QUEUED_MAX, MAX_QUEUED_MIN, BusStats
from sessions.conf import get_config
from sessions.models import AgentSession, normalize_session_id
from sessions.web.demo import DEMO_CHUNKS_PER_S, demo_agent_running
from sessions.web.subscribers import SUBSCRIBER_PLACEHOLDER

__all__ = ["session_list", "session_page"]

MAX_LISTED_SESSIONS: Final = 200


@require_safe
@login_required
def session_list(request: HttpRequest) -> HttpResponse:
    """``GET /sessions/``: the user's sessions, newest first (staff: everyone's).

    At most 200 rows, each with its live last id and subscriber count when its bus is
    loaded (every server process's; ``Backend.operator_stats_blocking``), else the last id
    saved in the database. The "new session" button posts to ``POST /session`` from
    ``static/qwenweb/session_list.js`` with the CSRF token of this page.
    """
    query = AgentSession.objects.select_related("owner").order_by("-created_at")
    if not request.user.is_staff:
        query = query.filter(owner_id=request.user.pk)
    rows = list(query[:MAX_LISTED_SESSIONS])
    live = _live_stats([row.id for row in rows])
    listed = [
        {
            "row": row,
            "last_id": stats.last_event_id if stats is not None else row.last_event_id,
            "subscribers": stats.subscriber_count if stats is not None else None,
        }
        for row in rows
        for stats in [live.get(row.id)]
    ]
    return render(
        request,
        "sessions/session_list.html",
        {
            "sessions": listed,
            "live_unavailable": live is _UNAVAILABLE,
            "max_listed": MAX_LISTED_SESSIONS,
            "create_url": reverse("session-create"),
            "id_placeholder": "00000000-0000-4000-8000-000000000000",
        },
    )


_UNAVAILABLE: Final[dict[str, BusStats]] = {}


def _live_stats(session_ids: list[str]) -> dict[str, BusStats]:
    """The live figures of the loaded sessions among ``session_ids`` (every process), read
    on the server loop; ``_UNAVAILABLE`` (empty) when the loop or the store does not answer
    in time (the list then shows the saved numbers and says so)."""
    try:
        return dict(get_backend().operator_stats_blocking(session_ids))
    except (TimeoutError, BackendUnavailableError):
        return _UNAVAILABLE


@require_safe
@login_required
def session_page(request: HttpRequest, session_id: str) -> HttpResponse:
    """``GET /sessions/<id>/``: the live session page.

    Renders ``sessions/session_page.html`` with a ``page_config`` JSON object for the
    script: ``{"sessionId", "title", "status", "ringSize", "streamCompression" (its streams
    may be gzipped: the deployment's and the session's switch), "urls": {"events", "load",
    "token", "demo", "list", "publish", "reader", "subscribers", "disconnect"},
    "maxQueued": {"min", "max", "default"}, "maxQueuedBytes", "demoChunksPerS",
    "demoRunning", "isOperator", "subscriberPlaceholder"}`` (paths, same origin;
    ``reader`` has ``subscriberPlaceholder`` in place of the page's client id).
    ``subscribers`` and ``disconnect`` (with ``subscriberPlaceholder`` in place of the
    subscriber id) are for active staff
    only, else None: only they get the live subscribers table; the owner and staff both
    get the publish console.

    Raises:
        Http404: malformed or unknown session id, or a session the user may not see
            (neither its owner nor active staff): the same page, so existence never leaks.
    """
    normalized = normalize_session_id(session_id)
    row = AgentSession.objects.filter(pk=normalized).first() if normalized else None
    if row is None or not can_view(request.user, row.owner_id):
        raise Http404("unknown session")
    operator = is_operator(request.user)
    page_config = {
        "sessionId": row.id,
        "title": row.title,
        "status": row.status,
        "ringSize": row.ring_size or get_config().ring_size,
        "streamCompression": row.stream_compression and get_config().stream_compression,
        "urls": {
            "events": reverse("session-events", args=[row.id]),
            "load": reverse("session-detail", args=[row.id]),
            "token": reverse("session-token", args=[row.id]),
            "demo": reverse("session-demo", args=[row.id]),
            "list": reverse("session-list"),
            "publish": reverse("session-events", args=[row.id]),
            "reader": reverse("session-reader", args=[row.id, SUBSCRIBER_PLACEHOLDER]),
            "subscribers": reverse("session-subscribers", args=[row.id]) if operator else None,
            "disconnect": (
                reverse("session-subscriber-disconnect", args=[row.id, SUBSCRIBER_PLACEHOLDER])
                if operator
                else None
            ),
        },
        "maxQueued": {"min": MAX_QUEUED_MIN, "max": MAX_QUEUED_MAX, "default": DEFAULT_MAX_QUEUED},
        "maxQueuedBytes": get_config().max_queued_bytes,
        "demoChunksPerS": DEMO_CHUNKS_PER_S,
        "demoRunning": demo_agent_running(row.id),
        "isOperator": operator,
        "subscriberPlaceholder": SUBSCRIBER_PLACEHOLDER,
    }
    return render(
        request,
        "sessions/session_page.html",
        {"session": row, "page_config": page_config, "is_operator": operator},
    )
