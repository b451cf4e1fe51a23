"""``GET /session/<id>/events``: the session's event bus as Server-Sent Events.

Rules: EB-12 ... EB-20 and EB-22 (docs/protocol.md, "The stream").

Concurrency model
    This is a plain ASGI application routed by Channels in front of Django's
    ``ASGIHandler`` (``qwenweb.asgi``), so an open stream is one coroutine on the server's
    event loop: no OS thread is pinned per stream (EB-22). Database work (the login
    session, loading a session's row) runs through ``database_sync_to_async`` for the
    duration of one query. While the stream is open, two tasks run side by side: the
    *pump* (:mod:`sessions.transport.pump`) moves frames from the subscription to
    ``send`` and writes heartbeats, and the *watcher* waits for ``http.disconnect``.
    Whichever ends first ends the other, and the subscription is aborted in ``finally``
    (EB-20).

What it announces
    Each attached subscriber is announced to the process's :class:`~sessions.hooks.Hooks`
    (the operator side's records and dashboard listen): the observer it gets back is told
    every frame and byte after ``send`` accepted it, and how the stream ended. Those calls
    only touch memory.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Final, cast
from urllib.parse import parse_qs

from asgiref.typing import ASGIReceiveCallable as Receive
from asgiref.typing import ASGISendCallable as Send
from asgiref.typing import HTTPScope as Scope
from channels.auth import get_user
from django.conf import settings
from django.db import DatabaseError
from django.http.cookie import parse_cookie
from django.http.request import split_domain_port, validate_host

from sessions.auth import (
    Principal,
    authenticate,
    check_access,
    check_access_by_row,
    check_token_scope,
    ensure_current,
)
from sessions.backends import get_backend
from sessions.backends.base import (
    OPERATOR_DISCONNECT,
    Backend,
    BackendUnavailableError,
    LiveSession,
    SessionClosedError,
    SessionNotFoundError,
)
from sessions.backends.revoked_streams import expired_frame, stream_details
from sessions.bus import (
    DEFAULT_MAX_QUEUED,
    MAX_QUEUED_MAX,
    MAX_QUEUED_MIN,
    Frame,
    SubscriberLimitExceededError,
    Subscription,
    synthetic_frame,
)
from sessions.conf import get_config
from sessions.cors import cors_headers, is_preflight
from sessions.errors import ApiError, backend_unavailable, error_headers
from sessions.hooks import ConnectionInfo, ConnectionObserver, Hooks, hooks
from sessions.models import SubscriberConnection, normalize_session_id
from sessions.process_state import process_state
from sessions.transport.compressed import GZIP_HEADERS, CompressedSend, stream_codec
from sessions.transport.peer_timeout import PeerTimeouts
from sessions.transport.pump import WriterIdleTimeoutError, pump_frames
from sessions.wire import (
    DEFAULT_RETRY_MS,
    FrameEncoder,
    encode_retry,
    parse_epoch,
    parse_last_event_id,
    sanitize_for_log,
)

__all__ = [
    "DRAIN_RETRY_MS",
    "LIMIT_RETRY_MS",
    "SessionEventsRoute",
    "drain_frame",
    "drain_retry_ms",
]

logger = logging.getLogger("qwenweb.stream")


LIMIT_RETRY_MS: Final = 5000
"""``retry:`` (ms) of the EB-16 answer when the subscriber limit is reached."""
DRAIN_RETRY_MS: Final = (1000, 3000)
"""Range (ms) of the jittered ``retry:`` of a stream ended or refused by the drain: clients
of one process never come back in step (docs/protocol.md, "Graceful drain")."""
_STREAM_HEADERS: Final = (
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
    (b"vary", b"accept-encoding"),
)

_CLIENT_DISCONNECT: Final = SubscriberConnection.EndReason.CLIENT_DISCONNECT.value
_STREAM_ERROR: Final = SubscriberConnection.EndReason.STREAM_ERROR.value
_SERVER_DISCONNECT: Final = SubscriberConnection.EndReason.SERVER_DISCONNECT.value
_SERVER_SHUTDOWN: Final = SubscriberConnection.EndReason.SERVER_SHUTDOWN.value
_OPERATOR_DISCONNECT: Final = SubscriberConnection.EndReason.OPERATOR_DISCONNECT.value
_BUS_END_REASONS: Final = {
    "evicted": SubscriberConnection.EndReason.CLIENT_EVICTED.value,
    "closed": SubscriberConnection.EndReason.SESSION_CLOSED.value,
    "disconnected": SubscriberConnection.EndReason.SERVER_DISCONNECT.value,
}


@dataclass(frozen=True, slots=True)
class _Admission:
    """What the checks of EB-12 ... EB-15 found: the session, the cursor, who is asking."""

    live: LiveSession
    last_event_id: int | None
    epoch: str | None
    max_queued: int
    principal: Principal
    codec: str | None  # EB-17: "gzip" or None


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class SessionEventsRoute:
    """The ASGI application for ``/session/<session_id>/events`` (docs/protocol.md).

    ``GET`` and ``HEAD`` are served here; any other method is handed to ``fallback``
    (Django, for ``POST`` = publish). Expects ``scope["url_route"]["kwargs"]
    ["session_id"]`` (Channels' ``URLRouter``). Without a bearer token it reads the
    Django login session from the request's cookie itself (so a plain ``EventSource``
    works for logged-in users).

    Args:
        fallback: the ASGI application for everything else.
        backend: the backend to stream from; default :func:`sessions.backends.get_backend`
            at each request (so a test's backend is used).
        hooks: where connections are announced; default the process's.
    """

    def __init__(
        self,
        fallback: Callable[[Scope, Receive, Send], Awaitable[None]],
        *,
        backend: Backend | None = None,
        hooks: Hooks = hooks,
    ) -> None:
        self.fallback = fallback
        self._backend = backend
        self.hooks = hooks
        self.encoder = FrameEncoder()
        self._peer_timeouts: PeerTimeouts | None = None

    @property
    def backend(self) -> Backend:
        """The backend this route streams from."""
        return self._backend if self._backend is not None else get_backend()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.fallback(scope, receive, send)
            return
        headers = _headers(scope)
        if is_preflight(scope["method"], _text(headers.get(b"access-control-request-method"))):
            await self._preflight(send, scope, headers)  # for GET here and POST (Django) alike
            return
        if scope["method"] not in ("GET", "HEAD"):
            await self.fallback(scope, receive, send)
            return
        # Channels' URLRouter adds ``url_route``, which is no key of the ASGI scope.
        session_id = cast("dict[str, Any]", scope)["url_route"]["kwargs"]["session_id"]
        cors = _cors(scope, headers)
        if process_state.draining:
            await self._draining(send, session_id, cors)
            return
        backend = self.backend
        if self._peer_timeouts is None:  # half-open peers: the kernel's TCP_USER_TIMEOUT
            self._peer_timeouts = PeerTimeouts(backend.config.peer_timeout_s)
        self._peer_timeouts.ensure()
        try:
            admission = await self._admit(backend, scope, session_id, headers)
        except ApiError as reject:
            await self._reject(send, scope, session_id, reject, cors)
            return
        except SessionClosedError:
            await _no_content(send, cors)
            return
        live = admission.live
        connection_id = uuid.uuid4()
        info = _connection_info(connection_id, scope, headers, admission)
        try:
            live, subscription = await backend.subscribe(
                live,
                last_event_id=admission.last_event_id,
                max_queued=admission.max_queued,
                epoch=admission.epoch,
                label=info.label,
                details={
                    "user": info.subject,
                    "clientId": info.client_id,
                    "address": info.client_addr,
                    **_credential_details(admission.principal, live.owner_id),
                },
            )
        except SubscriberLimitExceededError as exc:
            await self._limit_reached(send, live, exc.limit, cors)
            return
        except SessionClosedError:
            await _no_content(send, cors)
            return
        except BackendUnavailableError as exc:
            await self._reject(send, scope, session_id, backend_unavailable(exc), cors)
            return
        observer: ConnectionObserver | None = None
        expiry = _end_at_expiry(live, subscription, admission.principal)
        try:
            await send(
                {
                    "type": "http.response.start",
                    "trailers": False,
                    "status": 200,
                    "headers": [
                        *_STREAM_HEADERS,
                        (b"x-event-epoch", live.bus.epoch.encode()),
                        *(GZIP_HEADERS if admission.codec else ()),
                        *cors,
                    ],
                }
            )
            if scope["method"] == "HEAD":
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            observer = self.hooks.connection_opened(info)
            body_send = CompressedSend(send) if admission.codec else None
            # daphne sends no headers until the first body bytes: write retry now (EB-18).
            retry = encode_retry(DEFAULT_RETRY_MS)
            await (body_send or send)(
                {"type": "http.response.body", "body": retry, "more_body": True}
            )
            if body_send is not None:
                body_send.release()  # a stream that stays idle holds no context (EB-17)
            subscription.bytes_sent += len(retry)
            observer.bytes_written(len(retry))
            reason, detail = await self._serve(
                subscription, receive, body_send or send, live, observer
            )
            observer.closed(reason, detail)
        except asyncio.CancelledError:
            if observer is not None:  # the server cancels its streams when it shuts down
                observer.closed(_SERVER_SHUTDOWN)
            raise
        except Exception as exc:
            if observer is not None:  # `send` of the headers or retry line failed
                observer.closed(_STREAM_ERROR, f"{type(exc).__name__}: {exc}")
            raise
        finally:
            subscription.abort()
            if expiry is not None:
                expiry.cancel()

    async def _admit(
        self, backend: Backend, scope: Scope, raw_session_id: str, headers: dict[bytes, bytes]
    ) -> _Admission:
        """Run the checks of EB-12 ... EB-15 in order; raise ``ApiError`` on the first failure.

        Raises ``SessionClosedError`` (a 204) for a closed session the caller may read.
        """
        if not _host_allowed(scope, headers):  # what Django's get_host() does for its views
            raise ApiError(400, "disallowed_host", "the Host header is not in ALLOWED_HOSTS")
        session_id = normalize_session_id(raw_session_id)
        principal = await authenticate(  # EB-12; revocation is checked after the lookup
            headers.get(b"authorization"), lambda: _login_user(headers), check_versions=False
        )
        check_token_scope(principal, session_id or "", "read")
        last_event_id, epoch = _cursor(headers, raw_session_id)  # EB-13
        max_queued = _parse_max_queued(scope.get("query_string", b""))  # EB-14
        codec = stream_codec(  # EB-17
            backend.config.stream_compression,
            headers.get(b"accept-encoding"),
            scope.get("query_string", b""),
        )
        if session_id is None:  # EB-15
            raise ApiError(404, "not_found", "unknown session")
        try:
            live = await backend.get_live_session(session_id)
        except SessionNotFoundError:
            raise ApiError(404, "not_found", "unknown session") from None
        except BackendUnavailableError as exc:
            await check_access_by_row(principal, session_id, "read")  # an outage tells no ids
            raise backend_unavailable(exc) from None
        except SessionClosedError as closed:
            check_access(principal, session_id, closed.owner_id, "read")  # EB-12 before EB-15
            raise
        check_access(principal, session_id, live.owner_id, "read")
        if not live.stream_compression:  # the session's own switch (EB-17)
            codec = None
        # A closed session answered 204 above whatever the token's version: the client stops.
        try:
            await ensure_current(principal)
        except DatabaseError as exc:
            raise ApiError(
                503, "unavailable", "the database is busy; try again", log_extra=f" error={exc!r}"
            ) from None
        return _Admission(live, last_event_id, epoch, max_queued, principal, codec)

    async def _serve(
        self,
        subscription: Subscription,
        receive: Receive,
        send: Send,
        live: LiveSession,
        observer: ConnectionObserver,
    ) -> tuple[str, str]:
        """Stream until the client leaves, the subscription ends or the pump fails.

        Returns how the stream ended: ``(end reason, detail)``. A writer that stays idle
        evicts the subscriber (``writer_idle_timeout``) and ends the response without
        writing more: its socket takes nothing.
        """
        config = self.backend.config
        disconnected = False

        async def watch() -> None:
            nonlocal disconnected
            await _wait_for_disconnect(receive)
            disconnected = True
            subscription.abort()  # EB-20: gone at once; this also ends the pump's wait

        # The pump runs in this task and only the watcher gets its own: one task per
        # stream fewer, which is memory per idle stream.
        watcher = asyncio.ensure_future(watch())
        error: Exception | None = None
        try:
            await pump_frames(
                subscription,
                send,
                config.stream_heartbeat_s,  # capped by the peer timeout
                observer,
                writer_idle_timeout_s=config.writer_idle_timeout_s,
                encoder=self.encoder,
            )
        except WriterIdleTimeoutError as idle:
            if not disconnected:
                live.bus.evict(subscription, "writer_idle_timeout", idleS=idle.idle_s)
                reason, _ = self._ended_by_bus(subscription) or (_STREAM_ERROR, "")
                return reason, "writer_idle_timeout"
        except Exception as exc:
            error = exc
        finally:
            subscription.abort()
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        if disconnected:
            # The client went away: nothing more to write, nothing to log.
            return self._ended_by_bus(subscription) or (_CLIENT_DISCONNECT, "")
        if error is not None:  # EB-19
            detail = f"{type(error).__name__}: {sanitize_for_log(str(error), 200)}"
            logger.error(
                "stream_error session=%s subscriber=%s error=%s",
                live.session_id,
                subscription.label,
                detail,
            )
            frame = synthetic_frame("stream_error", {"error": "internal error while streaming"})
            body, payload = self.encoder.synthetic(frame)
            try:
                await send({"type": "http.response.body", "body": body, "more_body": False})
                observer.frame_written(frame, body, payload)
            except Exception:  # the connection itself may be what failed
                logger.debug("stream_error frame could not be written", exc_info=True)
            return _STREAM_ERROR, detail
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return self._ended_by_bus(subscription) or (_CLIENT_DISCONNECT, "")

    def _ended_by_bus(self, subscription: Subscription) -> tuple[str, str] | None:
        """The end reason when the bus ended the subscription (EB-5, EB-9), else None.

        A subscriber disconnected while the server shuts down ended because of the
        shutdown; one an operator disconnected (``end_note`` reason
        ``operator_disconnect``) is ``(operator_disconnect, "by <who>")``.
        """
        reason = _BUS_END_REASONS.get(subscription.end_reason or "")
        if reason == _SERVER_DISCONNECT and process_state.shutting_down:
            reason = _SERVER_SHUTDOWN
        note = subscription.end_note
        if reason == _SERVER_DISCONNECT and note and note.get("reason") == OPERATOR_DISCONNECT:
            return _OPERATOR_DISCONNECT, f"by {note.get('by') or 'an operator'}"
        return (reason, "") if reason is not None else None

    async def _limit_reached(
        self, send: Send, live: LiveSession, limit: int, cors: list[tuple[bytes, bytes]]
    ) -> None:
        """EB-16: 200, ``Retry-After: 5``, ``retry: 5000``, one ``stream_error``, end."""
        logger.warning("subscriber_limit_exceeded session=%s limit=%d", live.session_id, limit)
        frame, _ = self.encoder.synthetic(
            synthetic_frame(
                "stream_error",
                {
                    "error": "subscriber limit reached",
                    "code": "subscriber_limit_exceeded",
                    "limit": limit,
                    "retryAfterMs": LIMIT_RETRY_MS,
                },
            )
        )
        await send(
            {
                "type": "http.response.start",
                "trailers": False,
                "status": 200,
                "headers": [
                    *_STREAM_HEADERS,
                    (b"x-event-epoch", live.bus.epoch.encode()),
                    (b"retry-after", str(LIMIT_RETRY_MS // 1000).encode()),
                    *cors,
                ],
            }
        )
        await send(
            {
                "type": "http.response.body",
                "body": encode_retry(LIMIT_RETRY_MS) + frame,
                "more_body": False,
            }
        )

    async def _draining(self, send: Send, session_id: str, cors: list[tuple[bytes, bytes]]) -> None:
        """A new stream while the server drains: 200, a jittered ``retry:``, one
        ``stream_error`` (``server_draining``), end. The client reconnects after it,
        through the load balancer, to a process that is ready."""
        retry_ms = drain_retry_ms()
        logger.info(
            "stream_refused session=%s reason=server_draining retry_ms=%d",
            sanitize_for_log(session_id),
            retry_ms,
        )
        frame, _ = self.encoder.synthetic(drain_frame(retry_ms))  # with its `retry:` line
        await send(
            {
                "type": "http.response.start",
                "trailers": False,
                "status": 200,
                "headers": [*_STREAM_HEADERS, *cors],
            }
        )
        await send({"type": "http.response.body", "body": frame, "more_body": False})

    async def _reject(
        self,
        send: Send,
        scope: Scope,
        session_id: str,
        reject: ApiError,
        cors: list[tuple[bytes, bytes]],
    ) -> None:
        self.hooks.request_rejected(reject.status, reject.code)
        logger.warning(
            "stream_rejected session=%s status=%d code=%s error=%s client=%s%s",
            sanitize_for_log(session_id),
            reject.status,
            reject.code,
            reject.message,
            (scope.get("client") or ["-"])[0],
            reject.log_extra,
        )
        await send(
            {
                "type": "http.response.start",
                "trailers": False,
                "status": reject.status,
                "headers": [*error_headers(reject.status), *cors],
            }
        )
        await send({"type": "http.response.body", "body": reject.body(), "more_body": False})

    async def _preflight(self, send: Send, scope: Scope, headers: dict[bytes, bytes]) -> None:
        """A CORS preflight of the events URL: 204, with the CORS headers for an allowed
        origin (``GET``, ``HEAD`` here; ``POST``, publish, in Django)."""
        cors = _cors(scope, headers, preflight_methods=("GET", "HEAD", "POST", "OPTIONS"))
        await send(
            {"type": "http.response.start", "trailers": False, "status": 204, "headers": cors}
        )
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def drain_retry_ms() -> int:
    """A reconnection time drawn uniformly from :data:`DRAIN_RETRY_MS` (ms)."""
    low, high = DRAIN_RETRY_MS
    return low + secrets.randbelow(high - low + 1)


def drain_frame(retry_ms: int) -> Frame:
    """The terminal frame of a stream the drain ends or refuses (``server_draining``).

    Shape: ``{"v": 1, "type": "stream_error", "data": {"error": ..., "code":
    "server_draining", "retryAfterMs": retry_ms}}``; its block starts with ``retry:
    <retry_ms>`` (a ``RetryFrame``), so every client reconnects after its own time.
    """
    return synthetic_frame(
        "stream_error",
        {
            "error": "the server is shutting down; reconnect",
            "code": "server_draining",
            "retryAfterMs": retry_ms,
        },
        retry_ms=retry_ms,
    )


def _text(raw: bytes | None) -> str | None:
    return raw.decode("latin-1") if raw is not None else None


def _cors(
    scope: Scope, headers: dict[bytes, bytes], *, preflight_methods: tuple[str, ...] | None = None
) -> list[tuple[bytes, bytes]]:
    """The CORS headers of this route's answer (:mod:`sessions.cors`: one policy)."""
    host = _text(headers.get(b"host")) or ""
    found = cors_headers(
        _text(headers.get(b"origin")),
        f"{scope.get('scheme') or 'http'}://{host}",
        get_config().cors_allowed_origins,
        path=sanitize_for_log(scope.get("path", ""), 120),
        preflight_methods=preflight_methods,
    )
    return [(name.lower().encode(), value.encode("latin-1")) for name, value in found]


async def _no_content(send: Send, cors: list[tuple[bytes, bytes]]) -> None:
    """A closed session's stream: 204, which ends an SSE client for good (EB-15)."""
    await send({"type": "http.response.start", "trailers": False, "status": 204, "headers": cors})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _cursor(headers: dict[bytes, bytes], session_id: str) -> tuple[int | None, str | None]:
    """EB-13: the strict ``Last-Event-ID`` and ``X-Event-Epoch``; invalid ones are absent."""
    raw_cursor = headers.get(b"last-event-id")
    last_event_id = parse_last_event_id(raw_cursor)
    if raw_cursor is not None and last_event_id is None:
        logger.warning(
            "last_event_id_rejected session=%s value=%r (treated as absent)",
            sanitize_for_log(session_id),
            sanitize_for_log(raw_cursor),
        )
    raw_epoch = headers.get(b"x-event-epoch")
    epoch = parse_epoch(raw_epoch)
    if raw_epoch is not None and epoch is None:
        logger.warning(
            "epoch_rejected session=%s value=%r (ignored)",
            sanitize_for_log(session_id),
            sanitize_for_log(raw_epoch),
        )
    return last_event_id, epoch if last_event_id is not None else None


def _headers(scope: Scope) -> dict[bytes, bytes]:
    """Return the request headers keyed by lowercase name; a repeated header keeps all values
    joined with ``,`` (so two ``Last-Event-ID`` values are refused as one invalid value)."""
    headers: dict[bytes, bytes] = {}
    for name, value in scope.get("headers", ()):
        key = bytes(name).lower()
        headers[key] = headers[key] + b"," + bytes(value) if key in headers else bytes(value)
    return headers


async def _login_user(headers: dict[bytes, bytes]) -> Any:
    """The user of the Django login session named by the request's cookie, or None.

    Loaded here, only for requests without a bearer token, rather than by Channels'
    session middleware, which would wrap ``send`` for every body chunk of the stream.
    """
    cookies = parse_cookie(headers.get(b"cookie", b"").decode("latin-1"))
    session_key = cookies.get(settings.SESSION_COOKIE_NAME)
    if not session_key:
        return None
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key=session_key)
    return await get_user({"session": store})


def _host_allowed(scope: Scope, headers: dict[bytes, bytes]) -> bool:
    """Whether the request's host is in ``ALLOWED_HOSTS`` (Django's rules, incl. DEBUG)."""
    raw = headers.get(b"host")
    if raw is None:
        server = scope.get("server") or ("", None)
        host = str(server[0])
    else:
        host = raw.decode("latin-1")
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    domain, _port = split_domain_port(host)
    return bool(domain) and validate_host(domain, allowed)


def _parse_max_queued(query_string: bytes) -> int:
    """EB-14: absent → 256; otherwise a plain decimal in ``[16, 2048]`` or a 400."""
    try:
        values = parse_qs(query_string.decode("latin-1"), keep_blank_values=True).get("maxQueued")
    except ValueError:
        values = None
    if not values:
        return DEFAULT_MAX_QUEUED
    raw = values[0]
    if (
        len(values) == 1
        and raw.isascii()
        and raw.isdigit()
        and len(raw.lstrip("0")) <= 4  # any number of leading zeros; bounds int()
        and MAX_QUEUED_MIN <= int(raw) <= MAX_QUEUED_MAX
    ):
        return int(raw)
    problem = "must be given once" if len(values) > 1 else "must be a decimal integer"
    raise ApiError(
        400,
        "invalid_max_queued",
        f"maxQueued {problem} in [{MAX_QUEUED_MIN}, {MAX_QUEUED_MAX}]",
        log_extra=f" value={sanitize_for_log(','.join(values))!r}",
    )


def _credential_details(principal: Principal, owner_id: int | None) -> dict[str, Any]:
    """What revocation needs to know about a subscriber (``Backend.revoke``, the sweep)."""
    claims = principal.claims
    if claims is None:
        return stream_details(
            auth="login",
            user_id=principal.user_id,
            user_version=None,
            session_version=None,
            # Opened on staff rights alone: ends when the user is no longer staff.
            via_staff=principal.is_staff and owner_id != principal.user_id,
        )
    return stream_details(
        auth="token",
        user_id=claims.user_id,
        user_version=claims.user_version,
        session_version=claims.session_version,
    )


def _end_at_expiry(
    live: LiveSession, subscription: Subscription, principal: Principal
) -> asyncio.TimerHandle | None:
    """End the subscription with ``stream_error`` (``token_expired``) when its token expires.

    The client then asks for a fresh token and resumes with its cursor. None for a login
    session (no expiry). Never raises.
    """
    claims = principal.claims
    if claims is None or claims.expires_at is None:
        return None
    end = functools.partial(
        live.bus.disconnect, subscription, "token_expired", frame=expired_frame()
    )
    return asyncio.get_running_loop().call_later(max(0.0, claims.expires_at - time.time()), end)


def _connection_info(
    connection_id: uuid.UUID, scope: Scope, headers: dict[bytes, bytes], admission: _Admission
) -> ConnectionInfo:
    """Who, from where, with which options (for the operator side's listeners)."""
    principal = admission.principal
    return ConnectionInfo(
        id=connection_id,
        session_id=admission.live.session_id,
        auth=principal.auth,
        user_id=principal.user_id,
        subject=principal.name[:150],
        client_addr=str((scope.get("client") or [""])[0] or "")[:64],
        user_agent=sanitize_for_log(headers.get(b"user-agent"), 300),
        client_id=sanitize_for_log(headers.get(b"x-client-id"), 200),
        max_queued=admission.max_queued,
        resumed_from=admission.last_event_id,
    )
