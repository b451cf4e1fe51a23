"""``sessions.transport.routes``: ``Routes`` (HTTP dispatch by Django route patterns, in place)
and ``ScopeTypes`` (dispatch by scope type)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.urls import path

from sessions.transport.routes import Routes, ScopeTypes

Calls = list[tuple[str, dict[str, Any]]]


def _app(name: str, calls: Calls) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        calls.append((name, scope))

    return app


def _routes(calls: Calls) -> Routes:
    return Routes(
        [path("session/<str:session_id>/events", _app("stream", calls))],
        fallback=_app("django", calls),
    )


def _call(routes: Routes, scope: dict[str, Any]) -> None:
    asyncio.run(routes(scope, None, None))  # type: ignore[arg-type]


def test_a_matching_path_reaches_its_route_with_the_captured_values_in_the_same_scope() -> None:
    calls: Calls = []
    scope: dict[str, Any] = {"type": "http", "path": "/session/s-1/events"}
    _call(_routes(calls), scope)
    assert calls == [("stream", scope)]
    assert calls[0][1] is scope  # no copy: nothing more held per stream
    assert scope["url_route"] == {"args": (), "kwargs": {"session_id": "s-1"}}


def test_every_other_path_goes_to_the_fallback_untouched() -> None:
    for other in ("/session/s-1/events/more", "/session/s-1", "/sessions/s-1/events", "/"):
        calls: Calls = []
        scope: dict[str, Any] = {"type": "http", "path": other}
        _call(_routes(calls), scope)
        assert [name for name, _ in calls] == ["django"], other
        assert "url_route" not in scope


def test_root_path_is_taken_off_before_matching() -> None:
    calls: Calls = []
    scope: dict[str, Any] = {"type": "http", "path": "/app/session/x/events", "root_path": "/app"}
    _call(_routes(calls), scope)
    assert [name for name, _ in calls] == ["stream"]
    assert scope["url_route"]["kwargs"] == {"session_id": "x"}


def test_it_is_taken_for_an_asgi3_application() -> None:
    from asgiref.compatibility import is_double_callable

    assert not is_double_callable(_routes([]))
    assert asyncio.iscoroutinefunction(_routes([]).__call__)


def test_scope_types_hand_each_type_to_its_application_without_a_frame_of_their_own() -> None:
    calls: Calls = []
    router = ScopeTypes({"http": _app("http", calls), "lifespan": _app("lifespan", calls)})
    assert asyncio.iscoroutinefunction(router.__call__)  # (servers that check get ASGI 3)
    for kind in ("http", "lifespan"):
        scope: dict[str, Any] = {"type": kind}
        awaitable = router(scope, None, None)
        assert awaitable.cr_code.co_name == "app"  # type: ignore[attr-defined]  # the app's own
        asyncio.run(awaitable)  # type: ignore[arg-type]
        assert calls[-1] == (kind, scope)


def test_scope_types_refuse_a_type_without_an_application() -> None:
    router = ScopeTypes({"http": _app("http", [])})
    with pytest.raises(ValueError, match="'websocket'"):
        router({"type": "websocket"}, None, None)
