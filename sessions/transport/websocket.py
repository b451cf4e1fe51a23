"""``GET /ws``: many sessions' event buses over one WebSocket (subprotocol ``qwenweb.v1``).

Rules: EB-12 … EB-21 as for the SSE route; docs/protocol.md, "The WebSocket transport".

Concurrency model
    A plain ASGI application routed by scope type (``qwenweb.asgi``, ``ScopeTypes``):
    one socket is its own coroutine (the command loop, which reads ``receive`` and runs
    one command at a time), one *pump* task per subscription
    (:func:`sessions.transport.pump.pump_frames` with a
    :class:`~sessions.transport.ws_protocol.WsFramer`) and one ping task. Everything a
    socket writes goes through its :class:`~sessions.transport.ws_writer.SocketWriter`,
    one message at a time, in order: a subscription's ``reply`` before its first frame,
    an ``unsubscribe`` reply after its last one.

Overflow policy
    The writer's ``send`` waits for the socket, so a client that stops reading stalls
    every pump of its socket; each subscription's queue then overflows on its own and
    the bus warns and evicts it (EB-3 … EB-5), as an SSE stream. A socket that takes no
    byte for ``WRITER_IDLE_TIMEOUT_S`` is closed: its subscriptions are evicted
    (``writer_idle_timeout``).

What it announces
    Each subscription is one connection for the operator side (``ConnectionInfo``
    with ``transport="ws"``): records, metrics, the live subscribers list and the
    dashboard count it like an SSE stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Final, cast

from asgiref.typing import ASGIReceiveCallable as Receive
from asgiref.typing import ASGISendCallable as Send
from asgiref.typing import ASGISendEvent as Message
from asgiref.typing import WebSocketScope as Scope

from sessions.auth import AUTHENTICATION_REQUIRED, authenticate, check_access
from sessions.backends import get_backend
from sessions.backends.base import Backend, SessionClosedError
from sessions.bus import synthetic_frame
from sessions.conf import QwenwebConfig, get_config
from sessions.errors import RETRY_AFTER_S, ApiError
from sessions.hooks import ConnectionObserver, Hooks, hooks
from sessions.models import normalize_session_id
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
    drain_retry_ms,
    host_allowed,
    login_user_from_cookie,
)
from sessions.transport.peer_timeout import PeerTimeouts
from sessions.transport.pump import pump_frames
from sessions.transport.unsent import UnsentGate
from sessions.transport.ws_protocol import (
    PING,
    SUBPROTOCOL,
    Command,
    CommandError,
    WsFramer,
    error_reply,
    parse_command,
    pong,
    reply,
)
from sessions.transport.ws_writer import SocketClosedError, SocketWriter
from sessions.wire import FrameEncoder, sanitize_for_log

__all__ = ["CLOSE_DRAINING", "CLOSE_IDLE", "CLOSE_SHUTDOWN", "CLOSE_SOCKET_LIMIT", "WebSocketRoute"]

logger = logging.getLogger("qwenweb.ws")

CLOSE_SHUTDOWN: Final = 1001
CLOSE_DRAINING: Final = 1012
CLOSE_IDLE: Final = 4408
CLOSE_SOCKET_LIMIT: Final = 4429
_TEARDOWN_S: Final = 1.0
"""How long the pumps of a closed socket get to notice before they are cancelled."""


@dataclass(eq=False, slots=True)
class _Entry:
    """One subscription of a socket: admitted, its pump task once started."""

    admitted: Subscribed
    head: int
    task: asyncio.Task[None] | None = None


@dataclass(eq=False, slots=True)
class _Bucket:
    """The command token bucket: ``burst`` at once, ``rate_per_s`` after."""

    burst: float
    rate_per_s: float
    tokens: float = 0.0
    at: float = field(default_factory=time.monotonic)

    def take(self) -> float:
        """Take one token; return 0.0, or the seconds until one is there (nothing taken)."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate_per_s)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate_per_s


class WebSocketRoute:
    """The ASGI application for ``/ws`` (docs/protocol.md, "The WebSocket transport").

    Args:
        backend: the backend to subscribe to; default :func:`get_backend` per socket.
        hooks: where subscriptions are announced; default the process's.
    """

    def __init__(self, *, backend: Backend | None = None, hooks: Hooks = hooks) -> None:
        self._backend = backend
        self.hooks = hooks
        self.encoder = FrameEncoder()
        #: Open sockets per user id in this process (WS_MAX_SOCKETS_PER_USER).
        self.sockets_per_user: dict[int, int] = {}
        self._peer_timeouts: PeerTimeouts | None = None

    @property
    def backend(self) -> Backend:
        """The backend this route subscribes to."""
        return self._backend if self._backend is not None else get_backend()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        headers = _headers(scope)
        client = str((scope.get("client") or [""])[0] or "")[:64]
        if not host_allowed(headers.get(b"host"), scope.get("server")):
            _log_refusal("disallowed_host", "-", client)
            await send(cast("Message", {"type": "websocket.close", "code": 1008, "reason": ""}))
            return
        if SUBPROTOCOL not in (scope.get("subprotocols") or ()):
            _log_refusal("subprotocol_required", "-", client)
            await send(cast("Message", {"type": "websocket.close", "code": 1002, "reason": ""}))
            return
        backend = self.backend
        if self._peer_timeouts is None:  # half-open peers: the kernel's TCP_USER_TIMEOUT
            self._peer_timeouts = PeerTimeouts(backend.config.peer_timeout_s)
        self._peer_timeouts.ensure()
        await send(
            cast(
                "Message",
                {"type": "websocket.accept", "subprotocol": SUBPROTOCOL, "headers": []},
            )
        )
        socket = _Socket(self, backend, scope, headers, send, client)
        await socket.run(receive)


class _Socket:
    """One accepted socket: its commands, its subscriptions, its writer."""

    def __init__(
        self,
        route: WebSocketRoute,
        backend: Backend,
        scope: Scope,
        headers: dict[bytes, bytes],
        send: Send,
        client: str,
    ) -> None:
        self.route, self.backend, self.client = route, backend, client
        self.config: QwenwebConfig = backend.config
        self.headers = headers
        self.user_agent = sanitize_for_log(headers.get(b"user-agent"), 300)
        self.client_id = sanitize_for_log(headers.get(b"x-client-id"), 200)
        self.cookie = headers.get(b"cookie") if _cookie_allowed(scope, headers, client) else None
        self.gate = UnsentGate.find(
            scope.get("client"), scope.get("server"), self.config.ws_max_unsent_bytes
        )
        self.writer = SocketWriter(send, self.config.writer_idle_timeout_s, self._idle, self.gate)
        self.entries: dict[str, _Entry | None] = {}  # None: being admitted
        self.bucket = _Bucket(self.config.ws_command_burst, self.config.ws_command_rate_per_s)
        self.bucket.tokens = self.bucket.burst
        self.owner: int | None = None
        self.gone = False
        self._reader: asyncio.Task[Any] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self, receive: Receive) -> None:
        """Serve the socket until the client leaves, it idles, or the server stops."""
        self._reader = asyncio.current_task()
        pinger = asyncio.ensure_future(self._ping())
        try:
            if process_state.draining:
                await self.writer.close(CLOSE_DRAINING, "server_draining")
            elif not await self._claim_cookie_user():
                await self.writer.close(CLOSE_SOCKET_LIMIT, "socket_limit_exceeded")
            await self._commands(receive)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not (self.writer.idle_fired and task is not None and task.uncancel() == 0):
                raise
        finally:
            self.gone = True
            pinger.cancel()
            await self._teardown()
            self.writer.stop()
            if self.gate is not None:
                self.gate.close()
            if self.owner is not None:
                count = self.route.sockets_per_user.get(self.owner, 1) - 1
                if count > 0:
                    self.route.sockets_per_user[self.owner] = count
                else:
                    self.route.sockets_per_user.pop(self.owner, None)

    async def _commands(self, receive: Receive) -> None:
        while True:
            message = cast("dict[str, Any]", await receive())
            if message["type"] == "websocket.disconnect":
                return
            if message["type"] != "websocket.receive" or self.writer.closed:
                continue  # a closed socket waits for the server's disconnect
            text = message.get("text")
            raw = text if text is not None else message.get("bytes")
            try:
                command = parse_command(raw, self.config.ws_max_message_bytes)
                wait_s = self.bucket.take()
                if wait_s:
                    raise CommandError(
                        "rate_limited",
                        "too many commands; slow down",
                        ref=command.ref,
                        session=command.session,
                        limit=self.config.ws_command_burst,
                        retryAfterMs=int(wait_s * 1000) + 1,
                    )
                await self._run(command)
            except CommandError as refusal:
                _log_refusal(refusal.code, refusal.session or "-", self.client)
                await self._send_text(
                    error_reply(
                        refusal.ref,
                        refusal.session,
                        refusal.code,
                        refusal.message,
                        **refusal.extra,
                    )
                )

    async def _run(self, command: Command) -> None:
        if command.op == "ping":
            await self._send_text(pong(command.ref))
        elif command.op == "subscribe":
            await self._subscribe(command)
        elif command.op == "unsubscribe":
            await self._unsubscribe(command)
        else:
            await self._refresh(command)

    async def _subscribe(self, command: Command) -> None:
        raw = cast("str", command.session)
        key = normalize_session_id(raw) or raw
        if key in self.entries:
            raise CommandError(
                "already_subscribed", "this socket already carries the session", ref=command.ref,
                session=raw,
            )  # fmt: skip
        if len(self.entries) >= self.config.ws_max_subscriptions:
            raise CommandError(
                "subscription_limit_exceeded",
                "this socket carries the most subscriptions it may",
                ref=command.ref,
                session=raw,
                limit=self.config.ws_max_subscriptions,
            )
        if process_state.draining:
            raise CommandError(
                "server_draining",
                "the server is shutting down; reconnect",
                ref=command.ref,
                session=raw,
                retryAfterMs=drain_retry_ms(),
            )
        self.entries[key] = None  # held while admission awaits: a duplicate is refused
        try:
            admitted = await admit(self.backend, self._request(command, raw))
        except BaseException as exc:
            self.entries.pop(key, None)
            raise _refusal(exc, command, raw, self.route.hooks) from None
        if not self._claim_token_user(admitted):
            admitted.release()
            self.entries.pop(key, None)
            raise CommandError(
                "socket_limit_exceeded",
                "this user has the most sockets it may in this process",
                ref=command.ref,
                session=raw,
                limit=self.config.ws_max_sockets_per_user,
            )
        entry = _Entry(admitted, admitted.live.bus.last_event_id)
        self.entries[key] = entry
        entry.task = asyncio.ensure_future(self._deliver(key, entry, command.ref))

    def _request(self, command: Command, raw: str) -> AdmissionRequest:
        token = command.token
        cookie = self.cookie
        return AdmissionRequest(
            session_id=raw,
            authorization=None if token is None else "Bearer " + token,
            load_user=lambda: login_user_from_cookie(cookie),
            last_event_id=command.last_event_id,
            epoch=command.epoch,
            max_queued=command.max_queued,
            client_id=self.client_id,
            client_addr=self.client,
            user_agent=self.user_agent,
            transport="ws",
        )

    async def _unsubscribe(self, command: Command) -> None:
        raw = cast("str", command.session)
        key = normalize_session_id(raw) or raw
        entry = self.entries.get(key)
        if entry is None or entry.task is None:
            raise CommandError(
                "not_subscribed", "this socket does not carry the session", ref=command.ref,
                session=raw,
            )  # fmt: skip
        del self.entries[key]
        entry.admitted.subscription.abort()
        await asyncio.wait({entry.task})  # its last frame goes out before the reply
        await self._send_text(reply(command.ref, raw))

    async def _refresh(self, command: Command) -> None:
        raw = cast("str", command.session)
        key = normalize_session_id(raw) or raw
        entry = self.entries.get(key)
        if entry is None:
            raise CommandError(
                "not_subscribed", "this socket does not carry the session", ref=command.ref,
                session=raw,
            )  # fmt: skip
        live = entry.admitted.live
        try:
            principal = await authenticate("Bearer " + cast("str", command.token), _nobody)
            check_access(principal, live.session_id, live.owner_id, "read")
        except ApiError as refusal:
            raise _refusal(refusal, command, raw, self.route.hooks) from None
        if self.entries.get(key) is not entry or entry.admitted.subscription.ended:
            # (it ended while the token was checked: its last frames are on their way)
            raise CommandError(
                "not_subscribed", "this socket does not carry the session", ref=command.ref,
                session=raw,
            )  # fmt: skip
        entry.admitted.renew(principal)
        await self._send_text(reply(command.ref, raw))

    async def _deliver(self, key: str, entry: _Entry, ref: Any) -> None:
        """The reply, then the subscription's frames until it ends; then its record."""
        admitted = entry.admitted
        live, subscription = admitted.live, admitted.subscription
        observer: ConnectionObserver | None = None
        try:
            await self.writer.text(
                reply(ref, live.session_id, epoch=live.bus.epoch, lastEventId=entry.head)
            )
            observer = self.route.hooks.connection_opened(admitted.info)
            await pump_frames(
                subscription,
                self.writer,
                self.config.stream_heartbeat_s,
                observer,
                framer=WsFramer(self.route.encoder, live.session_id),
            )
            observer.closed(*(admitted.ended_by_bus() or (CLIENT_DISCONNECT, "")))
        except asyncio.CancelledError:
            if observer is not None:
                observer.closed(*self._cancel_reason(admitted))
            raise
        except Exception as exc:
            if observer is not None:
                observer.closed(*self._failure(admitted, exc))
        finally:
            admitted.release()
            if self.entries.get(key) is entry:
                del self.entries[key]
            if not self.entries and not self.gone:
                self._close_if_stopping()

    def _failure(self, admitted: Subscribed, exc: Exception) -> tuple[str, str]:
        """How a pump that raised ended; a live socket is told with ``stream_error``."""
        if self.gone or isinstance(exc, SocketClosedError):
            return admitted.ended_by_bus() or (CLIENT_DISCONNECT, "")
        detail = f"{type(exc).__name__}: {sanitize_for_log(str(exc), 200)}"
        logger.error(
            "stream_error session=%s subscriber=%s error=%s transport=ws",
            admitted.live.session_id,
            admitted.subscription.label,
            detail,
        )
        frame = synthetic_frame("stream_error", {"error": "internal error while streaming"})
        framer = WsFramer(self.route.encoder, admitted.live.session_id)
        wire, _ = framer.encode(frame)
        self._background(self._send_text(wire.decode()))
        return STREAM_ERROR, detail

    def _cancel_reason(self, admitted: Subscribed) -> tuple[str, str]:
        if self.writer.idle_fired:
            return (admitted.ended_by_bus() or (STREAM_ERROR, ""))[0], "writer_idle_timeout"
        if self.gone:
            return admitted.ended_by_bus() or (CLIENT_DISCONNECT, "")
        return SERVER_SHUTDOWN, ""

    def _close_if_stopping(self) -> None:
        """Once a draining (or stopping) server has ended every subscription: close."""
        if process_state.draining:
            self._background(self.writer.close(CLOSE_DRAINING, "server_draining"))
        elif process_state.shutting_down:
            self._background(self.writer.close(CLOSE_SHUTDOWN, "server_shutdown"))

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _idle(self) -> None:
        """The socket took no byte for the writer idle timeout: evict all, close."""
        idle_s = self.writer.idle_s
        logger.warning(
            "ws_writer_idle client=%s subscriptions=%d idle_s=%g",
            self.client,
            len(self.entries),
            idle_s,
        )
        for entry in self.entries.values():
            if entry is not None:
                sub = entry.admitted.subscription
                entry.admitted.live.bus.evict(sub, "writer_idle_timeout", idleS=idle_s)
        for entry in self.entries.values():
            if entry is not None and entry.task is not None:
                entry.task.cancel()
        if self._reader is not None:
            self._reader.cancel()

    async def _teardown(self) -> None:
        entries = [entry for entry in self.entries.values() if entry is not None]
        for entry in entries:
            entry.admitted.subscription.abort()
        tasks = {entry.task for entry in entries if entry.task is not None}
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=_TEARDOWN_S)
            for task in pending:  # blocked in a send the server never completes
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        self.entries.clear()

    async def _ping(self) -> None:
        """``{"op":"ping"}`` after ``HEARTBEAT_INTERVAL_S`` of silence on the socket."""
        interval_s = self.config.stream_heartbeat_s
        loop = asyncio.get_running_loop()
        while True:
            due = self.writer.last_write + interval_s
            if due > loop.time() or self.writer.busy:
                await asyncio.sleep(max(due - loop.time(), interval_s / 4))
                continue
            try:
                await self.writer.text(PING)
            except Exception:
                return

    async def _send_text(self, text: str) -> None:
        """Write a reply or a last frame; a socket closed or gone meanwhile is no error."""
        with contextlib.suppress(Exception):
            await self.writer.text(text)

    async def _claim_cookie_user(self) -> bool:
        """Count the socket for its cookie's user; False when that user has too many."""
        if self.cookie is None:
            return True
        user = await login_user_from_cookie(self.cookie)
        if user is None or not getattr(user, "is_authenticated", False):
            return True
        return self._claim(int(user.pk))

    def _claim_token_user(self, admitted: Subscribed) -> bool:
        """A token-only socket belongs to the user of its first accepted token."""
        claims = admitted.principal.claims
        if self.owner is not None or claims is None or claims.user_id is None:
            return True
        return self._claim(claims.user_id)

    def _claim(self, user_id: int) -> bool:
        counts = self.route.sockets_per_user
        if counts.get(user_id, 0) >= self.config.ws_max_sockets_per_user:
            logger.warning(
                "ws_socket_limit user=%d limit=%d client=%s",
                user_id,
                self.config.ws_max_sockets_per_user,
                self.client,
            )
            return False
        counts[user_id] = counts.get(user_id, 0) + 1
        self.owner = user_id
        return True


def _refusal(exc: BaseException, command: Command, session: str, announce: Hooks) -> BaseException:
    """A refused subscribe or refresh as the reply's :class:`CommandError`."""
    ref = command.ref
    if isinstance(exc, ApiError):
        announce.request_rejected(exc.status, exc.code)
        extra = dict(exc.extra)
        if exc.status == 503:
            extra["retryAfterMs"] = (exc.retry_after_s or RETRY_AFTER_S) * 1000
        message = exc.message
        if message == AUTHENTICATION_REQUIRED:  # the HTTP wording names a header
            message = "authentication required: send a read token in the subscribe's token"
        return CommandError(exc.code, message, ref=ref, session=session, **extra)
    if isinstance(exc, SessionClosedError):
        return CommandError("session_closed", "the session is closed", ref=ref, session=session)
    if isinstance(exc, SubscriberLimitError):
        return CommandError(
            "subscriber_limit_exceeded",
            "subscriber limit reached",
            ref=ref,
            session=session,
            limit=exc.limit,
            retryAfterMs=LIMIT_RETRY_MS,
        )
    return exc


async def _nobody() -> None:
    return None


def _log_refusal(code: str, session: str, client: str) -> None:
    logger.warning(
        "ws_refused code=%s session=%s client=%s", code, sanitize_for_log(session, 80), client
    )


def _cookie_allowed(scope: Scope, headers: dict[bytes, bytes], client: str) -> bool:
    """Cookie authentication only for the site's own origin or an allowed CORS origin.

    Without ``Origin`` (not a browser) or from any other origin: tokens only (no
    cross-site WebSocket hijacking). Logs one line when a cookie is ignored.
    """
    raw_origin = headers.get(b"origin")
    if raw_origin is None:
        return False
    origin = raw_origin.decode("latin-1").lower()
    scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
    own = f"{scheme}://{headers.get(b'host', b'').decode('latin-1').lower()}"
    if origin == own or origin in get_config().cors_allowed_origins:
        return True
    if b"cookie" in headers:
        logger.warning(
            "ws_cookie_ignored origin=%r client=%s", sanitize_for_log(origin, 200), client
        )
    return False


def _headers(scope: Scope) -> dict[bytes, bytes]:
    """The request headers by lowercase name (a repeated one joined with ``,``; cookies
    with ``; ``)."""
    headers: dict[bytes, bytes] = {}
    for name, value in scope.get("headers", ()):
        key = bytes(name).lower()
        if key in headers:
            joiner = b"; " if key == b"cookie" else b","
            headers[key] = headers[key] + joiner + bytes(value)
        else:
            headers[key] = bytes(value)
    return headers
