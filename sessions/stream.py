"""``GET /session/<id>/events``: the session's event bus as Server-Sent Events.

Contract: ``shared/spec/event-bus.md`` section 4 (EB-12 ... EB-20, EB-22).

Concurrency model
    This is a plain ASGI application routed by Channels in front of Django's
    ``ASGIHandler`` (``qwenweb.asgi``), so an open stream is one coroutine on the server's
    event loop: no OS thread is pinned per stream (EB-22). Database work (the login
    session, loading a session's row) runs through ``database_sync_to_async`` for the
    duration of one query. While the stream is open, two tasks run side by side: the
    *pump* moves frames from the subscription to ``send`` and writes heartbeats, and the
    *watcher* waits for ``http.disconnect``. Whichever ends first ends the other, and the
    subscription is aborted in ``finally`` (EB-20).

Overflow policy
    The pump drains the subscriber queue only as fast as ``send`` returns, so a server
    whose ``send`` waits on the socket turns a client that stops reading into a full
    queue, then ``slow_client_warning`` and ``client_evicted`` (EB-4, EB-5, EB-21). The
    frames already queued are written in one ``send`` of at most ``_MAX_BATCH_BYTES``.

Operator records (issue 4)
    Each attached subscriber gets a :class:`sessions.records.ConnectionRecord`: the pump
    reports every frame and byte after ``send`` accepted it (so a recorded
    ``client_evicted`` payload is exactly what the client was sent), and the handler
    records how the stream ended. Those calls only touch memory; the records are
    written in batches off the stream's path.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from importlib import import_module
from typing import Any, Final, Protocol
from urllib.parse import parse_qs

import orjson
from channels.auth import get_user
from django.conf import settings
from django.http.cookie import parse_cookie
from django.http.request import split_domain_port, validate_host

from sessions import records, runtime
from sessions.auth import TokenError, parse_bearer, verify_token
from sessions.bus import Frame, SubscriberLimitExceededError, Subscription, synthetic_frame
from sessions.conf import get_config
from sessions.models import SubscriberConnection, normalize_session_id
from sessions.sse import (
    DEFAULT_RETRY_MS,
    HEARTBEAT,
    encode_frame,
    encode_retry,
    parse_epoch,
    parse_last_event_id,
    sanitize_for_log,
)
from sessions.views import MAX_QUEUED_DEFAULT, MAX_QUEUED_MAX, MAX_QUEUED_MIN

__all__ = ["SessionEventStream", "encode_synthetic", "pump_frames"]

logger = logging.getLogger("qwenweb.stream")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

LIMIT_RETRY_MS: Final = 5000
_MAX_BATCH_BYTES: Final = 256 * 1024
_STREAM_HEADERS: Final = (
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
)


class _Reject(Exception):
    """Raised to answer the request with a JSON error before any stream byte (EB-12 ... EB-15).

    ``log_extra`` is appended to the one log line (e.g. `` value='9999'``).
    """

    def __init__(self, status: int, code: str, message: str, log_extra: str = "") -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.log_extra = log_extra


class FrameObserver(Protocol):
    """What :func:`pump_frames` reports to (a :class:`sessions.records.ConnectionRecord`)."""

    def frame_written(self, frame_type: str, nbytes: int, chunk: bytes) -> None: ...

    def bytes_written(self, nbytes: int) -> None: ...


@dataclass(frozen=True, slots=True)
class _Admission:
    """What the checks of EB-12 ... EB-15 found: the session, the cursor, who is asking."""

    live: runtime.LiveSession
    last_event_id: int | None
    epoch: str | None
    max_queued: int
    auth: str
    user_id: int | None
    subject: str


def encode_synthetic(frame: Frame) -> bytes:
    """Serialize a synthetic frame with ``_meta.serverTimestamp`` set now (EB-18). No ``id``."""
    envelope = dict(frame)
    envelope["_meta"] = {"serverTimestamp": time.time_ns() // 1_000_000}
    return encode_frame(event_type=frame.type, data_json=orjson.dumps(envelope))


def _encode(frame: Frame) -> bytes:
    if frame.id is None:
        return encode_synthetic(frame)
    if frame.json is None:
        # EB-2: the data could not be serialized. The event keeps its id and type so the
        # client's cursor stays exact; the data goes out as null with a note.
        envelope = dict(frame)
        envelope["data"] = None
        envelope["_meta"] = {**envelope.get("_meta", {}), "dataError": "not JSON-serializable"}
        return encode_frame(
            event_type=frame.type, data_json=orjson.dumps(envelope, default=str), event_id=frame.id
        )
    wire = frame.wire
    if wire is None:  # framed once, shared by every subscriber it is fanned out to
        wire = frame.wire = encode_frame(
            event_type=frame.type, data_json=frame.json, event_id=frame.id
        )
    return wire


class WriterIdleTimeoutError(Exception):
    """Raised by :func:`pump_frames` when ``send`` accepted nothing for ``idle_s`` seconds."""

    def __init__(self, idle_s: float) -> None:
        super().__init__(f"the socket accepted no byte for {idle_s:g} s")
        self.idle_s = idle_s


async def _send_within(send: Send, message: Message, idle_s: float | None) -> None:
    if idle_s is None:
        await send(message)
        return
    try:
        async with asyncio.timeout(idle_s):
            await send(message)
    except TimeoutError:
        raise WriterIdleTimeoutError(idle_s) from None


async def pump_frames(
    subscription: Subscription,
    send: Send,
    heartbeat_interval_s: float,
    observer: FrameObserver | None = None,
    writer_idle_timeout_s: float | None = None,
) -> None:
    """Write every frame of ``subscription`` to ``send`` until it ends (EB-18).

    Frames already queued go out together in one body message (at most 256 KiB), so a
    burst costs one ``send`` while every frame still reaches the socket as soon as it is
    produced. When nothing arrives for ``heartbeat_interval_s`` seconds a ``: heartbeat``
    comment is written. Once ``send`` returned, ``observer`` (if any) is told about each
    frame (type, size, encoded bytes) and heartbeat. Returns when the subscription ends
    (evicted, bus closed, disconnected); raises whatever ``send`` or the iterator raises,
    and :class:`WriterIdleTimeoutError` when one ``send`` (frames or a heartbeat, which go
    through the same path, so a half-open connection is found too) does not return within
    ``writer_idle_timeout_s`` seconds: the server's socket buffers are full and the
    client takes nothing.
    """
    while True:
        try:
            frame = await subscription.next_frame(heartbeat_interval_s)
        except StopAsyncIteration:
            return
        if frame is None:
            heartbeat = {"type": "http.response.body", "body": HEARTBEAT, "more_body": True}
            await _send_within(send, heartbeat, writer_idle_timeout_s)
            if observer is not None:
                observer.bytes_written(len(HEARTBEAT))
            continue
        frames = [frame]
        chunks = [_encode(frame)]
        size = len(chunks[0])
        while size < _MAX_BATCH_BYTES:
            queued = subscription.next_nowait()
            if queued is None:
                break
            chunk = _encode(queued)
            frames.append(queued)
            chunks.append(chunk)
            size += len(chunk)
        body = {"type": "http.response.body", "body": b"".join(chunks), "more_body": True}
        await _send_within(send, body, writer_idle_timeout_s)
        if observer is not None:
            for written, chunk in zip(frames, chunks, strict=True):
                observer.frame_written(written.type, len(chunk), chunk)


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class SessionEventStream:
    """The ASGI application for ``/session/<session_id>/events`` (section 4).

    ``GET`` and ``HEAD`` are served here; any other method is handed to ``fallback``
    (Django, for ``POST`` = publish). Expects ``scope["url_route"]["kwargs"]
    ["session_id"]`` (Channels' ``URLRouter``). Without a bearer token it reads the
    Django login session from the request's cookie itself (so a plain ``EventSource``
    works for logged-in users).
    """

    def __init__(self, fallback: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.fallback = fallback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD"):
            await self.fallback(scope, receive, send)
            return
        session_id = scope["url_route"]["kwargs"]["session_id"]
        headers = _headers(scope)
        try:
            admission = await self._admit(scope, session_id, headers)
        except _Reject as reject:
            await self._reject(send, scope, session_id, reject)
            return
        except runtime.SessionClosedError:
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        live = admission.live
        connection_id = uuid.uuid4()
        try:
            live, subscription = await runtime.subscribe(
                live,
                last_event_id=admission.last_event_id,
                max_queued=admission.max_queued,
                epoch=admission.epoch,
                label=str(connection_id),
            )
        except SubscriberLimitExceededError as exc:
            await self._limit_reached(send, live, exc.limit)
            return
        except runtime.SessionClosedError:
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        except runtime.BackendUnavailableError as exc:
            await self._reject(send, scope, session_id, _unavailable(exc))
            return
        record: records.ConnectionRecord | None = None
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [*_STREAM_HEADERS, (b"x-event-epoch", live.bus.epoch.encode())],
                }
            )
            if scope["method"] == "HEAD":
                await send({"type": "http.response.body", "body": b""})
                return
            record = _open_record(connection_id, scope, headers, admission)
            # daphne sends no headers until the first body bytes: write retry now (EB-18).
            retry = encode_retry(DEFAULT_RETRY_MS)
            await send({"type": "http.response.body", "body": retry, "more_body": True})
            record.bytes_written(len(retry))
            reason, detail = await self._serve(subscription, receive, send, live, record)
            record.closed(reason, detail)
        except asyncio.CancelledError:
            if record is not None:  # the server cancels its streams when it shuts down
                record.closed(_SERVER_SHUTDOWN)
            raise
        except Exception as exc:
            if record is not None:  # `send` of the headers or retry line failed
                record.closed(_STREAM_ERROR, f"{type(exc).__name__}: {exc}")
            raise
        finally:
            subscription.abort()

    async def _admit(
        self, scope: Scope, raw_session_id: str, headers: dict[bytes, bytes]
    ) -> _Admission:
        """Run the checks of EB-12 ... EB-15 in order; raise ``_Reject`` on the first failure."""
        if not _host_allowed(scope, headers):  # what Django's get_host() does for its views
            raise _Reject(400, "disallowed_host", "the Host header is not in ALLOWED_HOSTS")
        session_id = normalize_session_id(raw_session_id)
        authorization = headers.get(b"authorization")
        user_id: int | None = None
        is_staff = False
        subject = ""
        if authorization is not None:  # EB-12
            try:
                claims = verify_token(parse_bearer(authorization))
            except TokenError as exc:
                raise _Reject(401, "unauthorized", str(exc)) from None
            if session_id is None or not claims.grants(session_id, "read"):
                raise _Reject(403, "forbidden", "this token does not grant read access here")
            subject = claims.subject
        else:
            user = await _login_user(headers)
            if user is None or not user.is_authenticated:
                raise _Reject(
                    401,
                    "unauthorized",
                    "authentication required: send Authorization: Bearer <token>",
                )
            user_id, is_staff, subject = user.pk, user.is_staff, user.get_username()
        last_event_id, epoch = self._cursor(headers, raw_session_id)  # EB-13
        max_queued = _parse_max_queued(scope.get("query_string", b""))  # EB-14
        if session_id is None:  # EB-15
            raise _Reject(404, "not_found", "unknown session")
        try:
            live = await runtime.get_live_session(session_id)
        except runtime.SessionNotFoundError:
            raise _Reject(404, "not_found", "unknown session") from None
        except runtime.BackendUnavailableError as exc:
            raise _unavailable(exc) from None
        except runtime.SessionClosedError as closed:
            owner_id = closed.owner_id  # the 204 is for readers only (EB-12 before EB-15)
            if authorization is None and not (is_staff or owner_id == user_id):
                raise _Reject(
                    403, "forbidden", "only the session's owner or staff may read it"
                ) from None
            raise
        if authorization is None and not (is_staff or live.owner_id == user_id):
            raise _Reject(403, "forbidden", "only the session's owner or staff may read it")
        return _Admission(
            live=live,
            last_event_id=last_event_id,
            epoch=epoch,
            max_queued=max_queued,
            auth="token" if authorization is not None else "login",
            user_id=user_id,
            subject=subject,
        )

    @staticmethod
    def _cursor(headers: dict[bytes, bytes], session_id: str) -> tuple[int | None, str | None]:
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

    async def _serve(
        self,
        subscription: Subscription,
        receive: Receive,
        send: Send,
        live: runtime.LiveSession,
        record: records.ConnectionRecord,
    ) -> tuple[str, str]:
        """Stream until the client leaves, the subscription ends or the pump fails.

        Returns how the stream ended for the record: ``(end reason, detail)``. A writer
        that stays idle evicts the subscriber (``writer_idle_timeout``) and ends the
        response without writing more: its socket takes nothing.
        """
        session_id = live.session_id
        config = get_config()
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
                config.heartbeat_interval_s,
                record,
                writer_idle_timeout_s=config.writer_idle_timeout_s,
            )
        except WriterIdleTimeoutError as idle:
            if not disconnected:
                live.bus.evict(subscription, "writer_idle_timeout", idleS=idle.idle_s)
                reason, _ = _ended_by_bus(subscription) or (_STREAM_ERROR, "")
                return reason, "writer_idle_timeout"
        except Exception as exc:
            error = exc
        finally:
            subscription.abort()
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        if disconnected:
            # The client went away: nothing more to write, nothing to log.
            return _ended_by_bus(subscription) or (_CLIENT_DISCONNECT, "")
        if error is not None:  # EB-19
            detail = f"{type(error).__name__}: {sanitize_for_log(str(error), 200)}"
            logger.error(
                "stream_error session=%s subscriber=%s error=%s",
                session_id,
                subscription.label,
                detail,
            )
            body = encode_synthetic(
                synthetic_frame("stream_error", {"error": "internal error while streaming"})
            )
            try:
                await send({"type": "http.response.body", "body": body, "more_body": False})
                record.frame_written("stream_error", len(body), body)
            except Exception:  # the connection itself may be what failed
                logger.debug("stream_error frame could not be written", exc_info=True)
            return _STREAM_ERROR, detail
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return _ended_by_bus(subscription) or (_CLIENT_DISCONNECT, "")

    async def _limit_reached(self, send: Send, live: runtime.LiveSession, limit: int) -> None:
        """EB-16: 200, ``Retry-After: 5``, ``retry: 5000``, one ``stream_error``, end."""
        logger.warning("subscriber_limit_exceeded session=%s limit=%d", live.session_id, limit)
        frame = encode_synthetic(
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
                "status": 200,
                "headers": [
                    *_STREAM_HEADERS,
                    (b"x-event-epoch", live.bus.epoch.encode()),
                    (b"retry-after", b"5"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": encode_retry(LIMIT_RETRY_MS) + frame})

    async def _reject(self, send: Send, scope: Scope, session_id: str, reject: _Reject) -> None:
        logger.warning(
            "stream_rejected session=%s status=%d code=%s error=%s client=%s%s",
            sanitize_for_log(session_id),
            reject.status,
            reject.code,
            reject.message,
            (scope.get("client") or ["-"])[0],
            reject.log_extra,
        )
        body = orjson.dumps({"error": reject.message, "code": reject.code})
        headers = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]
        if reject.status == 401:
            headers.append((b"www-authenticate", b'Bearer realm="qwenweb"'))
        if reject.status == 503:
            headers.append((b"retry-after", b"3"))
        await send({"type": "http.response.start", "status": reject.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _unavailable(exc: Exception) -> _Reject:
    """A 503 for a stream that cannot be served because Redis is out of reach (issue 6)."""
    return _Reject(
        503,
        "backend_unavailable",
        "the event store (Redis) is unavailable; try again shortly",
        log_extra=f" detail={sanitize_for_log(str(exc), 200)!r}",
    )


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
        return MAX_QUEUED_DEFAULT
    raw = values[0]
    if (
        len(values) == 1
        and raw.isascii()
        and raw.isdigit()
        and len(raw.lstrip("0")) <= 4  # any number of leading zeros; bounds int()
        and MAX_QUEUED_MIN <= int(raw) <= MAX_QUEUED_MAX
    ):
        return int(raw)
    raise _Reject(
        400,
        "invalid_max_queued",
        f"maxQueued must be a decimal integer in [{MAX_QUEUED_MIN}, {MAX_QUEUED_MAX}]",
        log_extra=f" value={sanitize_for_log(','.join(values))!r}",
    )


# -- operator records (issue 4) ------------------------------------------------------------

_CLIENT_DISCONNECT: Final = SubscriberConnection.EndReason.CLIENT_DISCONNECT.value
_STREAM_ERROR: Final = SubscriberConnection.EndReason.STREAM_ERROR.value
_SERVER_DISCONNECT: Final = SubscriberConnection.EndReason.SERVER_DISCONNECT.value
_SERVER_SHUTDOWN: Final = SubscriberConnection.EndReason.SERVER_SHUTDOWN.value
_BUS_END_REASONS: Final = {
    "evicted": SubscriberConnection.EndReason.CLIENT_EVICTED.value,
    "closed": SubscriberConnection.EndReason.SESSION_CLOSED.value,
    "disconnected": SubscriberConnection.EndReason.SERVER_DISCONNECT.value,
}


def _ended_by_bus(subscription: Subscription) -> tuple[str, str] | None:
    """The record's end reason when the bus ended the subscription (EB-5, EB-9), else None.

    A subscriber disconnected while the server shuts down (``sessions.lifecycle``) ended
    because of the shutdown.
    """
    reason = _BUS_END_REASONS.get(subscription.end_reason or "")
    if reason == _SERVER_DISCONNECT and records.recorder.shutting_down:
        reason = _SERVER_SHUTDOWN
    return (reason, "") if reason is not None else None


def _open_record(
    connection_id: uuid.UUID, scope: Scope, headers: dict[bytes, bytes], admission: _Admission
) -> records.ConnectionRecord:
    """Start the connection's record (memory only): who, from where, with which options."""
    return records.connection_opened(
        connection_id=connection_id,
        session_id=admission.live.session_id,
        auth=admission.auth,
        user_id=admission.user_id,
        subject=admission.subject,
        client_addr=str((scope.get("client") or [""])[0] or ""),
        user_agent=sanitize_for_log(headers.get(b"user-agent"), 300),
        client_id=sanitize_for_log(headers.get(b"x-client-id"), 200),
        max_queued=admission.max_queued,
        resumed_from=admission.last_event_id,
    )
