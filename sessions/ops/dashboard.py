"""The operator dashboard: ``/`` for staff, kept live by the operator feed.

Routes (``sessions/urls.py``):

- ``GET /`` — active staff: the dashboard (``templates/dashboard.html``,
  ``static/qwenweb/dashboard.js`` and ``.css``): every session with its live counters,
  plots of events per second, subscribers and the worst lag over the last hour, and the latest
  activity. Live sessions first; a filter (live / closed / all), a search, a time range
  (5 min / 1 h), gaps where samples are missing, values on hover and keyboard focus, and
  thresholds colouring lag and evictions (docs/operators.md). Everyone else is redirected
  to their session list (which sends anonymous users to the login page).
- ``GET /ops/events/`` — the operator channel as Server-Sent Events (django-eventstream's
  view, served by Django's ``ASGIHandler``: fine for a few staff dashboards, unlike the
  session streams, which must not pin a thread each). Staff only: everyone else gets a
  403 JSON error, and :class:`~sessions.ops.feed.OperatorChannelManager` refuses them the
  channel as well (``EVENTSTREAM_CHANNELMANAGER_CLASS``).
- ``GET /ops/sessions/<id>/records`` — staff only: the session's connection and incident
  records as JSON (what the admin shows).

What the channel carries: :mod:`sessions.ops.feed`.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

from channels.db import database_sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_safe

from sessions.auth import is_operator
from sessions.backends import get_backend
from sessions.backends.base import BackendUnavailableError
from sessions.conf import get_config
from sessions.models import AgentSession, normalize_session_id
from sessions.ops.feed import (
    GAP_AFTER_S,
    HISTORY_S,
    OPERATOR_CHANNEL,
    SESSION_HISTORY_S,
    TICK_S,
    feed,
    notify_threadsafe,
    session_stats_row,
)
from sessions.queries import request_user
from sessions.web.responses import error_response
from sessions.web.subscribers import SUBSCRIBER_PLACEHOLDER

__all__ = ["home", "operator_events", "session_records", "session_saved"]

logger = logging.getLogger("qwenweb.dashboard")

MAX_LISTED_SESSIONS: Final = 200
RECORDS_LIMIT: Final = 200
_PLOTS: Final = (
    {"kind": "rate", "title": "Events per second"},
    {"kind": "subscribers", "title": "Subscribers"},
    {"kind": "lag", "title": "Worst lag (events)"},
)


def _staff_error(user: Any) -> JsonResponse | None:
    """A 403 JSON error unless ``user`` is active staff (anonymous users included: a 401
    would need a ``WWW-Authenticate`` challenge, and the login here is a form)."""
    if not is_operator(user):
        return error_response(403, "forbidden", "operators only: log in as a staff user")
    return None


@require_safe
def home(request: HttpRequest) -> HttpResponse:
    """``GET /``: the dashboard for active staff; a redirect to the session list otherwise.

    Context ``dashboard_config`` (JSON for the script): ``{"feedUrl", "urls":
    {"sessionPage", "sessionAdmin", "subscribers", "disconnect"}`` (with ``placeholder``,
    ``00000000-0000-0000-0000-000000000000``, in place of the session id and
    ``subscriberPlaceholder`` in place of the subscriber id), ``"serverT"`` (ms, the
    server's clock now), ``"tickS", "historyS",
    "sessionHistoryS", "gapAfterS", "thresholds": {"lag": {"warn", "alert"}, "evictions":
    {"warn", "alert"}}, "sessions": [rows], "history", "sessionHistory", "activity"}``;
    rows merge the database row with the live ``stats()`` of a loaded bus (``"live":
    true``), else the counters last saved. The newest 200 sessions are listed, and every
    loaded one whatever its age; the script orders them (live first). A session's detail
    panel (its live subscribers, with a Disconnect button each) polls
    ``GET /session/<id>/subscribers`` while it is open.
    """
    if not is_operator(request.user):
        return redirect("session-list")
    try:
        live = get_backend().loop.call(feed.snapshot, default=None)
    except TimeoutError:  # a stuck loop must not take the page down: show saved numbers
        logger.warning("dashboard_live_numbers_unavailable reason=timeout")
        live = None
    if live is None and get_backend().loop.get() is None:
        live = _cluster_rows()  # nothing loaded here: the other processes' numbers, if any
    live_rows = {row["id"]: row for row in (live or {}).get("sessions", [])}
    query = AgentSession.objects.select_related("owner").order_by("-created_at")
    newest = list(query[:MAX_LISTED_SESSIONS])
    listed = {row.id for row in newest}
    older_live = list(query.filter(pk__in=[sid for sid in live_rows if sid not in listed]))
    rows = [_dashboard_row(row, live_rows.get(row.id)) for row in [*newest, *older_live]]
    config_values = get_config()
    placeholder = "00000000-0000-0000-0000-000000000000"
    config = {
        "feedUrl": reverse("operator-events"),
        "urls": {
            "sessionPage": reverse("session-page", args=[placeholder]),
            "sessionAdmin": reverse("admin:agent_sessions_agentsession_change", args=[placeholder]),
            "subscribers": reverse("session-subscribers", args=[placeholder]),
            "disconnect": reverse(
                "session-subscriber-disconnect", args=[placeholder, SUBSCRIBER_PLACEHOLDER]
            ),
        },
        "placeholder": placeholder,
        "subscriberPlaceholder": SUBSCRIBER_PLACEHOLDER,
        "serverT": time.time_ns() // 1_000_000,
        "tickS": TICK_S,
        "historyS": HISTORY_S,
        "sessionHistoryS": SESSION_HISTORY_S,
        "gapAfterS": GAP_AFTER_S,
        "thresholds": {
            "lag": {
                "warn": config_values.dashboard_lag_warn_events,
                "alert": config_values.dashboard_lag_alert_events,
            },
            "evictions": {
                "warn": config_values.dashboard_evictions_warn,
                "alert": config_values.dashboard_evictions_alert,
            },
        },
        "sessions": rows,
        "history": (live or {}).get("history", []),
        "sessionHistory": (live or {}).get("sessionHistory", {}),
        "activity": (live or {}).get("activity", []),
    }
    return render(
        request,
        "dashboard.html",
        {
            "dashboard_config": config,
            "sessions": rows,
            "max_listed": MAX_LISTED_SESSIONS,
            "plots": _PLOTS,
        },
    )


def _cluster_rows() -> dict[str, Any] | None:
    """No server loop here: ``{"sessions": [stats rows]}`` of the other live processes
    (a multi-process backend reads them with a short-lived client; one process: none);
    None when the shared store does not answer."""
    try:
        stats = get_backend().operator_stats_blocking()
    except (BackendUnavailableError, TimeoutError) as exc:
        logger.warning("dashboard_live_numbers_unavailable error=%r", exc)
        return None
    return {"sessions": [session_stats_row(sid, "", s) for sid, s in stats.items()]}


def _dashboard_row(row: AgentSession, live: dict[str, Any] | None) -> dict[str, Any]:
    base = {
        "id": row.id,
        "title": row.title,
        "owner": row.owner.get_username() if row.owner else "",
        "createdAt": row.created_at.isoformat(),
        "status": row.status,
        "live": live is not None,
    }
    if live is not None:
        return {**base, **{k: v for k, v in live.items() if k not in ("id", "title")}}
    return {
        **base,
        "subscribers": 0,
        "lastEventId": row.last_event_id,
        "published": row.events_published,
        "warnings": row.slow_client_warnings,
        "evictions": row.evictions,
        "ringLength": None,
        "ringSize": row.ring_size,
        "peakSubscribers": row.peak_subscribers,
        "maxLag": None,
    }


@require_GET
async def operator_events(request: HttpRequest) -> HttpResponse:
    """``GET /ops/events/``: the operator channel (django-eventstream), staff only.

    403 JSON otherwise. Captures the server loop (so the feed samples even before
    any bus is built) and hands over to django-eventstream's ``events`` view.
    """
    user = await request_user(request)
    refused = _staff_error(user)
    if refused is not None:
        logger.warning(
            "operator_feed_refused status=%d user=%s",
            refused.status_code,
            user.get_username() or "-",
        )
        return refused
    get_backend().loop.attach()
    from django_eventstream.views import events

    # In a worker thread whose connection is closed after it (an `es-meta` user is read from
    # the database): the stream it returns must hold none for its life.
    response: HttpResponse = await database_sync_to_async(events)(
        request, channels=[OPERATOR_CHANNEL]
    )
    return response


@require_safe
def session_records(request: HttpRequest, session_id: str) -> JsonResponse:
    """``GET /ops/sessions/<id>/records``: the records of one session, newest first.

    Staff only (403 JSON otherwise). Shape: ``{"session": id, "connections": [{"id",
    "auth", "subject", "clientAddr", "userAgent", "clientId", "maxQueued", "transport",
    "resumedFrom", "openedAt", "closedAt", "framesSent", "bytesSent", "endReason",
    "endDetail", "endPayload"}], "incidents": [{"id", "connection", "kind", "reason",
    "eventId", "at", "payload"}]}`` — at most 200 of each. ``payload`` and
    ``endPayload`` are the exact JSON text the client received. 404 JSON unknown session.
    """
    refused = _staff_error(request.user)
    if refused is not None:
        return refused
    normalized = normalize_session_id(session_id)
    row = AgentSession.objects.filter(pk=normalized).first() if normalized else None
    if row is None:
        return error_response(404, "not_found", "unknown session")
    connections = [
        {
            "id": str(c.id),
            "auth": c.auth,
            "subject": c.subject,
            "clientAddr": c.client_addr,
            "userAgent": c.user_agent,
            "clientId": c.client_id,
            "maxQueued": c.max_queued,
            "transport": c.transport,
            "resumedFrom": c.resumed_from,
            "openedAt": c.opened_at.isoformat(),
            "closedAt": c.closed_at.isoformat() if c.closed_at else None,
            "framesSent": c.frames_sent,
            "bytesSent": c.bytes_sent,
            "endReason": c.end_reason,
            "endDetail": c.end_detail,
            "endPayload": c.end_payload,
        }
        for c in row.connections.order_by("-opened_at")[:RECORDS_LIMIT]
    ]
    incidents = [
        {
            "id": str(i.id),
            "connection": str(i.connection_id),
            "kind": i.kind,
            "reason": i.reason,
            "eventId": i.event_id,
            "at": i.at.isoformat(),
            "payload": i.payload,
        }
        for i in row.incidents.order_by("-at")[:RECORDS_LIMIT]
    ]
    return JsonResponse({"session": row.id, "connections": connections, "incidents": incidents})


def session_saved(
    sender: type[AgentSession], instance: AgentSession, created: bool, **_: Any
) -> None:
    """``post_save``: tell the dashboards a session was created (``session_opened``)."""
    if created:
        notify_threadsafe(
            "session_opened",
            instance.id,
            title=instance.title,
            status=instance.status,
            createdAt=instance.created_at.isoformat(),
        )
