"""The admin (``/admin/``): sessions with their live numbers, connections, evictions.

- **Agent sessions**: the list shows, per session, the live subscriber count, last event
  id, ring fill, events published, slow-client warnings and evictions. For a session
  whose bus is loaded in this process they come from ``bus.stats()`` (EB-10), read on the
  server's event loop; otherwise from the counters last saved on its row (marked
  "saved"). With the Redis backend "live" means loaded in any server process, and the
  numbers are the sums over every live process
  (``Backend.operator_stats_blocking``). Filters: status, had evictions;
  search: id, title, owner. The change page shows the live numbers and, newest first,
  the session's connections and its ``slow_client_warning`` / ``client_evicted``
  records with their exact payloads. Actions: close the session, disconnect all its
  subscribers, revoke its tokens; with the Redis backend they reach every process. The
  ``User`` admin gains *Revoke the API tokens of the selected users*.
- **Subscriber connections** and **subscriber incidents**: read-only lists of the records
  written by :mod:`sessions.ops.records` (filters, search).

Concurrency model
    The admin's views are synchronous: Django runs them in a worker thread. They never
    touch a bus (EB-11): live numbers and actions are run on the server's loop through
    the backend's :class:`~sessions.runtime.ServerLoop`. With a multi-process backend a
    process that has no server loop yet reads the cluster's numbers with a short-lived
    synchronous client, and for an action adopts the loop serving the request
    (``ServerLoop.adopt_request_loop``). A shared store that is down or stuck costs a page
    about two seconds and an error message, never a 500.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, ClassVar, Final, TypeVar

from django.contrib import admin, messages
from django.db.models import Q, QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from sessions.backends import get_backend
from sessions.backends.base import BackendUnavailableError, SessionClosedError
from sessions.bus import BusStats
from sessions.models import AgentSession, SubscriberConnection, SubscriberIncident
from sessions.runtime import ServerLoopUnavailableError
from sessions.token_revocation import revoke_session_tokens, revoke_user_tokens

__all__ = [
    "AgentSessionAdmin",
    "HadEvictionsFilter",
    "SubscriberConnectionAdmin",
    "SubscriberIncidentAdmin",
    "format_bytes",
]

logger = logging.getLogger("qwenweb.admin")

INLINE_LIMIT: Final = 50
"""Rows shown per inline on the session page (the full lists are one click away)."""
_T = TypeVar("_T")


def _live_stats(request: HttpRequest, session_ids: Any = None) -> Mapping[str, BusStats]:
    """The live numbers of the loaded sessions (see :func:`_read_live_stats`); {} if
    unavailable, with a message saying why."""
    stats, problem = _read_live_stats(session_ids)
    if problem is not None:
        # With several processes the figures of every other one are missing, not just late.
        shared = get_backend().supports_multiple_processes
        report = messages.error if shared else messages.warning
        report(request, f"{problem}: numbers are the saved ones.")
    return stats


def _read_live_stats(session_ids: Any = None) -> tuple[Mapping[str, BusStats], str | None]:
    """``(stats, None)``, or ``({}, why not)``; never raises for an unavailable source.

    ``bus.stats()`` of the sessions loaded here, read on the server loop, or (several
    processes) the sums over every live server process (EB-10 in each).
    """
    backend = get_backend()
    try:
        return backend.operator_stats_blocking(session_ids), None
    except TimeoutError:
        return {}, "The server loop did not answer"
    except BackendUnavailableError as exc:
        logger.warning("admin_live_numbers_unavailable error=%s", exc)
        why = f"{backend.store_label} is unavailable, so the other server processes' numbers"
        return {}, f"{why} are unknown"


def _ring_fill(stats: BusStats) -> str:
    percent = 100 * stats.ring_length / stats.ring_size if stats.ring_size else 0
    return f"{stats.ring_length:,} / {stats.ring_size:,} ({percent:.0f}%)"


def _per_reason(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{reason}: {n}" for reason, n in sorted(counts.items())) or "0"


def format_bytes(count: int | None) -> str:
    """A byte count for people: ``"812 B"``, ``"62.5 KiB"``, ``"62.54 MiB"``, ``"1.20 GiB"``
    (powers of 1024, IEC names); ``"—"`` for None."""
    if count is None:
        return "—"
    if count < 1024:
        return f"{count} B"
    for unit, power in (("KiB", 1), ("MiB", 2), ("GiB", 3)):
        value = count / 1024**power
        if value < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}" if unit == "KiB" else f"{value:.2f} {unit}"
    raise AssertionError("unreachable")


def _bytes_cell(count: int | None) -> str:
    """:func:`format_bytes`, with the exact count in the tooltip."""
    if count is None:
        return "—"
    return format_html('<span title="{} bytes">{}</span>', f"{count:,}", format_bytes(count))


def _pretty_json(raw: str) -> str:
    try:
        return json.dumps(json.loads(raw), indent=2, ensure_ascii=False)
    except ValueError:
        return raw


# -- filters and inlines ----------------------------------------------------------------


class HadEvictionsFilter(admin.SimpleListFilter):
    """Sessions with at least one eviction: saved counter or a recorded ``client_evicted``."""

    title = "had evictions"
    parameter_name = "evictions"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Yes"), ("no", "No")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        had = Q(evictions__gt=0) | Q(incidents__kind=SubscriberIncident.Kind.CLIENT_EVICTED)
        if self.value() == "yes":
            return queryset.filter(had).distinct()
        if self.value() == "no":
            return queryset.exclude(pk__in=AgentSession.objects.filter(had).values("pk")).distinct()
        return queryset


class _NewestFirstFormSet(BaseInlineFormSet):  # type: ignore[type-arg]
    """An inline formset that shows only the :data:`INLINE_LIMIT` newest rows."""

    def get_queryset(self) -> QuerySet[Any]:
        if not hasattr(self, "_newest"):
            queryset = super().get_queryset()
            newest = list(queryset.values_list("pk", flat=True)[:INLINE_LIMIT])
            self._newest = queryset.filter(pk__in=newest)
        return self._newest


class _ReadOnlyInline(admin.TabularInline):  # type: ignore[type-arg]
    formset = _NewestFirstFormSet
    template = "admin/agent_sessions/tabular_readonly.html"  # its headers all named (a11y)
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ConnectionInline(_ReadOnlyInline):
    """The session's subscriber connections, newest first."""

    model = SubscriberConnection
    ordering = ("-opened_at",)
    verbose_name_plural = f"connections (the {INLINE_LIMIT} newest)"
    fields = (
        "opened_at",
        "closed_at",
        "subject",
        "client_addr",
        "client_id",
        "max_queued",
        "frames_sent",
        "sent",
        "end_reason",
        "end_detail",
    )
    readonly_fields = fields

    @admin.display(description="bytes sent", ordering="bytes_sent")
    def sent(self, obj: SubscriberConnection) -> str:
        return _bytes_cell(obj.bytes_sent)


class IncidentInline(_ReadOnlyInline):
    """The session's ``slow_client_warning`` and ``client_evicted`` records, newest first."""

    model = SubscriberIncident
    ordering = ("-at",)
    verbose_name_plural = f"slow-client warnings and evictions (the {INLINE_LIMIT} newest)"
    fields = ("at", "kind", "reason", "event_id", "connection", "payload_json")
    readonly_fields = fields

    @admin.display(description="payload (exactly as sent)")
    def payload_json(self, obj: SubscriberIncident) -> str:
        return format_html('<code class="qw-payload">{}</code>', obj.payload)


# -- sessions -----------------------------------------------------------------------------


#: The counters the server saves on the session's row; shown under "Saved counters" when
#: its bus is not loaded. When it is, the live numbers replace the first five (a saved 0
#: beside a live 1,010 reads as a contradiction) and only the others are shown.
_SAVED_COUNTERS = (
    "last_event_id",
    "events_published",
    "slow_client_warnings",
    "evictions",
    "peak_subscribers",
    "ring_size",
    "event_id_reserved",
    "bus_starts",
)
_SAVED_ONLY = ("ring_size", "event_id_reserved", "bus_starts")


@admin.register(AgentSession)
class AgentSessionAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Sessions with live numbers (see the module docstring)."""

    list_filter = ("status", HadEvictionsFilter)
    search_fields = ("id", "title", "owner__username")
    list_select_related = ("owner",)
    ordering = ("-created_at",)
    actions = ("close_sessions", "disconnect_all_subscribers", "revoke_session_tokens")
    inlines = (IncidentInline, ConnectionInline)
    readonly_fields = (
        "id",
        "title",
        "owner",
        "status",
        "created_at",
        "closed_at",
        "links",
        "live_numbers",
        *_SAVED_COUNTERS,
    )

    class Media:
        css: ClassVar[dict[str, tuple[str, ...]]] = {"all": ("qwenweb/dashboard-admin.css",)}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # sessions are created through the API (POST /session)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """The session page is for watching: read-only, no Save or Delete (a POST to it is
        403). The list's actions (close, disconnect, revoke) still need *change*."""
        return obj is None and super().has_change_permission(request)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> Any:
        """The session page without its Delete link either (a monitoring page; deleting
        stays the list's action for those allowed to)."""
        context = {**(extra_context or {}), "show_delete": False}
        return super().change_view(request, object_id, form_url, context)

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        """The session, its live numbers, and the saved counters: all of them when its bus
        is not loaded, else only those the live numbers do not show."""
        main = ("id", "title", "owner", "status", "created_at", "closed_at", "links")
        found, problem = _read_live_stats([obj.id]) if obj is not None else ({}, None)
        if obj is not None and problem is None and obj.id in found:
            saved: tuple[str, ...] = _SAVED_ONLY
            description = (
                "Written by the server at id reservations, close and shutdown. The other "
                "counters are live above."
            )
        else:
            saved = _SAVED_COUNTERS
            description = (
                "As last written by the server (at id reservations, close and shutdown): "
                "the latest known while the bus is not loaded."
            )
        return (
            (None, {"fields": main}),
            ("Live", {"fields": ("live_numbers",)}),
            ("Saved counters", {"description": description, "fields": saved}),
        )

    def get_list_display(self, request: HttpRequest) -> list[Any]:
        """The columns, with the live numbers read once for the whole page."""
        stats = _live_stats(request)

        def live(
            name: str, description: str, saved: Callable[[AgentSession], Any]
        ) -> Callable[[AgentSession], Any]:
            def column(obj: AgentSession) -> Any:
                current = stats.get(obj.id)
                return _LIVE_VALUES[name](current) if current is not None else saved(obj)

            column.short_description = description  # type: ignore[attr-defined]
            column.__name__ = name
            return column

        def source(obj: AgentSession) -> str:
            return "live" if obj.id in stats else "saved"

        source.short_description = "source"  # type: ignore[attr-defined]
        return [
            "__str__",
            "status",
            "created_at",
            source,
            live("subscribers", "subscribers", lambda obj: 0),
            live("last_event", "last event id", lambda obj: obj.last_event_id),
            live("ring", "ring fill", lambda obj: "—"),
            live("published", "published", lambda obj: obj.events_published),
            live("warnings", "warnings", lambda obj: obj.slow_client_warnings),
            live("evicted", "evictions", lambda obj: obj.evictions),
            "page",
        ]

    @admin.display(description="open")
    def page(self, obj: AgentSession) -> str:
        return format_html('<a href="{}">page</a>', reverse("session-page", args=[obj.id]))

    @admin.display(description="live numbers (bus.stats())")
    def live_numbers(self, obj: AgentSession) -> str:
        """The loaded bus's statistics snapshot as a small table, or a note if not loaded.

        With several processes: the sums over every server process.
        """
        found, problem = _read_live_stats([obj.id])
        stats = found.get(obj.id)
        if problem is not None:
            return f"{problem}: the saved counters below are the latest known"
        shared = get_backend().supports_multiple_processes
        if stats is None:
            where = "this process or any other" if shared else "this process"
            return f"not loaded in {where}: the saved counters below are the latest"
        rows: list[tuple[str, Any]] = []
        peak = "peak subscribers"
        if shared:
            rows.append(("source", "sum over every live server process"))
            peak = "peak subscribers (sum of each process's peak)"
        rows += [
            ("subscribers", stats.subscriber_count),
            (peak, stats.peak_subscribers),
            ("last event id", stats.last_event_id),
            ("ring fill", _ring_fill(stats)),
            ("ring bytes", _bytes_cell(stats.ring_bytes)),
            ("earliest id in ring", stats.earliest_id if stats.earliest_id is not None else "—"),
            ("events published", stats.published),
            ("slow-client warnings", stats.slow_client_warnings),
            ("evictions", _per_reason(stats.evictions)),
            ("resyncs", _per_reason(stats.resyncs)),
            ("replayed frames", stats.replayed_frames),
            ("epoch", stats.epoch),
        ]
        return format_html(
            '<table class="qw-live">{}</table>',
            format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows),
        )

    @admin.display(description="links")
    def links(self, obj: AgentSession) -> str:
        return format_html(
            '<a href="{}">session page</a> · <a href="{}">dashboard</a> · '
            '<a href="{}">connections</a> · <a href="{}">incidents</a>',
            reverse("session-page", args=[obj.id]),
            reverse("dashboard"),
            reverse("admin:agent_sessions_subscriberconnection_changelist")
            + f"?session__id__exact={obj.id}",
            reverse("admin:agent_sessions_subscriberincident_changelist")
            + f"?session__id__exact={obj.id}",
        )

    @admin.action(description="Close the selected sessions", permissions=["change"])
    def close_sessions(self, request: HttpRequest, queryset: QuerySet[AgentSession]) -> None:
        """Close each open session as ``POST /session/<id>/close`` does (on the server loop).

        With several processes ``session_closed`` goes through the shared store to every
        process, so this needs a server loop here: the request's is adopted if need be.
        """
        backend = get_backend()
        shared = backend.supports_multiple_processes
        by = request.user.get_username()
        closed = 0
        failed: list[str] = []
        for row in queryset.filter(status=AgentSession.Status.OPEN):
            try:
                _run_action(
                    functools.partial(
                        backend.close_session, row.id, reason="operator", closed_by=by
                    )
                )
            except ServerLoopUnavailableError:
                if shared:  # other processes would never hear of it
                    failed.append(f"{row.id} (no server event loop in this process)")
                    continue
                # No bus was ever built in this process, so nobody is subscribed here.
                AgentSession.objects.filter(pk=row.id, status=AgentSession.Status.OPEN).update(
                    status=AgentSession.Status.CLOSED, closed_at=timezone.now()
                )
            except SessionClosedError:
                continue
            except (BackendUnavailableError, TimeoutError) as exc:
                logger.warning("admin_close_failed session=%s error=%s", row.id, exc)
                failed.append(f"{row.id} ({_why(exc)})")
                continue
            closed += 1
            logger.info("admin_session_closed session=%s by=%s", row.id, by)
        everywhere = " in every server process" if shared and closed else ""
        self.message_user(request, f"Closed {closed} session(s){everywhere}.", messages.SUCCESS)
        if failed:
            self.message_user(
                request, f"Not closed: {'; '.join(failed)}. Try again.", messages.ERROR
            )

    @admin.action(
        description="Disconnect all subscribers of the selected sessions", permissions=["change"]
    )
    def disconnect_all_subscribers(
        self, request: HttpRequest, queryset: QuerySet[AgentSession]
    ) -> None:
        """End every subscriber with a terminal ``stream_error`` (``bus.disconnect_all``),
        here and (several processes) through a control message to every other process.

        Clients reconnect by themselves after their ``retry``; the sessions stay open. The
        other processes send no count back: the message says how many were told.
        """
        backend = get_backend()
        shared = backend.supports_multiple_processes
        by = request.user.get_username()
        here = 0
        told = 0
        failed: list[str] = []
        for row in queryset:
            try:
                done = _run_action(
                    functools.partial(
                        backend.disconnect_everywhere, row.id, reason=f"operator {by}"
                    )
                )
            except (ServerLoopUnavailableError, TimeoutError) as exc:
                if not shared and isinstance(exc, ServerLoopUnavailableError):
                    continue  # no bus was ever built here: nobody to disconnect
                logger.warning("admin_disconnect_failed session=%s error=%s", row.id, exc)
                failed.append(f"{row.id} ({_why(exc)})")
                continue
            here += done.here
            if done.told is None:
                failed.append(
                    f"{row.id} ({backend.store_label} is unavailable: no other process was told)"
                )
            else:
                told = max(told, done.told)
            logger.info(
                "admin_subscribers_disconnected session=%s count=%d told=%s by=%s",
                row.id,
                done.here,
                done.told,
                by,
            )
        if shared:
            text = (
                f"Disconnected {here} subscriber(s) in this process; told {told} other server "
                "process(es) to disconnect theirs."
            )
        else:
            text = f"Disconnected {here} subscriber(s)."
        self.message_user(request, text, messages.SUCCESS)
        if failed:
            self.message_user(request, f"Not done everywhere: {'; '.join(failed)}.", messages.ERROR)

    @admin.action(description="Revoke the tokens of the selected sessions", permissions=["change"])
    def revoke_session_tokens(self, request: HttpRequest, queryset: QuerySet[AgentSession]) -> None:
        """Every token issued so far for the selected sessions answers 401 ``token_revoked``;
        their open token streams end with ``stream_error`` in every process."""
        revoked = sum(revoke_session_tokens(row.id) is not None for row in queryset)
        logger.info("admin_tokens_revoked sessions=%d by=%s", revoked, request.user.get_username())
        self.message_user(request, f"Revoked the tokens of {revoked} session(s).", messages.SUCCESS)


def _run_action(coroutine: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run an action on the server loop; with several processes, adopt the request's loop
    if this process has none (the action must reach the others).

    Raises what :meth:`ServerLoop.run` raises.
    """
    backend = get_backend()
    if backend.supports_multiple_processes:
        backend.loop.adopt_request_loop()
    return backend.loop.run(coroutine)


def _why(exc: BaseException) -> str:
    if isinstance(exc, BackendUnavailableError):
        return f"{get_backend().store_label} is unavailable"
    if isinstance(exc, TimeoutError):
        return "the server did not answer in time"
    return "no server event loop in this process"


_LIVE_VALUES: Final[dict[str, Callable[[BusStats], Any]]] = {
    "subscribers": lambda s: s.subscriber_count,
    "last_event": lambda s: s.last_event_id,
    "ring": _ring_fill,
    "published": lambda s: s.published,
    "warnings": lambda s: s.slow_client_warnings,
    "evicted": lambda s: sum(s.evictions.values()),
}


# -- records --------------------------------------------------------------------------------


class _ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class IncidentOfConnectionInline(_ReadOnlyInline):
    model = SubscriberIncident
    fk_name = "connection"
    ordering = ("-at",)
    fields = ("at", "kind", "reason", "event_id", "payload")
    readonly_fields = fields
    show_change_link = True


@admin.register(SubscriberConnection)
class SubscriberConnectionAdmin(_ReadOnlyAdmin):
    """Every recorded subscriber connection (read-only)."""

    list_display = (
        "opened_at",
        "session",
        "subject",
        "auth",
        "client_addr",
        "client_id",
        "frames_sent",
        "sent",
        "closed_at",
        "end_reason",
        "end_detail",
    )
    list_filter = ("end_reason", "auth", "opened_at")
    search_fields = ("=id", "=session__id", "session__title", "subject", "client_id", "client_addr")
    list_select_related = ("session",)
    date_hierarchy = "opened_at"
    inlines = (IncidentOfConnectionInline,)
    readonly_fields = ("end_payload_pretty", "sent")

    @admin.display(description="bytes sent", ordering="bytes_sent")
    def sent(self, obj: SubscriberConnection) -> str:
        return _bytes_cell(obj.bytes_sent)

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """Every field, with the byte count as KiB/MiB in place of the raw number."""
        fields = [f for f in super().get_fields(request, obj) if f != "sent"]
        return [("sent" if f == "bytes_sent" else f) for f in fields]

    @admin.display(description="terminal frame payload (pretty-printed)")
    def end_payload_pretty(self, obj: SubscriberConnection) -> str:
        if not obj.end_payload:
            return "—"
        return format_html("<pre>{}</pre>", _pretty_json(obj.end_payload))


@admin.register(SubscriberIncident)
class SubscriberIncidentAdmin(_ReadOnlyAdmin):
    """Every recorded ``slow_client_warning`` and ``client_evicted`` (read-only)."""

    list_display = ("at", "kind", "reason", "event_id", "session", "connection")
    list_filter = ("kind", "reason", "at")
    search_fields = ("=session__id", "=connection__id", "session__title")
    list_select_related = ("session", "connection")
    date_hierarchy = "at"
    readonly_fields = ("payload_pretty",)

    @admin.display(description="payload (pretty-printed)")
    def payload_pretty(self, obj: SubscriberIncident) -> str:
        return format_html("<pre>{}</pre>", _pretty_json(obj.payload))


admin.site.site_header = "qwenweb operators"
admin.site.site_title = "qwenweb admin"
admin.site.index_title = "Sessions, subscribers and evictions"
admin.site.enable_nav_sidebar = False  # the session list needs the width for its numbers


# -- users: revoke their API tokens -------------------------------------------------------


def _register_user_admin() -> None:
    """Re-register the ``User`` admin with the action *Revoke API tokens*."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.admin import UserAdmin

    user_model = get_user_model()
    base = admin.site._registry.get(user_model)
    base_class: type[Any] = type(base) if base is not None else UserAdmin

    @admin.action(description="Revoke the API tokens of the selected users")
    def revoke_user_api_tokens(model_admin: Any, request: HttpRequest, queryset: Any) -> None:
        """Every token issued so far to the selected users answers 401 ``token_revoked``."""
        count = 0
        for user in queryset:
            revoke_user_tokens(user.pk)
            count += 1
        logger.info("admin_tokens_revoked users=%d by=%s", count, request.user.get_username())
        model_admin.message_user(
            request, f"Revoked the API tokens of {count} user(s).", messages.SUCCESS
        )

    actions = (*(getattr(base_class, "actions", None) or ()), revoke_user_api_tokens)
    revoking = type("RevokingUserAdmin", (base_class,), {"actions": actions})
    if base is not None:
        admin.site.unregister(user_model)
    admin.site.register(user_model, revoking)


_register_user_admin()
