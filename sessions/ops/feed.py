"""The operator feed: live figures and activity for the dashboards, on one SSE channel.

The feed is a :class:`~sessions.hooks.Listener` (connected in ``AppConfig.ready``): it
learns of connections, warnings, evictions and closed sessions from the stream route and
the backend, and samples the backend's buses each second. It publishes on
django-eventstream's channel :data:`OPERATOR_CHANNEL` (``GET /ops/events/``,
:mod:`sessions.ops.dashboard`).

Events on the channel (SSE ``event:`` types; ``data`` is JSON):

- ``stats`` — ``{"t": <ms>, "tick": bool, "sessions": [{"id", "title", "status",
  "subscribers", "lastEventId", "published", "warnings", "evictions", "ringLength",
  "ringSize", "peakSubscribers", "maxLag"}]}`` for every session loaded in this process:
  each second (``tick`` true: a point of the plots) and right after any activity (false).
  ``maxLag`` is the worst subscriber's lag (events behind the head, as
  :func:`~sessions.backends.reports.subscriber_lag` counts it; 0 without subscribers).
  With the Redis backend: every session loaded in any live server process, its figures
  summed over them (:func:`Backend.cluster_stats`), so every process's
  dashboards show the same totals.
- ``activity`` — ``{"t": <ms>, "items": [{"kind", "session", "t", ...}]}``; kinds:
  ``session_opened`` (created), ``session_closed``, ``subscriber_joined``,
  ``subscriber_left`` (with ``reason``), ``slow_client_warning`` and ``client_evicted``
  (with the frame's ``data``). Sent at most every :data:`ACTIVITY_DELAY_S`.

Concurrency model
    :class:`OperatorFeed` belongs to the server's event loop, like the buses whose
    ``stats()`` it samples (EB-10, EB-11). ``note()`` is called on the loop (the hooks)
    and never awaits, touches the database or raises; other threads use
    :func:`notify_threadsafe`. django-eventstream's ``send_event`` is called on the loop
    with no event storage (``is_channel_reliable`` is False), so publishing to the channel
    writes nothing to the database. The sync views read live numbers through the
    backend's server loop (``backend.loop.call``).

Several processes (a backend with ``supports_multiple_processes``)
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
    ``Backend.relay_activity``), batched with the local send, at most one
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
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson
from channels.db import database_sync_to_async
from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest
from django_eventstream import eventstream, send_event
from django_eventstream.channelmanager import ChannelManagerBase
from django_eventstream.event import Event
from django_eventstream.views import get_listener_manager

from sessions.auth import is_operator
from sessions.backends import get_backend
from sessions.backends.base import Backend, BackendUnavailableError
from sessions.backends.reports import subscriber_lag
from sessions.bus import BusStats, Frame
from sessions.hooks import ConnectionInfo, ConnectionObserver, Listener
from sessions.models import AgentSession

__all__ = [
    "ACTIVITY_DELAY_S",
    "GAP_AFTER_S",
    "HISTORY_S",
    "INCIDENT_TYPES",
    "OPERATOR_CHANNEL",
    "SESSION_HISTORY_S",
    "TICK_S",
    "OperatorChannelManager",
    "OperatorFeed",
    "feed",
    "max_lags",
    "notify_threadsafe",
    "session_stats_row",
]

logger = logging.getLogger("qwenweb.dashboard")

OPERATOR_CHANNEL: Final = "operators"
TICK_S: Final = 1.0
"""Seconds between two ``stats`` samples (and points of the plots)."""
HISTORY_S: Final = 3600
"""Seconds of totals kept for the plots (the dashboard's longest time range): one point a
tick, at most ``HISTORY_S / TICK_S`` points (about 210 bytes each, 0.75 MiB)."""
SESSION_HISTORY_S: Final = 120
"""Seconds of each loaded session's history kept for its sparkline."""
GAP_AFTER_S: Final = 5.0
"""Two samples further apart than this have missing data between them: the plots draw a
gap there, never a line across (a stalled or stopped server, a lost feed)."""
ACTIVITY_DELAY_S: Final = 0.1
"""Activity is sent this long after it happened, batched (django-eventstream queues at
most 10 events per listener between two reads)."""
RECENT_ACTIVITY: Final = 50
RELAY_BACKLOG: Final = 1000
"""Several processes: activity items waiting for the relay at most (the oldest dropped)."""
INCIDENT_TYPES: Final = frozenset({"slow_client_warning", "client_evicted"})
"""Synthetic frame types that become activity items of their own."""


class OperatorChannelManager(ChannelManagerBase):  # type: ignore[misc]  # untyped package
    """django-eventstream's permission hook: one channel, for active staff users only.

    Whatever the request asks for (``?channel=``), it gets :data:`OPERATOR_CHANNEL`, and
    only staff may read it; the channel keeps no event storage.
    """

    def get_channels_for_request(self, request: HttpRequest, view_kwargs: Any) -> set[str]:
        return {OPERATOR_CHANNEL}

    def can_read_channel(self, user: AbstractBaseUser | None, channel: str) -> bool:
        return channel == OPERATOR_CHANNEL and is_operator(user)

    def is_channel_reliable(self, channel: str) -> bool:
        return False


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def session_stats_row(
    session_id: str, title: str, stats: BusStats, max_lag: int = 0
) -> dict[str, Any]:
    """One row of ``stats`` (see the module docstring); ``max_lag`` in events."""
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
        "maxLag": max_lag,
    }


def max_lags(backend: Backend, others: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """``{session id: the worst subscriber lag}`` (events behind the head) over this
    process's subscribers (read now, on the loop) and ``others``' reported rows.

    Sessions without subscribers are absent. Touches each queue's counters only; never
    raises, never awaits.
    """
    lags: dict[str, int] = {}
    for live in backend.registry.values():
        for subscription in live.bus.subscriptions():
            lag = subscriber_lag(live.bus, subscription)
            lags[live.session_id] = max(lags.get(live.session_id, 0), lag)
    for report in others:
        for sid, rows in (report.get("subscribers") or {}).items():
            for row in rows or ():
                lags[sid] = max(lags.get(sid, 0), int(row.get("lag") or 0))
    return lags


class _FeedObserver(ConnectionObserver):
    """One connection, as the feed sees it: warnings, evictions and its end."""

    __slots__ = ("_feed", "_frames", "_info")

    def __init__(self, feed: OperatorFeed, info: ConnectionInfo) -> None:
        self._feed, self._info, self._frames = feed, info, 0

    def frames_written(
        self,
        frames: Sequence[Frame],
        wires: Sequence[bytes],
        payloads: Sequence[bytes],
        nbytes: int,
    ) -> None:
        self._frames += len(frames)
        for frame in frames:
            if frame.type in INCIDENT_TYPES:
                data = frame.get("data")
                fields = {
                    k: v
                    for k, v in (data.items() if isinstance(data, dict) else ())
                    if k not in ("kind", "session", "t")
                }
                self._feed.note(
                    frame.type, self._info.session_id, **fields, subscriber=self._info.label
                )

    def closed(self, reason: str, detail: str = "") -> None:
        if self._info is None:
            return
        info, self._info = self._info, None  # type: ignore[assignment]
        self._feed.note(
            "subscriber_left",
            info.session_id,
            subscriber=info.label,
            reason=reason,
            framesSent=self._frames,
        )


class OperatorFeed(Listener):
    """Sample the loaded buses each second and publish to the operator channel.

    Keeps :data:`HISTORY_S` seconds of totals (``[t_ms, published, subscribers,
    maxLag]``), :data:`SESSION_HISTORY_S` seconds of each loaded session (``[t_ms,
    published, subscribers]``), and the :data:`RECENT_ACTIVITY` latest activity items, so
    a dashboard opened now starts with full plots. Both histories are deques bounded by
    their number of ticks; a session's goes when it is no longer loaded.
    """

    def __init__(
        self,
        *,
        tick_s: float = TICK_S,
        history_s: float = HISTORY_S,
        session_history_s: float = SESSION_HISTORY_S,
    ) -> None:
        self.tick_s = tick_s
        self._points = max(2, int(history_s / tick_s))
        self._session_points = max(2, int(session_history_s / tick_s))
        self._history: deque[tuple[int, int, int, int]] = deque(maxlen=self._points)
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
        if get_backend().supports_multiple_processes:
            self._outbox.append(item)
        self._send_soon()

    # -- the listener ----------------------------------------------------------------

    def connection_opened(self, info: ConnectionInfo) -> ConnectionObserver:
        """``subscriber_joined`` now; warnings, evictions and ``subscriber_left`` later."""
        self.note(
            "subscriber_joined",
            info.session_id,
            subscriber=info.label,
            subject=info.subject,
            clientAddr=info.client_addr,
            clientId=info.client_id,
            maxQueued=info.max_queued,
            transport=info.transport,
        )
        return _FeedObserver(self, info)

    def session_closed(self, session_id: str, last_event_id: int) -> None:
        self.note("session_closed", session_id, lastEventId=last_event_id)

    def activity_received(self, items: Sequence[Mapping[str, Any]]) -> None:
        self.note_remote([dict(item) for item in items])

    def note_remote(self, items: list[dict[str, Any]]) -> None:
        """Take activity items relayed from another process (several processes).

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
                if get_backend().supports_multiple_processes:
                    await self.fetch_others()
                self.tick()
            except Exception:  # a dashboard must never take the loop down
                logger.exception("operator_feed_tick_failed")

    async def fetch_others(self) -> None:
        """Several processes: keep the other processes' reports for the samples until the next
        tick (one round-trip, at most ``tick_s``), and the titles of their sessions.

        Redis unreachable or slow: no other process's figures until it answers (one log
        line per outage). Never raises for Redis; database errors propagate.
        """
        backend = get_backend()
        try:
            async with asyncio.timeout(self.tick_s):
                self._others = await backend.other_reports()
        except (BackendUnavailableError, TimeoutError) as exc:
            if not self._redis_failing:
                logger.warning("operator_feed_cluster_unavailable error=%r", exc)
            self._redis_failing = True
            self._others = []
            return
        self._redis_failing = False
        reported = {sid for report in self._others for sid in report.get("sessions") or {}}
        self._titles = {sid: t for sid, t in self._titles.items() if sid in reported}
        loaded_here = {live.session_id for live in backend.registry.values()}
        missing = reported - self._titles.keys() - loaded_here
        if missing:
            self._titles.update(await database_sync_to_async(_titles_of)(missing))

    def tick(self) -> list[dict[str, Any]]:
        """Take one sample of every loaded bus, keep it, publish ``stats``; return rows."""
        now = _now_ms()
        rows = self.sample()
        self._history.append(
            (
                now,
                sum(r["published"] for r in rows),
                sum(r["subscribers"] for r in rows),
                max((r["maxLag"] for r in rows), default=0),
            )
        )
        live_ids = set()
        for row in rows:
            live_ids.add(row["id"])
            history = self._session_history.get(row["id"])
            if history is None:
                history = self._session_history[row["id"]] = deque(maxlen=self._session_points)
            history.append((now, row["published"], row["subscribers"]))
        for gone in set(self._session_history) - live_ids:
            del self._session_history[gone]
        _send("stats", {"t": now, "tick": True, "sessions": rows})
        return rows

    def sample(self) -> list[dict[str, Any]]:
        """Return the ``stats`` rows of every session loaded in this process (on the loop).

        Several processes: of every session loaded in any live process, summed over
        them (this process's figures fresh, the others' from the last tick). Never awaits.
        """
        backend = get_backend()
        titles = {live.session_id: live.title for live in backend.registry.values()}
        lags = max_lags(backend, self._others)
        return [
            session_stats_row(
                sid, titles.get(sid) or self._titles.get(sid, ""), stats, lags.get(sid, 0)
            )
            for sid, stats in backend.cluster_stats(self._others).items()
        ]

    def snapshot(self) -> dict[str, Any]:
        """Return what a dashboard page starts from (on the loop): rows, plots, activity.

        Shape: ``{"t", "sessions": [stats rows], "history": [[t_ms, published,
        subscribers, maxLag]], "sessionHistory": {id: [[t_ms, published, subscribers]]},
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
            await get_backend().relay_activity(items)
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
"""The process's operator feed (connected to :data:`sessions.hooks.hooks` by ``sessions.apps``)."""


def notify_threadsafe(kind: str, session_id: str, **fields: Any) -> None:
    """Hand an activity item to :data:`feed` on the server's loop, from any thread.

    Does nothing when this process has no server loop yet (then no dashboard can be
    connected to it either). Never raises, never waits.
    """
    get_backend().loop.call_soon(functools.partial(feed.note, kind, session_id, **fields))
