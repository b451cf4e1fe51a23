"""The operator's pages: the session list, the live session page, and the demo agent.

Routes (appended to ``sessions/urls.py``):

- ``GET /`` — a redirect to ``/sessions/``.
- ``GET /sessions/`` — the logged-in user's sessions (staff see all), with a "new session"
  button that calls ``POST /session`` (login + CSRF, ``sessions.views``).
- ``GET /sessions/<id>/`` — the live session page (issue 3): a template plus
  ``static/qwenweb/session_page.js``, which reads the stream with ``fetch`` and the
  hand-written parser of ``static/qwenweb/sse.js`` (SC-1 ... SC-13). Login required
  (redirect to ``LOGIN_URL``), owner or staff (else the 403 page), unknown id → 404.
- ``POST /sessions/<id>/demo`` — start the scripted demo agent (``sessions.demo``) inside
  this server process; CSRF-protected by Django's middleware.

Concurrency model
    The pages are plain synchronous views (Django runs them in its thread pool under
    ASGI). The demo endpoint is async: it runs on the server's event loop, the loop that
    owns every session's bus (EB-11), and starts the agent there as an ``asyncio`` task
    that publishes with :func:`sessions.runtime.publish`.
    At most one agent runs per session; the tasks are kept in a module dict so they are
    not garbage-collected, and each removes itself when it ends.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django.views.generic import RedirectView

from sessions import runtime
from sessions.conf import get_config
from sessions.demo import agent_turns
from sessions.models import AgentSession, normalize_session_id
from sessions.queries import request_user, session_row
from sessions.views import MAX_QUEUED_DEFAULT, MAX_QUEUED_MAX, MAX_QUEUED_MIN, error_response

__all__ = [
    "DEMO_CHUNKS_PER_S",
    "demo_agent_running",
    "home",
    "run_demo_agent",
    "session_list",
    "session_page",
    "start_demo",
    "start_demo_agent",
]

logger = logging.getLogger("qwenweb.pages")

DEMO_CHUNKS_PER_S: Final = 25.0
"""Pace of the demo agent: ``agent_message_chunk`` events per second (an LLM's typing)."""

MAX_LISTED_SESSIONS: Final = 200

_demo_agents: dict[str, asyncio.Task[int]] = {}


def _can_view(user: Any, row: AgentSession) -> bool:
    """Return whether ``user`` may watch ``row``: its owner or staff (section 5 rules)."""
    return bool(user.is_staff or (row.owner_id is not None and row.owner_id == user.pk))


# -- pages -------------------------------------------------------------------------------

home = RedirectView.as_view(pattern_name="session-list", permanent=False)
"""``GET /``: a temporary redirect to the session list."""


@require_GET
@login_required
def session_list(request: HttpRequest) -> HttpResponse:
    """``GET /sessions/``: the user's sessions, newest first (staff: everyone's).

    At most 200 rows. The "new session" button posts to ``POST /session`` from
    ``static/qwenweb/session_list.js`` with the CSRF token of this page.
    """
    rows = AgentSession.objects.select_related("owner").order_by("-created_at")
    if not request.user.is_staff:
        rows = rows.filter(owner_id=request.user.pk)
    return render(
        request,
        "sessions/session_list.html",
        {
            "sessions": list(rows[:MAX_LISTED_SESSIONS]),
            "max_listed": MAX_LISTED_SESSIONS,
            "create_url": reverse("session-create"),
            "id_placeholder": "00000000-0000-4000-8000-000000000000",
        },
    )


@require_GET
@login_required
def session_page(request: HttpRequest, session_id: str) -> HttpResponse:
    """``GET /sessions/<id>/``: the live session page (issue 3).

    Renders ``sessions/session_page.html`` with a ``page_config`` JSON object for the
    script: ``{"sessionId", "title", "status", "ringSize", "urls": {"events", "load",
    "token", "demo", "list"}, "maxQueued": {"min", "max", "default"}, "demoChunksPerS"}``
    (paths, same origin).

    Raises:
        Http404: malformed or unknown session id.
        PermissionDenied: the user is neither the owner nor staff (the 403 page).
    """
    normalized = normalize_session_id(session_id)
    row = AgentSession.objects.filter(pk=normalized).first() if normalized else None
    if row is None:
        raise Http404("unknown session")
    if not _can_view(request.user, row):
        raise PermissionDenied("only the session's owner or staff may watch it")
    page_config = {
        "sessionId": row.id,
        "title": row.title,
        "status": row.status,
        "ringSize": row.ring_size or get_config().ring_size,
        "urls": {
            "events": reverse("session-events", args=[row.id]),
            "load": reverse("session-detail", args=[row.id]),
            "token": reverse("session-token", args=[row.id]),
            "demo": reverse("session-demo", args=[row.id]),
            "list": reverse("session-list"),
        },
        "maxQueued": {"min": MAX_QUEUED_MIN, "max": MAX_QUEUED_MAX, "default": MAX_QUEUED_DEFAULT},
        "demoChunksPerS": DEMO_CHUNKS_PER_S,
    }
    return render(
        request, "sessions/session_page.html", {"session": row, "page_config": page_config}
    )


# -- the demo agent ----------------------------------------------------------------------


@require_POST
async def start_demo(request: HttpRequest, session_id: str) -> JsonResponse:
    """``POST /sessions/<id>/demo``: start the demo agent in this process; 202.

    Login session + CSRF (Django's middleware; a missing token is its 403 page). Answers
    202 ``{"started": true, "sessionId", "chunksPerS"}``; JSON errors otherwise: 401 not
    logged in, 403 neither owner nor staff, 404 unknown session, 409 ``demo_running``
    (one agent per session) or ``session_closed``.
    """
    user = await request_user(request)
    if not user.is_authenticated:
        return error_response(401, "unauthorized", "log in to start the demo agent")
    normalized = normalize_session_id(session_id)
    row = await session_row(normalized) if normalized else None
    if row is None:
        return error_response(404, "not_found", "unknown session")
    if not _can_view(user, row):
        return error_response(403, "forbidden", "only the session's owner or staff may do this")
    if row.is_closed:
        return error_response(409, "session_closed", "the session is closed")
    if not start_demo_agent(row.id):
        return error_response(
            409, "demo_running", "a demo agent is already running in this session"
        )
    logger.info("demo_agent_started session=%s by=%s", row.id, user.get_username())
    return JsonResponse(
        {"started": True, "sessionId": row.id, "chunksPerS": DEMO_CHUNKS_PER_S}, status=202
    )


def demo_agent_running(session_id: str) -> bool:
    """Return whether a demo agent task is running for ``session_id``. Never raises."""
    task = _demo_agents.get(session_id)
    return task is not None and not task.done()


def start_demo_agent(session_id: str, *, chunks_per_s: float = DEMO_CHUNKS_PER_S) -> bool:
    """Start :func:`run_demo_agent` as a task on the running loop; False if one runs already.

    Must be called on the server's event loop (EB-11). Never awaits; never raises except
    ``RuntimeError`` when no loop is running.
    """
    if demo_agent_running(session_id):
        return False
    task = asyncio.get_running_loop().create_task(
        run_demo_agent(session_id, chunks_per_s=chunks_per_s), name=f"demo-agent-{session_id}"
    )
    _demo_agents[session_id] = task
    task.add_done_callback(lambda done: _demo_finished(session_id, done))
    return True


async def run_demo_agent(session_id: str, *, chunks_per_s: float = DEMO_CHUNKS_PER_S) -> int:
    """Publish the scripted run of ``sessions.demo.agent_turns()`` into the session.

    Each event waits ``tokens / chunks_per_s`` seconds first (one ``agent_message_chunk``
    = one token: 25 per second by default). Stops early, without error, when the session
    is closed or deleted. Returns the number of events published.
    """
    published = 0
    for event_type, data, tokens in agent_turns():
        await asyncio.sleep(tokens / chunks_per_s)
        try:
            live = await runtime.get_live_session(session_id)
            if await runtime.publish(live, {"type": event_type, "data": data}) is None:
                break  # closed between the lookup and the publish (EB-2)
        except (runtime.SessionClosedError, runtime.SessionNotFoundError):
            break
        except runtime.BackendUnavailableError:
            logger.warning("demo_agent_waiting session=%s reason=backend_unavailable", session_id)
            continue  # the demo skips what it could not publish while Redis is away
        published += 1
    return published


def _demo_finished(session_id: str, task: asyncio.Task[int]) -> None:
    if _demo_agents.get(session_id) is task:
        del _demo_agents[session_id]
    if task.cancelled():
        logger.info("demo_agent_cancelled session=%s", session_id)
    elif task.exception() is not None:
        logger.error(
            "demo_agent_failed session=%s error=%r", session_id, task.exception(), exc_info=False
        )
    else:
        logger.info("demo_agent_finished session=%s events=%d", session_id, task.result())
