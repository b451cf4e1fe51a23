"""``GET /healthz``, ``GET /readyz`` and ``GET /metrics``: raw ASGI, in front of Django.

Routed by ``qwenweb.asgi`` before Django's ``ALLOWED_HOSTS`` check, because probes and
scrapers address the process by IP (``Host: 10.0.3.7:8000``); nothing else is answered
here, so the Host check of every other URL is unchanged (docs/operators.md).

- ``/healthz``: 200 ``{"status": "ok"}`` while the process answers at all.
- ``/readyz``: 200 ``{"status": "ready", "checks": {...}}`` when the database answers
  and the backend is healthy (under Redis: Redis answers, with Sentinels as the current
  primary, and this process's reader is attached); 503 ``not_ready`` naming what
  failed, and 503 ``draining`` once the graceful drain started
  (:mod:`sessions.ops.lifecycle`). Each check is bounded by :data:`CHECK_TIMEOUT_S`.
- ``/metrics``: the Prometheus text of :func:`sessions.ops.metrics.render`, for a
  request with ``Authorization: Bearer <METRICS_TOKEN>`` or from an address in
  ``METRICS_ALLOWED_NETS`` carrying no forwarding header (behind a proxy every request
  comes from the proxy's address); 401 for a wrong token, 403 otherwise, 404 when
  ``METRICS`` is off. Errors are the JSON envelope of :mod:`sessions.errors`, one log
  line each.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

import orjson
from asgiref.sync import markcoroutinefunction
from asgiref.typing import ASGIReceiveCallable as Receive
from asgiref.typing import ASGISendCallable as Send
from asgiref.typing import HTTPScope as Scope
from channels.db import database_sync_to_async
from django.db import connection

from sessions.backends import get_backend
from sessions.conf import get_config
from sessions.errors import ApiError, error_headers
from sessions.hooks import hooks
from sessions.process_state import process_state

__all__ = ["CHECK_TIMEOUT_S", "FORWARDING_HEADERS", "ProbeApplication"]

logger = logging.getLogger("qwenweb.probes")


CHECK_TIMEOUT_S: Final = 3.0
"""Upper bound of each readiness check (database, backend), seconds."""

FORWARDING_HEADERS: Final = (
    b"forwarded",  # RFC 7239
    b"x-forwarded-for",
    b"x-forwarded-host",
    b"x-forwarded-proto",
    b"x-real-ip",  # nginx
    b"via",  # RFC 9110, section 7.6.3: any HTTP proxy
    b"cf-connecting-ip",  # Cloudflare
    b"true-client-ip",  # Akamai, Cloudflare Enterprise
    b"fastly-client-ip",
    b"x-client-ip",
    b"x-cluster-client-ip",
)
"""Headers that say a proxy relayed the request: its address is then not the client's.
(A proxy on an allowed address that adds none of them, e.g. nginx's ``proxy_pass`` with
no ``proxy_set_header``, cannot be told apart: docs/operators.md says to use the token.)"""


def _db_answers() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


class ProbeApplication:
    """The ASGI application of the three operator URLs (module docstring).

    Args:
        fallback: where a path other than the three goes (Django), e.g. when mounted
            more widely than needed.
    """

    def __init__(self, fallback: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.fallback = fallback

    @markcoroutinefunction
    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """Answer a probe, or return ``fallback``'s awaitable for any other request (no
        frame of this one held while a stream lasts: memory per idle stream, issue 23)."""
        path = scope.get("path", "")
        if scope["type"] != "http" or path not in ("/healthz", "/readyz", "/metrics"):
            return self.fallback(scope, receive, send)
        return self._probe(scope, send, path)

    async def _probe(self, scope: Scope, send: Send, path: str) -> None:
        try:
            if scope["method"] not in ("GET", "HEAD"):
                raise ApiError(405, "method_not_allowed", f"{path} answers GET and HEAD")
            if path == "/healthz":
                await _answer(send, scope, 200, orjson.dumps({"status": "ok"}))
            elif path == "/readyz":
                await _answer(send, scope, 200, await _ready())
            else:
                body, content_type = await _metrics(scope)
                await _answer(send, scope, 200, body, content_type.encode())
        except ApiError as error:
            logger.warning(
                "probe_rejected path=%s status=%d code=%s error=%s client=%s",
                path,
                error.status,
                error.code,
                error.message,
                (scope.get("client") or ["-"])[0],
            )
            hooks.request_rejected(error.status, error.code)
            headers = error_headers(error.status)
            if error.status == 405:
                headers.append((b"allow", b"GET, HEAD"))
            await _send(send, scope, error.status, headers, error.body())


async def _ready() -> bytes:
    """The readiness body; raises the 503 ``ApiError`` naming what failed."""
    if process_state.draining:
        raise ApiError(503, "draining", "the server is draining: it takes no new streams")
    checks: dict[str, str] = {}
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            await database_sync_to_async(_db_answers)()
        checks["database"] = "ok"
    except Exception as exc:  # any failure means "not ready", and says which
        checks["database"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    backend = get_backend()
    try:
        async with asyncio.timeout(CHECK_TIMEOUT_S):
            health = await backend.health()
        checks["backend"] = "ok" if health.ok else "; ".join(health.problems)[:300]
    except TimeoutError:
        checks["backend"] = f"{backend.name}: no answer within {CHECK_TIMEOUT_S:g} s"
    failed = sorted(name for name, outcome in checks.items() if outcome != "ok")
    if failed:
        raise ApiError(503, "not_ready", f"not ready: {', '.join(failed)}", checks=checks)
    return orjson.dumps({"status": "ready", "checks": checks})


async def _metrics(scope: Scope) -> tuple[bytes, str]:
    """The exposition for an allowed request; raises 404, 401 or 403 ``ApiError``."""
    from sessions.ops.metrics import render  # only imported where metrics are served

    config = get_config()
    if not config.metrics:
        raise ApiError(404, "not_found", "metrics are off (QWENWEB_METRICS=0)")
    headers = {bytes(name).lower(): bytes(value) for name, value in scope.get("headers", ())}
    authorization = headers.get(b"authorization", b"").decode("latin-1")
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if (
            scheme.lower() != "bearer"
            or not config.metrics_token
            or not hmac.compare_digest(token.strip().encode(), config.metrics_token.encode())
        ):
            raise ApiError(401, "invalid_token", "the metrics token is wrong")
    elif not _address_allowed(scope, headers, config.metrics_allowed_nets):
        raise ApiError(
            403,
            "forbidden",
            "metrics need METRICS_TOKEN as a bearer token or a client address in "
            "METRICS_ALLOWED_NETS (never trusted through a proxy's forwarding headers)",
        )
    return render()


def _address_allowed(scope: Scope, headers: dict[bytes, bytes], nets: tuple[Any, ...]) -> bool:
    if any(name in headers for name in FORWARDING_HEADERS):
        return False
    host = str((scope.get("client") or [""])[0] or "")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in net for net in nets if net.version == address.version)


async def _answer(
    send: Send, scope: Scope, status: int, body: bytes, content_type: bytes = b"application/json"
) -> None:
    headers = [(b"content-type", content_type), (b"cache-control", b"no-store")]
    await _send(send, scope, status, headers, body)


async def _send(
    send: Send, scope: Scope, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send(
        {"type": "http.response.start", "trailers": False, "status": status, "headers": headers}
    )
    await send(
        {
            "type": "http.response.body",
            "body": b"" if scope["method"] == "HEAD" else body,
            "more_body": False,
        }
    )
