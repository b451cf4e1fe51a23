"""Cross-origin requests (CORS) for the bearer-token API and the stream: one policy.

Setting ``CORS_ALLOWED_ORIGINS`` (default empty: same origin only). A request from an
allowed origin gets ``Access-Control-Allow-Origin: <its origin>`` (never ``*``, never
``Allow-Credentials``: these endpoints take bearer tokens, not cookies, across origins),
``Vary: Origin`` and the exposed response headers; a preflight (``OPTIONS`` with
``Access-Control-Request-Method``) is answered 204 with the allowed methods and request
headers and a max-age. A request from any other origin is served as it would be without
CORS (a server cannot tell a browser from another client) but gets no CORS header, so
the browser withholds the answer from the page, and one log line. A same-origin request
(its ``Origin`` is the server's own) needs nothing and gets nothing.

Why our own and not django-cors-headers: that package is a Django middleware, and the
stream (``GET /session/<id>/events``) is a plain ASGI route in front of Django (EB-22)
that no Django middleware sees; wrapping it would mean a second implementation of the
same policy, able to disagree with the first, and no log line for a refused origin.
This module is that policy once, used by the stream route
(:mod:`sessions.transport.stream`) and by the API views (:mod:`sessions.web.responses`).
It imports nothing from Django.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Final

__all__ = [
    "ALLOWED_REQUEST_HEADERS",
    "EXPOSED_HEADERS",
    "PREFLIGHT_MAX_AGE_S",
    "cors_headers",
    "is_preflight",
]

logger = logging.getLogger("qwenweb.cors")

ALLOWED_REQUEST_HEADERS: Final = (
    "Authorization",
    "Content-Type",
    "Last-Event-ID",
    "X-Event-Epoch",
    "Idempotency-Key",
    "X-Client-Id",
)
"""Request headers a cross-origin page may send (the preflight's answer)."""

EXPOSED_HEADERS: Final = ("X-Event-Epoch", "Idempotent-Replayed", "Retry-After", "WWW-Authenticate")
"""Response headers a cross-origin page may read."""

PREFLIGHT_MAX_AGE_S: Final = 600
"""How long a browser may cache a preflight's answer (seconds)."""


def is_preflight(method: str, access_control_request_method: str | None) -> bool:
    """Whether a request is a CORS preflight: ``OPTIONS`` naming the method it asks for."""
    return method == "OPTIONS" and bool(access_control_request_method)


def cors_headers(
    origin: str | None,
    own_origin: str,
    allowed_origins: Iterable[str],
    *,
    path: str,
    preflight_methods: Iterable[str] | None = None,
) -> list[tuple[str, str]]:
    """Return the CORS headers of the answer to a request from ``origin``.

    ``own_origin``: the server's origin as this request reached it (``scheme://host``);
    ``preflight_methods``: for a preflight, the methods the path takes (None: an actual
    request). Empty for no ``Origin``, the own origin, or an origin not allowed (which is
    logged once, with ``path``). Never raises.
    """
    if not origin or origin == own_origin:
        return []
    allowed = tuple(allowed_origins)
    if origin not in allowed:
        logger.warning(
            "cors_refused origin=%r path=%s allowed=%d", origin[:200], path[:120], len(allowed)
        )
        return [("Vary", "Origin")] if allowed else []
    headers = [("Access-Control-Allow-Origin", origin), ("Vary", "Origin")]
    if preflight_methods is None:
        headers.append(("Access-Control-Expose-Headers", ", ".join(EXPOSED_HEADERS)))
    else:
        headers += [
            ("Access-Control-Allow-Methods", ", ".join(preflight_methods)),
            ("Access-Control-Allow-Headers", ", ".join(ALLOWED_REQUEST_HEADERS)),
            ("Access-Control-Max-Age", str(PREFLIGHT_MAX_AGE_S)),
        ]
    return headers
