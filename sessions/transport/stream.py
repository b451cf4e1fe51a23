"""``GET /session/<id>/events``: the session's event bus as Server-Sent Events.

Rules: EB-12 ... EB-20 and EB-22 (docs/protocol.md, "The stream").

Concurrency model
    This is a plain ASGI application routed in front of Django's ``ASGIHandler``
    (``qwenweb.asgi``, :mod:`sessions.transport.routes`), so an open stream is one
    coroutine on the server's event loop: no OS thread is pinned per stream (EB-22).
    Database work (the login session, loading a session's row) runs through
    ``database_sync_to_async`` for the duration of one query. While the stream is open
    the *pump* (:mod:`sessions.transport.pump`) moves frames from the subscription to
    ``send`` and writes heartbeats in the request's own task, and a
    :class:`~sessions.transport.disconnect.DisconnectWatch` (callbacks, no task) waits for
    ``http.disconnect``. A disconnect aborts the subscription, which ends the pump; the
    subscription is aborted in ``finally`` either way (EB-20).

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
from collections.abc import Awaitable, Callable
from typing import Any, Final, cast
from urllib.parse import parse_qs

from asgiref.typing import ASGIReceiveCallable as Receive
from asgiref.typing import ASGISendCallable as Send
from asgiref.typing import HTTPScope as Scope

from sessions.backends import get_backend
from sessions.backends.base import Backend, LiveSession, SessionClosedError
from sessions.bus import synthetic_frame
from sessions.conf import get_config
from sessions.cors import cors_headers, is_preflight
from sessions.errors import ApiError, error_headers
from sessions.hooks import ConnectionObserver, Hooks, hooks
from sessions.process_state import process_state
from sessions.transport.admission import (
    CLIENT_DISCONNECT,
    LIMIT_RETRY_MS,
    SERVER_SHUTDOWN,
    STREAM_ERROR,
    AdmissionRequest,
    Subscribed,
    SubscriberLimitError,
    admit,
    drain_frame,
    drain_retry_ms,
    host_allowed,
    login_user_from_cookie,
    max_queued_or_error,
)
from sessions.transport.compressed import GZIP_HEADERS, CompressedSend, stream_codec
from sessions.transport.disconnect import DisconnectWatch
from sessions.transport.evicted_linger import Linger
from sessions.transport.peer_timeout import PeerTimeouts
from sessions.transport.pump import SseFramer, WriterIdleTimeoutError, pump_frames
from sessions.wire import (
    DEFAULT_RETRY_MS,
    FrameEncoder,
    encode_retry,
    sanitize_for_log,
)

__all__ = ["SessionEventsRoute"]

logger = logging.getLogger("qwenweb.stream")


_STREAM_HEADERS: Final = (
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
    (b"vary", b"accept-encoding"),
)


class SessionEventsRoute:
    """The ASGI application for ``/session/<session_id>/events`` (docs/protocol.md).

    ``GET`` and ``HEAD`` are served here; any other method is handed to ``fallback``
    (Django, for ``POST`` = publish). Expects ``scope["url_route"]["kwargs"]
    ["session_id"]`` (:class:`~sessions.transport.routes.Routes`). Without a bearer token
    it reads the Django login session from the request's cookie itself (so a plain ``EventSource``
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
        self.framer = SseFramer(self.encoder)
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
        # The router (Routes, or Channels' URLRouter) adds ``url_route``, no key of the ASGI
        # scope. Taken out: the server keeps the scope as long as the stream, and with it
        # the route's two dicts.
        session_id = cast("dict[str, Any]", scope).pop("url_route")["kwargs"]["session_id"]
        cors = _cors(scope, headers)
        if process_state.draining:
            await self._draining(send, session_id, cors)
            return
        backend = self.backend
        if self._peer_timeouts is None:  # half-open peers: the kernel's TCP_USER_TIMEOUT
            self._peer_timeouts = PeerTimeouts(backend.config.peer_timeout_s)
        self._peer_timeouts.ensure()
        codec: str | None = None
        option_error: ApiError | None = None
        try:
            codec = stream_codec(  # EB-17
                backend.config.stream_compression,
                headers.get(b"accept-encoding"),
                scope.get("query_string", b""),
            )
        except ApiError as refusal:
            option_error = refusal
        request = AdmissionRequest(
            session_id=session_id,
            authorization=headers.get(b"authorization"),
            load_user=functools.partial(login_user_from_cookie, headers.get(b"cookie")),
            last_event_id=headers.get(b"last-event-id"),
            epoch=headers.get(b"x-event-epoch"),
            max_queued=_max_queued(scope.get("query_string", b"")),
            client_id=sanitize_for_log(headers.get(b"x-client-id"), 200),
            client_addr=str((scope.get("client") or [""])[0] or ""),
            user_agent=sanitize_for_log(headers.get(b"user-agent"), 300),
            option_error=option_error,
        )
        try:
            if not host_allowed(headers.get(b"host"), scope.get("server")):
                # what Django's get_host() does for its views
                raise ApiError(400, "disallowed_host", "the Host header is not in ALLOWED_HOSTS")
            admitted = await admit(backend, request)
        except ApiError as reject:
            await self._reject(send, scope, session_id, reject, cors)
            return
        except SessionClosedError:
            await _no_content(send, cors)
            return
        except SubscriberLimitError as limit:
            await self._limit_reached(send, limit.live, limit.limit, cors)
            return
        del request, headers  # (this frame lasts as long as the stream: hold no more)
        live = admitted.live
        if not live.stream_compression:  # the session's own switch (EB-17)
            codec = None
        observer: ConnectionObserver | None = None
        try:
            await send(
                {
                    "type": "http.response.start",
                    "trailers": False,
                    "status": 200,
                    "headers": [
                        *_STREAM_HEADERS,
                        (b"x-event-epoch", live.bus.epoch.encode()),
                        *(GZIP_HEADERS if codec else ()),
                        *cors,
                    ],
                }
            )
            if scope["method"] == "HEAD":
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            observer = self.hooks.connection_opened(admitted.info)
            body_send = CompressedSend(send) if codec else None
            # daphne sends no headers until the first body bytes: write retry now (EB-18).
            retry = encode_retry(DEFAULT_RETRY_MS)
            await (body_send or send)(
                {"type": "http.response.body", "body": retry, "more_body": True}
            )
            if body_send is not None:
                body_send.release()  # a stream that stays idle holds no context (EB-17)
            admitted.subscription.bytes_sent += len(retry)
            observer.bytes_written(len(retry))
            reason, detail = await self._serve(
                admitted, receive, body_send or send, observer, scope
            )
            observer.closed(reason, detail)
        except asyncio.CancelledError:
            if observer is not None:  # the server cancels its streams when it shuts down
                observer.closed(SERVER_SHUTDOWN)
            raise
        except Exception as exc:
            if observer is not None:  # `send` of the headers or retry line failed
                observer.closed(STREAM_ERROR, f"{type(exc).__name__}: {exc}")
            raise
        finally:
            admitted.release()

    async def _serve(
        self,
        admitted: Subscribed,
        receive: Receive,
        send: Send,
        observer: ConnectionObserver,
        scope: Scope,
    ) -> tuple[str, str]:
        """Stream until the client leaves, the subscription ends or the pump fails.

        Returns how the stream ended: ``(end reason, detail)``. A writer that stays idle
        evicts the subscriber (``writer_idle_timeout``) and ends the response without
        writing more: its socket takes nothing.
        """
        config = self.backend.config
        subscription, live = admitted.subscription, admitted.live
        # EB-20: gone at once; the abort also ends the pump's wait. The pump runs in this
        # task and the watch has none of its own (memory per idle stream, issue 23).
        watch = DisconnectWatch(receive, subscription.abort)
        error: Exception | None = None
        linger = Linger.attach(scope, subscription, config)  # B21: the kernel waits too
        try:
            await pump_frames(
                subscription,
                send,
                config.stream_heartbeat_s,  # capped by the peer timeout
                observer,
                writer_idle_timeout_s=config.writer_idle_timeout_s,
                framer=self.framer,
                evicted_linger_s=config.evicted_linger_s,
            )
        except WriterIdleTimeoutError as idle:
            linger.expired()  # an evicted reader's linger ran out: reset, not an orphan
            if not watch.disconnected:
                live.bus.evict(subscription, "writer_idle_timeout", idleS=idle.idle_s)
                reason, _ = admitted.ended_by_bus() or (STREAM_ERROR, "")
                return reason, "writer_idle_timeout"
        except Exception as exc:
            error = exc
        finally:
            linger.close()
            subscription.abort()
            watch.close()
        if watch.disconnected:
            # The client went away: nothing more to write, nothing to log.
            return admitted.ended_by_bus() or (CLIENT_DISCONNECT, "")
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
                observer.frames_written((frame,), (body,), (payload,), len(body))
            except Exception:  # the connection itself may be what failed
                logger.debug("stream_error frame could not be written", exc_info=True)
            return STREAM_ERROR, detail
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return admitted.ended_by_bus() or (CLIENT_DISCONNECT, "")

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


def _headers(scope: Scope) -> dict[bytes, bytes]:
    """Return the request headers keyed by lowercase name; a repeated header keeps all values
    joined with ``,`` (so two ``Last-Event-ID`` values are refused as one invalid value)."""
    headers: dict[bytes, bytes] = {}
    for name, value in scope.get("headers", ()):
        key = bytes(name).lower()
        headers[key] = headers[key] + b"," + bytes(value) if key in headers else bytes(value)
    return headers


def _max_queued(query_string: bytes) -> int | ApiError:
    """EB-14: ``?maxQueued`` of the query string, or the 400 to answer."""
    try:
        values = parse_qs(query_string.decode("latin-1"), keep_blank_values=True).get("maxQueued")
    except ValueError:
        values = None
    return max_queued_or_error(values)
