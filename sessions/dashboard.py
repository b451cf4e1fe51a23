"""The operator dashboard: ``/`` for staff, kept live by django-eventstream.

Routes (appended to ``sessions/urls.py``):

- ``GET /`` — staff: the dashboard (``templates/dashboard.html``,
  ``static/qwenweb/dashboard.js`` and ``.css``): every session with its live counters,
  plots of events per second and subscribers over the last five minutes, and the latest
  activity. Everyone else gets :data:`sessions.pages.home` (the redirect to their session
  list, which sends anonymous users to the login page): no dashboard.
- ``GET /ops/events/`` — the operator channel as Server-Sent Events (django-eventstream's
  view, served by Django's ``ASGIHandler``: fine for a few staff dashboards, unlike the
  session streams, which must not pin a thread each). Staff only: everyone else gets a
  403 JSON error, and :class:`OperatorChannelManager` refuses them the channel as well
  (``EVENTSTREAM_CHANNELMANAGER_CLASS``).
- ``GET /ops/sessions/<id>/records`` — staff only: the session's connection and incident
  records as JSON (what the admin shows).

Events on the channel (SSE ``event:`` types; ``data`` is JSON):

- ``stats`` — ``{"t": <ms>, "tick": bool, "sessions": [{"id", "title", "status",
  "subscribers", "lastEventId", "published", "warnings", "evictions", "ringLength",
  "ringSize", "peakSubscribers"}]}`` for every session loaded in this process: each
  second (``tick`` true: a point of the plots) and right after any activity (false).
  With the Redis backend: every session loaded in any live server process, its figures
  summed over them (:func:`sessions.runtime.cluster_stats`), so every process's
  dashboards show the same totals.
- ``activity`` — ``{"t": <ms>, "items": [{"kind", "session", "t", ...}]}``; kinds:
  ``session_opened`` (created), ``session_closed``, ``subscriber_joined``,
  ``subscriber_left`` (with ``reason``), ``slow_client_warning`` and ``client_evicted``
  (with the frame's ``data``). Sent at most every :data:`ACTIVITY_DELAY_S`.

Concurrency model
    :class:`OperatorFeed` belongs to the server's event loop, like the buses whose
    ``stats()`` it samples (EB-10, EB-11). ``note()`` is called on the loop (records,
    runtime) and never awaits, touches the database or raises; other threads use
    :func:`notify_threadsafe`. django-eventstream's ``send_event`` is called on the loop
    with no event storage (``is_channel_reliable`` is False), so publishing to the channel
    writes nothing to the database. The sync views read live numbers through
    :func:`sessions.runtime.call_on_server_loop`.

Several processes (Redis backend)
    Each tick fetches the other processes' reports once (one ``ZRANGE`` + ``MGET``,
    bounded by the tick) and keeps them until the next: every sample sums them with this
    process's fresh figures without asking Redis again (the reports change only every
    ``PROCESS_TTL_S / 4`` anyway). Redis unreachable: this process's figures only.
    ``stats`` go to this process's own dashboards only: they are the cluster's sums
    already, and relayed, every process's ticker would reach every dashboard — N copies
    a second, sampled at different instants, each adding a point to the plots and making
    the rates jump. ``activity`` happens in one process: it goes to that process's
    dashboards and is relayed to the others over the backend's own control channel
    (``{"op": "activity", "items": [...]}`` on ``<prefix>:control``,
    :func:`sessions.runtime.relay_activity`), batched with the local send, at most one
    publish in flight (a backlog of :data:`RELAY_BACKLOG` items at most), never awaited by
    :meth:`OperatorFeed.note`. A process hands relayed items to its own dashboards only
    (:meth:`OperatorFeed.note_remote`): nothing is echoed. Items noted while Redis is
    down are lost to the other processes (pub/sub keeps nothing either). django-eventstream's
    own relay (``EVENTSTREAM_REDIS``) is not configured (docs/deployment.md, section 8);
    were it set by hand, :func:`_send` still delivers to this process's listeners only,
    so no item arrives twice.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from typing import Any, Final

import orjson
from channels.db import database_sync_to_async
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models.signals import post_save
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET
from django_eventstream import eventstream, send_event
from django_eventstream.channelmanager import ChannelManagerBase
from django_eventstream.event import Event
from django_eventstream.views import get_listener_manager

from sessions import runtime
from sessions.bus import BusStats
from sessions.models import AgentSession, normalize_session_id
from sessions.queries import request_user
from sessions.views import error_response

__all__ = [
    "ACTIVITY_DELAY_S",
    "HISTORY_S",
    "OPERATOR_CHANNEL",
    "TICK_S",
    "OperatorChannelManager",
    "OperatorFeed",
    "feed",
    "home",
    "notify_threadsafe",
    "operator_events",
    "session_records",
]

logger = logging.getLogger("qwenweb.dashboard")

OPERATOR_CHANNEL: Final = "operators"
TICK_S: Final = 1.0
"""Seconds between two ``stats`` samples (and points of the plots)."""
HISTORY_S: Final = 300
"""Seconds of history kept for the plots."""
ACTIVITY_DELAY_S: Final = 0.1
"""Activity is sent this long after it happened, batched (django-eventstream queues at
most 10 events per listener between two reads)."""
RECENT_ACTIVITY: Final = 50
RELAY_BACKLOG: Final = 1000
"""Redis backend: activity items waiting for the relay at most (the oldest are dropped)."""
MAX_LISTED_SESSIONS: Final = 200
RECORDS_LIMIT: Final = 200


def _is_staff(user: AbstractBaseUser | AnonymousUser | None) -> bool:
    return bool(user is not None and user.is_active and getattr(user, "is_staff", False))


class OperatorChannelManager(ChannelManagerBase):  # type: ignore[misc]  # untyped package
    """django-eventstream's permission hook: one channel, for active staff users only.

    Whatever the request asks for (``?channel=``), it gets :data:`OPERATOR_CHANNEL`, and
    only staff may read it; the channel keeps no event storage.
    """

    def get_channels_for_request(self, request: HttpRequest, view_kwargs: Any) -> set[str]:
        return {OPERATOR_CHANNEL}

    def can_read_channel(self, user: AbstractBaseUser | None, channel: str) -> bool:
        return channel == OPERATOR_CHANNEL and _is_staff(user)

    def is_channel_reliable(self, channel: str) -> bool:
        return False


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _session_stats(session_id: str, title: str, stats: BusStats) -> dict[str, Any]:
    return {
        "id": session_id,
        "title": title,
        "status": "closed" if stats.closed else "open",
        "subscribers": stats.subscriber_count,
        "lastEventId": stats.last_event_id,
        "published": stats.published,
        "warnings": stats.slow_client_warnings,
        "evictions": sum(stats.evictions.values()),
        "ringLength": stats.ring_length,
        "ringSize": stats.ring_size,
        "peakSubscribers": stats.peak_subscribers,
    }


class OperatorFeed:
    """Sample the loaded buses each second and publish to the operator channel.

    Keeps :data:`HISTORY_S` seconds of totals (``[t_ms, published, subscribers]``) and
    of each loaded session, and the :data:`RECENT_ACTIVITY` latest activity items, so a
    dashboard opened now starts with full plots.
    """

    def __init__(self, *, tick_s: float = TICK_S, history_s: int = HISTORY_S) -> None:
        self.tick_s = tick_s
        self._points = max(2, int(history_s / tick_s))
        self._history: deque[tuple[int, int, int]] = deque(maxlen=self._points)
        self._session_history: dict[str, deque[tuple[int, int, int]]] = {}
        self._recent: deque[dict[str, Any]] = deque(maxlen=RECENT_ACTIVITY)
        self._pending: list[dict[str, Any]] = []
        self._soon: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Redis backend: the other processes' reports as of the last tick, and the titles
        # of the sessions they report that are not loaded here.
        self._others: list[dict[str, Any]] = []
        self._titles: dict[str, str] = {}
        self._redis_failing = False
        # Redis backend: items noted here, not yet relayed to the other processes, and the
        # one relay publish in flight.
        self._outbox: deque[dict[str, Any]] = deque(maxlen=RELAY_BACKLOG)
        self._relay_task: asyncio.Task[None] | None = None

    def note(self, kind: str, session_id: str, **fields: Any) -> None:
        """Queue one activity item; it goes out within :data:`ACTIVITY_DELAY_S`.

        Call on the server's loop. Never raises, never awaits; without a running
        loop the item is only kept for the next dashboard page. Redis backend: the item
        is relayed to the other processes' dashboards too (see the module docstring).
        """
        item = {"kind": kind, "session": session_id, "t": _now_ms(), **fields}
        self._recent.append(item)
        if self._loop is None or self._loop.is_closed():
            return
        self._pending.append(item)
        if runtime.using_redis():
            self._outbox.append(item)
        self._send_soon()

    def note_remote(self, items: list[dict[str, Any]]) -> None:
        """Take activity items relayed from another process (Redis backend).

        ``items`` as :meth:`note` makes them. They are kept for the next dashboard page
        and sent to this process's dashboards within :data:`ACTIVITY_DELAY_S`, never
        relayed again (no echo between processes). Call on the server's loop. Never
        raises, never awaits.
        """
        self._recent.extend(items)
        if self._loop is None or self._loop.is_closed():
            return
        self._pending.extend(items)
        self._send_soon()

    def _send_soon(self) -> None:
        if self._soon is None and self._loop is not None:
            self._soon = self._loop.call_later(ACTIVITY_DELAY_S, self._send_activity)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start sampling on ``loop`` (the server's) unless it runs there already."""
        if self._loop is loop and self._task is not None and not self._task.done():
            return
        self._loop = loop
        self._soon = None
        self._task = loop.create_task(self.run(), name="qwenweb-operator-feed")

    def stop(self) -> None:
        """Stop sampling and forget history and activity (tests). Never raises."""
        if self._loop is not None and not self._loop.is_closed():
            for task in (self._task, self._relay_task):
                if task is not None:
                    self._loop.call_soon_threadsafe(task.cancel)
        if self._soon is not None:
            self._soon.cancel()
        self._task = self._loop = self._soon = self._relay_task = None
        self._outbox.clear()
        self._history.clear()
        self._session_history.clear()
        self._recent.clear()
        self._pending.clear()
        self._others = []
        self._titles.clear()

    async def run(self) -> None:
        """Sample and publish every ``tick_s`` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.tick_s)  # a clock, not a wait for a cause
            try:
                if runtime.using_redis():
                    await self.fetch_others()
                self.tick()
            except Exception:  # a dashboard must never take the loop down
                logger.exception("operator_feed_tick_failed")

    async def fetch_others(self) -> None:
        """Redis backend: keep the other processes' reports for the samples until the next
        tick (one round-trip, at most ``tick_s``), and the titles of their sessions.

        Redis unreachable or slow: no other process's figures until it answers (one log
        line per outage). Never raises for Redis; database errors propagate.
        """
        try:
            async with asyncio.timeout(self.tick_s):
                self._others = await runtime.other_reports()
        except (runtime.BackendUnavailableError, TimeoutError) as exc:
            if not self._redis_failing:
                logger.warning("operator_feed_cluster_unavailable error=%r", exc)
            self._redis_failing = True
            self._others = []
            return
        self._redis_failing = False
        reported = {sid for report in self._others for sid in report.get("sessions") or {}}
        self._titles = {sid: t for sid, t in self._titles.items() if sid in reported}
        loaded_here = {live.session_id for live in runtime.registry.values()}
        missing = reported - self._titles.keys() - loaded_here
        if missing:
            self._titles.update(await database_sync_to_async(_titles_of)(missing))

    def tick(self) -> list[dict[str, Any]]:
        """Take one sample of every loaded bus, keep it, publish ``stats``; return rows."""
        now = _now_ms()
        rows = self.sample()
        self._history.append(
            (now, sum(r["published"] for r in rows), sum(r["subscribers"] for r in rows))
        )
        live_ids = set()
        for row in rows:
            live_ids.add(row["id"])
            history = self._session_history.get(row["id"])
            if history is None:
                history = self._session_history[row["id"]] = deque(maxlen=self._points)
            history.append((now, row["published"], row["subscribers"]))
        for gone in set(self._session_history) - live_ids:
            del self._session_history[gone]
        _send("stats", {"t": now, "tick": True, "sessions": rows})
        return rows

    def sample(self) -> list[dict[str, Any]]:
        """Return the ``stats`` rows of every session loaded in this process (on the loop).

        Redis backend: of every session loaded in any live process, summed over them
        (this process's figures fresh, the others' from the last tick). Never awaits.
        """
        if not runtime.using_redis():
            return [
                _session_stats(live.session_id, live.title, live.bus.stats())
                for live in runtime.registry.values()
            ]
        titles = {live.session_id: live.title for live in runtime.registry.values()}
        return [
            _session_stats(sid, titles.get(sid) or self._titles.get(sid, ""), stats)
            for sid, stats in runtime.cluster_stats(self._others).items()
        ]

    def snapshot(self) -> dict[str, Any]:
        """Return what a dashboard page starts from (on the loop): rows, plots, activity.

        Shape: ``{"t", "sessions": [stats rows], "history": [[t_ms, published,
        subscribers]], "sessionHistory": {id: [[t_ms, published, subscribers]]},
        "activity": [items, oldest first]}``.
        """
        return {
            "t": _now_ms(),
            "sessions": self.sample(),
            "history": [list(point) for point in self._history],
            "sessionHistory": {
                sid: [list(point) for point in points]
                for sid, points in self._session_history.items()
            },
            "activity": list(self._recent),
        }

    def _send_activity(self) -> None:
        self._soon = None
        items, self._pending = self._pending, []
        if items:
            _send("activity", {"t": _now_ms(), "items": items})
            _send("stats", {"t": _now_ms(), "tick": False, "sessions": self.sample()})
        self._relay_outbox()

    def _relay_outbox(self) -> None:
        """Start relaying the items noted here, unless a relay publish is in flight (its end
        starts the next one). Never raises, never awaits."""
        if not self._outbox or self._loop is None or self._loop.is_closed():
            return
        if self._relay_task is not None and not self._relay_task.done():
            return
        items = list(self._outbox)
        self._outbox.clear()
        self._relay_task = self._loop.create_task(self._relay(items), name="qwenweb-operator-relay")

    async def _relay(self, items: list[dict[str, Any]]) -> None:
        try:
            await runtime.relay_activity(items)
        except Exception as exc:  # best effort, like pub/sub itself: never the loop's problem
            logger.debug("operator_activity_not_relayed items=%d error=%r", len(items), exc)
        self._relay_task = None
        self._relay_outbox()


def _titles_of(session_ids: set[str]) -> dict[str, str]:
    """``{id: title}`` of ``session_ids`` ("" for a row that is gone), sync (DB)."""
    found = dict(AgentSession.objects.filter(pk__in=session_ids).values_list("id", "title"))
    return {sid: found.get(sid, "") for sid in session_ids}


def _send(event_type: str, payload: dict[str, Any]) -> None:
    """Publish on the operator channel to this process's listeners: in-memory fan-out, no
    storage (the other processes get ``activity`` from :meth:`OperatorFeed.note`'s relay).

    Were django-eventstream's relay configured by hand (``EVENTSTREAM_REDIS``),
    ``send_event`` would publish to every process instead: ``stats`` N times, ``activity``
    twice with ours. Then the event is queued for the local listeners the way
    ``send_event`` does without a relay. Never raises.
    """
    try:
        data = orjson.dumps(payload).decode()
        if getattr(eventstream, "redis_client", None) is None:
            send_event(OPERATOR_CHANNEL, event_type, data, json_encode=False)
        else:
            event = Event(OPERATOR_CHANNEL, event_type, data)
            get_listener_manager().add_to_queues(OPERATOR_CHANNEL, event)
    except Exception:
        logger.exception("operator_feed_send_failed type=%s", event_type)


feed = OperatorFeed()
"""The process-wide operator feed."""


def notify_threadsafe(kind: str, session_id: str, **fields: Any) -> None:
    """Hand an activity item to :data:`feed` on the server's loop, from any thread.

    Does nothing when this process has no server loop yet (then no dashboard can be
    connected to it either). Never raises, never waits.
    """
    runtime.call_soon_on_server_loop(functools.partial(feed.note, kind, session_id, **fields))


# -- views -------------------------------------------------------------------------------


def _staff_error(user: Any) -> JsonResponse | None:
    """A 403 JSON error unless ``user`` is active staff (anonymous users included: a 401
    would need a ``WWW-Authenticate`` challenge, and the login here is a form)."""
    if not _is_staff(user):
        return error_response(403, "forbidden", "operators only: log in as a staff user")
    return None


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """``GET /``: the dashboard for staff; :data:`sessions.pages.home` for everyone else.

    Context ``dashboard_config`` (JSON for the script): ``{"feedUrl", "urls":
    {"sessionPage", "sessionAdmin"}`` (with ``00000000-0000-0000-0000-000000000000`` in
    place of the id), ``"tickS", "historyS", "sessions": [rows], "history",
    "sessionHistory", "activity"}``; rows merge the database row with the live
    ``stats()`` of a loaded bus (``"live": true``), else the counters last saved.
    """
    if not _is_staff(request.user):
        from sessions import pages  # the other pages of the site; imported on demand

        response: HttpResponse = pages.home(request)  # type: ignore[assignment]
        return response
    try:
        live = runtime.call_on_server_loop(feed.snapshot, default=None)
    except TimeoutError:  # a stuck loop must not take the page down: show saved numbers
        logger.warning("dashboard_live_numbers_unavailable reason=timeout")
        live = None
    if live is None and runtime.using_redis() and runtime.server_loop() is None:
        live = _cluster_rows()  # nothing loaded here: the other processes' numbers
    live_rows = {row["id"]: row for row in (live or {}).get("sessions", [])}
    rows = []
    for row in AgentSession.objects.select_related("owner").order_by("-created_at")[
        :MAX_LISTED_SESSIONS
    ]:
        rows.append(_dashboard_row(row, live_rows.pop(row.id, None)))
    placeholder = "00000000-0000-0000-0000-000000000000"
    config = {
        "feedUrl": reverse("operator-events"),
        "urls": {
            "sessionPage": reverse("session-page", args=[placeholder]),
            "sessionAdmin": reverse("admin:agent_sessions_agentsession_change", args=[placeholder]),
        },
        "placeholder": placeholder,
        "tickS": TICK_S,
        "historyS": HISTORY_S,
        "sessions": rows,
        "history": (live or {}).get("history", []),
        "sessionHistory": (live or {}).get("sessionHistory", {}),
        "activity": (live or {}).get("activity", []),
    }
    return render(
        request,
        "dashboard.html",
        {"dashboard_config": config, "sessions": rows, "max_listed": MAX_LISTED_SESSIONS},
    )


def _cluster_rows() -> dict[str, Any] | None:
    """Redis backend, no server loop here: ``{"sessions": [stats rows]}`` summed over the
    live processes, read with a short-lived client; None when Redis does not answer."""
    try:
        stats = runtime.operator_stats_blocking()
    except (runtime.BackendUnavailableError, TimeoutError) as exc:
        logger.warning("dashboard_live_numbers_unavailable error=%r", exc)
        return None
    return {"sessions": [_session_stats(sid, "", s) for sid, s in stats.items()]}


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
    runtime.attach_server_loop()
    from django_eventstream.views import events

    # In a worker thread whose connection is closed after it (an `es-meta` user is read from
    # the database): the stream it returns must hold none for its life (issue 6).
    response: HttpResponse = await database_sync_to_async(events)(
        request, channels=[OPERATOR_CHANNEL]
    )
    return response


@require_GET
def session_records(request: HttpRequest, session_id: str) -> JsonResponse:
    """``GET /ops/sessions/<id>/records``: the records of one session, newest first.

    Staff only (403 JSON otherwise). Shape: ``{"session": id, "connections": [{"id",
    "auth", "subject", "clientAddr", "userAgent", "clientId", "maxQueued",
    "resumedFrom", "openedAt", "closedAt", "framesSent", "bytesSent", "endReason",
    "endDetail", "endPayload"}], "incidents": [{"id", "connection", "kind", "reason",
    "eventId", "at", "payload"}]}`` — at most 200 of each. ``payload`` and
    ``endPayload`` are the exact JSON text the client received. 404 unknown session.
    """
    refused = _staff_error(request.user)
    if refused is not None:
        return refused
    normalized = normalize_session_id(session_id)
    row = AgentSession.objects.filter(pk=normalized).first() if normalized else None
    if row is None:
        raise Http404("unknown session")
    connections = [
        {
            "id": str(c.id),
            "auth": c.auth,
            "subject": c.subject,
            "clientAddr": c.client_addr,
            "userAgent": c.user_agent,
            "clientId": c.client_id,
            "maxQueued": c.max_queued,
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


def _session_saved(
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


post_save.connect(_session_saved, sender=AgentSession, dispatch_uid="qwenweb-dashboard-created")
