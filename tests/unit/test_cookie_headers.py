"""``sessions.transport.cookies.JoinCookieHeaders``: HTTP/2's split cookies become one header."""

from __future__ import annotations

from typing import Any

import pytest

from sessions.transport.cookies import JoinCookieHeaders

pytestmark = pytest.mark.asyncio


async def seen_headers(scope: dict[str, Any]) -> list[tuple[bytes, bytes]]:
    seen: list[Any] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope["headers"])

    await JoinCookieHeaders(app)(scope, None, None)
    return list(seen[0])


async def test_split_cookies_are_joined_with_semicolons_in_place_of_the_first() -> None:
    # What Chromium sends over HTTP/2: one field per cookie (RFC 9113 §8.2.3).
    headers = [
        (b"accept", b"*/*"),
        (b"cookie", b"csrftoken=abc"),
        (b"user-agent", b"x"),
        (b"cookie", b"sessionid=xyz;"),
    ]
    assert await seen_headers({"type": "http", "headers": headers}) == [
        (b"accept", b"*/*"),
        (b"cookie", b"csrftoken=abc; sessionid=xyz"),
        (b"user-agent", b"x"),
    ]


async def test_one_cookie_header_and_other_scopes_pass_untouched() -> None:
    headers = [(b"cookie", b"a=1; b=2"), (b"accept", b"*/*")]
    assert await seen_headers({"type": "http", "headers": headers}) == headers
    lifespan = [(b"cookie", b"a=1"), (b"cookie", b"b=2")]
    assert await seen_headers({"type": "lifespan", "headers": lifespan}) == lifespan
