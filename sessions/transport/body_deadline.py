"""Request bodies that do not arrive in time are answered 408 and closed (issue 26).

granian closes a connection whose request *headers* are late
(``REQUEST_HEADER_TIMEOUT_S``) but waits for a body for ever: 600 slow POSTs held 600
descriptors and requests for minutes. :class:`BodyDeadline` wraps the application: a
request that announces a body (``Content-Length`` above 0, or ``Transfer-Encoding``)
must deliver all of it within ``REQUEST_BODY_TIMEOUT_S`` of its headers, or within
``ANONYMOUS_BODY_TIMEOUT_S`` when it carries no credential (no ``Authorization`` header
and no login cookie: anyone can open those). Past it the application is told the client
went away (``http.disconnect``: Django drops the request unanswered) and the client gets
408 ``body_timeout`` with ``Connection: close``; the server then closes the connection.
Requests without a body (the streams) pass untouched.

A body that ends before it is complete (granian's ``receive`` answers
``http.disconnect`` for one it cannot decode, e.g. an invalid chunk-size line, and then
answered the request it left unanswered with its own plain-text 500) is answered 400
``invalid_request`` the same way; when the client did go away, nobody reads it.

Concurrency: one wrapper per request, on the server's event loop; no state is shared.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

from asgiref.sync import markcoroutinefunction
from django.conf import settings

from sessions.conf import get_config
from sessions.errors import ApiError, error_headers
from sessions.hooks import hooks
from sessions.wire import sanitize_for_log

__all__ = ["BodyDeadline"]

logger = logging.getLogger("qwenweb.api")

Scope = dict[str, Any]
Message = dict[str, Any]


def _announces_body(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return True
    return False


def _carries_credential(headers: list[tuple[bytes, bytes]]) -> bool:
    session_cookie = settings.SESSION_COOKIE_NAME.encode() + b"="
    return any(
        name == b"authorization" or (name == b"cookie" and session_cookie in value)
        for name, value in headers
    )


class BodyDeadline:
    """Wrap an ASGI application: bodies late past their bound are answered 408.

    Args:
        app: the application (the project's router).

    Guarantees: a request's body is read by the application within its bound or not at
    all; the 408 is sent only if the application has not started its answer; every other
    message passes unchanged. One ``body_timeout`` log line per request cut. A request
    without a body gets the application's own awaitable (no frame of this wrapper is held
    while a stream lasts: memory per idle stream, issue 23).
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    @markcoroutinefunction
    def __call__(self, scope: Scope, receive: Any, send: Any) -> Coroutine[Any, Any, None]:
        headers = scope.get("headers") or []
        if scope["type"] != "http" or not _announces_body(headers):
            return self.app(scope, receive, send)  # type: ignore[no-any-return]
        return self._bounded(scope, receive, send, headers)

    async def _bounded(
        self, scope: Scope, receive: Any, send: Any, headers: list[tuple[bytes, bytes]]
    ) -> None:
        config = get_config()
        bound_s = (
            config.request_body_timeout_s
            if _carries_credential(headers)
            else config.anonymous_body_timeout_s
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + bound_s
        complete = timed_out = started = cut_short = False

        async def timed_receive() -> Message:
            nonlocal complete, timed_out, cut_short
            if complete or timed_out:
                return await receive() if complete else {"type": "http.disconnect"}
            try:
                async with asyncio.timeout_at(deadline):
                    message: Message = await receive()
            except TimeoutError:
                timed_out = True
                return {"type": "http.disconnect"}
            if message["type"] != "http.request":
                cut_short = True  # (a disconnect, or a body the server could not decode)
                complete = True
            elif not message.get("more_body", False):
                complete = True
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if timed_out and not started:
                return  # (the application's answer after the cut: the 408 replaces it)
            started = True
            await send(message)

        await self.app(scope, timed_receive, tracked_send)
        if started:
            return
        if timed_out:
            error = ApiError(
                408,
                "body_timeout",
                f"the request body did not arrive within {bound_s:g} s",
                limit=bound_s,
                log_extra=f" bound_s={bound_s:g}",
            )
            await _answer(scope, send, error)
        elif cut_short:
            error = ApiError(
                400,
                "invalid_request",
                "the request body ended early or could not be decoded (e.g. an invalid chunk size)",
            )
            with contextlib.suppress(Exception):  # (the client may indeed be gone)
                await _answer(scope, send, error)


async def _answer(scope: Scope, send: Any, error: ApiError) -> None:
    """Send ``error`` with ``Connection: close`` (the body's rest is never read)."""
    hooks.request_rejected(error.status, error.code)
    logger.warning(
        "api_rejected method=%s path=%s status=%d code=%s%s",
        scope.get("method"),
        sanitize_for_log(scope.get("path", ""), 120),
        error.status,
        error.code,
        error.log_extra,
    )
    body = error.body()
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [
                *error_headers(error.status),
                (b"connection", b"close"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
