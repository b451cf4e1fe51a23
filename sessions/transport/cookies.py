"""One ``cookie`` header per request, as HTTP/2 requires of the server (RFC 9113 §8.2.3).

Over HTTP/2 a browser may split its cookies into several ``cookie`` fields (Chromium
sends one per cookie). The server must join them with ``"; "`` before handing them to an
application; granian passes them on as they came (granian issue #539), and Django's ASGI
request then joins repeated headers with ``","``, which no cookie parser splits: the login
cookie is lost and every page asks to log in again. :class:`JoinCookieHeaders` does the
join in front of the whole application (stream route and Django alike).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from asgiref.sync import markcoroutinefunction

__all__ = ["JoinCookieHeaders"]


class JoinCookieHeaders:
    """ASGI middleware: several ``cookie`` headers of an HTTP request become one.

    Args:
        app: the ASGI application to call.

    A request with at most one ``cookie`` header (every HTTP/1.1 request) is passed on
    untouched; the others get a copy of their scope with one ``cookie`` header, in the
    place of the first, its value the parts joined by ``"; "``. Never raises of its own.

    ``__call__`` returns the application's awaitable (no coroutine frame of its own held
    for a stream's lifetime: memory per idle stream, issue 23); it is marked a coroutine
    function, so servers and asgiref take it for an ASGI 3 application.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    @markcoroutinefunction
    def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Coroutine[Any, Any, None]:
        if scope["type"] == "http":
            headers = scope.get("headers") or ()
            if sum(1 for name, _ in headers if name == b"cookie") > 1:
                scope = {**scope, "headers": _joined(headers)}
        return self.app(scope, receive, send)  # type: ignore[no-any-return]


def _joined(headers: Any) -> list[tuple[bytes, bytes]]:
    parts = [value.strip().rstrip(b";").strip() for name, value in headers if name == b"cookie"]
    out: list[tuple[bytes, bytes]] = []
    for name, value in headers:
        if name != b"cookie":
            out.append((name, value))
        elif parts:
            out.append((b"cookie", b"; ".join(part for part in parts if part)))
            parts = []
    return out
