"""The demo agent inside the server: ``POST /sessions/<id>/demo`` starts it.

It plays the scripted turns of :mod:`sessions.scripted_agent` into the session, publishing
through the backend on the server's event loop, the loop that owns every session's bus
(EB-11), as an ``asyncio`` task. At most one agent runs per session; the tasks are kept
in a module dict so they are not garbage-collected, and each removes itself when it ends.
CSRF-protected by Django's middleware.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Final

import orjson
from django.http import HttpRequest, JsonResponse

from sessions.auth import can_view
from sessions.backends import get_backend
from sessions.backends.base import (
    BackendUnavailableError,
    IdempotencyKey,
    SessionClosedError,
    SessionNotFoundError,
)
from sessions.models import normalize_session_id
from sessions.queries import request_user, session_row
from sessions.scripted_agent import agent_turns, last_turn
from sessions.web.responses import error_response

__all__ = [
    "DEMO_CHUNKS_PER_S",
    "demo_agent_running",
    "run_demo_agent",
    "start_demo",
    "start_demo_agent",
]

logger = logging.getLogger("qwenweb.pages")

DEMO_CHUNKS_PER_S: Final = 25.0
"""Pace of the demo agent: ``agent_message_chunk`` events per second (an LLM's typing)."""

DEMO_PUBLISH_ATTEMPTS: Final = 3
"""Tries per event while the event store is away (one idempotency key for all of them)."""
DEMO_RETRY_PAUSE_S: Final = 1.0

_demo_agents: dict[str, asyncio.Task[int]] = {}


async def start_demo(request: HttpRequest, session_id: str) -> JsonResponse:
    """``POST /sessions/<id>/demo``: start the demo agent in this process; 202.

    ``GET`` answers ``{"sessionId", "running"}``: whether a demo agent runs for the session
    in this process (the page's Start button says so; an agent publishing over HTTP from
    elsewhere, like ``manage.py demo``'s, is not seen).

    Login session + CSRF (Django's middleware; a missing token is its 403 page). Answers
    202 ``{"started": true, "sessionId", "chunksPerS"}``; JSON errors otherwise: 401 not
    logged in, 404 unknown session or neither owner nor staff, 409 ``demo_running``
    (one agent per session) or ``session_closed``.
    """
    if request.method not in ("GET", "POST"):  # a JSON 405 like the API's, not Django's
        response = error_response(405, "method_not_allowed", "use GET or POST here")
        response["Allow"] = "GET, POST"
        return response
    user = await request_user(request)
    if not user.is_authenticated:
        return error_response(401, "unauthorized", "log in to start the demo agent")
    normalized = normalize_session_id(session_id)
    row = await session_row(normalized) if normalized else None
    if row is None or not can_view(user, row.owner_id):  # the same 404: existence never leaks
        return error_response(404, "not_found", "unknown session")
    if request.method == "GET":
        return JsonResponse({"sessionId": row.id, "running": demo_agent_running(row.id)})
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
    """Publish the scripted run of :func:`sessions.scripted_agent.agent_turns` into the session.

    Each event waits ``tokens / chunks_per_s`` seconds first (one ``agent_message_chunk``
    = one token: 25 per second by default). Stops early, without error, when the session
    is closed or deleted. Returns the number of events published.
    """
    published = 0
    run = uuid.uuid4().hex[:8]  # this run's tool call ids: call_<run>_<turn>
    for event_type, data, tokens in agent_turns(run, await _next_turn(session_id)):
        await asyncio.sleep(tokens / chunks_per_s)
        # One key per event, the same on every try: a publish that timed out but was
        # stored is not stored twice (docs/protocol.md, "Idempotent publish").
        key = IdempotencyKey(str(uuid.uuid4()), "demo")
        outcome = await _publish_with_retries(session_id, event_type, data, key)
        if outcome is None:
            break
        published += outcome
    return published


async def _publish_with_retries(
    session_id: str, event_type: str, data: object, key: IdempotencyKey
) -> int | None:
    """1 once published, 0 when the store stayed away (skipped), None to stop the demo."""
    for attempt in range(DEMO_PUBLISH_ATTEMPTS):
        backend = get_backend()
        try:
            live = await backend.get_live_session(session_id)
            if await backend.publish(live, {"type": event_type, "data": data}, idempotency=key):
                return 1
            return None  # closed between the lookup and the publish (EB-2)
        except (SessionClosedError, SessionNotFoundError):
            return None
        except BackendUnavailableError:
            logger.warning(
                "demo_agent_waiting session=%s reason=backend_unavailable attempt=%d",
                session_id,
                attempt + 1,
            )
            if attempt + 1 < DEMO_PUBLISH_ATTEMPTS:
                await asyncio.sleep(DEMO_RETRY_PAUSE_S)
    return 0  # the demo skips what it could not publish while Redis is away


async def _next_turn(session_id: str) -> int:
    """One more than the session's newest ``turn_complete`` in its ring (1 if none), so a
    session played twice (a second ``make demo``) counts its turns on. Never raises."""
    backend = get_backend()
    try:  # (caught up: a shared store's ring holds every event published before)
        live = await backend.caught_up(await backend.get_live_session(session_id))
    except (SessionClosedError, SessionNotFoundError, BackendUnavailableError):
        return 1  # (the publish loop meets the same and says so)
    ring = live.bus.ring
    newest_first = (
        orjson.loads(frame.json)
        for frame in ring.newest(len(ring))
        if frame.type == "turn_complete" and frame.json is not None
    )
    return last_turn(newest_first) + 1


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
