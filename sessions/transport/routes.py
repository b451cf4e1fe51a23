"""Which ASGI application serves a request, by scope type and by path, without copying its
scope or holding a frame while the response streams.

Channels' ``URLRouter`` hands each route a copy of the scope with ``path_remaining`` and
``url_route`` added, and awaits it in a coroutine of its own: both stay alive for as long
as the response streams, about 1.4 KiB of every idle event stream (issue 23,
docs/benchmarks.md). :class:`Routes` matches with Django's own route patterns
(``django.urls.path``), adds ``url_route`` to the request's scope in place (the key
Channels' routes read: ``{"args": …, "kwargs": …}``), and returns the route's
awaitable. The WebSocket side keeps ``URLRouter`` (one connection per page, not per
event stream). :class:`ScopeTypes` does what Channels' ``ProtocolTypeRouter`` does (one
application per scope type) but returns the application's awaitable instead of awaiting
it in a coroutine of its own (248 bytes of every idle event stream).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from asgiref.sync import markcoroutinefunction
from django.urls import URLPattern

__all__ = ["Routes", "ScopeTypes"]

Application = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class Routes:
    """ASGI dispatch of HTTP requests by path.

    Args:
        routes: ``django.urls.path(...)`` entries whose view is an ASGI application; the
            first whose pattern matches the whole path (after ``root_path``, without the
            leading ``/``) serves the request, with the captured values in
            ``scope["url_route"]["kwargs"]`` (converted by the pattern's converters).
        fallback: the application for every other request (Django).

    ``__call__`` returns the chosen application's awaitable (no frame of its own held
    while a response streams); it is marked a coroutine function. Never raises of its own.
    """

    def __init__(self, routes: Sequence[URLPattern], fallback: Application) -> None:
        self.routes = tuple(routes)
        self.fallback = fallback

    @markcoroutinefunction
    def __call__(self, scope: Any, receive: Any, send: Any) -> Awaitable[None]:
        # (scope: an HTTP scope, a dict; typed Any as the servers' and asgiref's types differ)
        path: str = scope.get("path", "")
        root_path: str = scope.get("root_path", "")
        if root_path and path.startswith(root_path):
            path = path[len(root_path) :]
        path = path.lstrip("/")
        for route in self.routes:
            match = route.pattern.match(path)
            if match is not None:
                _, args, kwargs = match
                scope["url_route"] = {"args": args, "kwargs": kwargs}
                application: Application = route.callback
                return application(scope, receive, send)
        return self.fallback(scope, receive, send)


class ScopeTypes:
    """ASGI dispatch by ``scope["type"]`` (``http``, ``websocket``, ``lifespan``).

    Args:
        applications: the application of each scope type served.

    ``__call__`` returns the application's awaitable (marked a coroutine function, like
    :class:`Routes`). Raises ValueError for a scope type without an application, as
    Channels' ``ProtocolTypeRouter`` does.
    """

    def __init__(self, applications: dict[str, Any]) -> None:
        # (Any: the servers', asgiref's and Channels' application types differ)
        self.applications: dict[str, Application] = dict(applications)

    @markcoroutinefunction
    def __call__(self, scope: Any, receive: Any, send: Any) -> Awaitable[None]:
        application = self.applications.get(scope["type"])
        if application is None:
            raise ValueError(f"no application for scope type {scope['type']!r}")
        return application(scope, receive, send)
