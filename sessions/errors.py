"""The one JSON error envelope of every endpoint, the stream route's included.

``{"error": <what is wrong, in words>, "code": <machine code>, ...extra}`` with a 4xx or
5xx status; a 401 carries ``WWW-Authenticate: Bearer realm="qwenweb"``, a 503
``Retry-After`` (docs/protocol.md, "Errors and limits"). :class:`ApiError` is raised
where the problem is found; the stream route (raw ASGI) sends :func:`error_headers` and
:meth:`ApiError.body`, the Django views turn it into a response with
``sessions.web.responses``. This module imports nothing from Django.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

__all__ = [
    "BACKEND_UNAVAILABLE_MESSAGE",
    "RETRY_AFTER_S",
    "ApiError",
    "backend_unavailable",
    "error_headers",
    "quota_exceeded",
]

RETRY_AFTER_S: Final = 3
"""``Retry-After`` (seconds) of every 503: the event store or database is away."""

BACKEND_UNAVAILABLE_MESSAGE: Final = "the event store (Redis) is unavailable; try again shortly"


class ApiError(Exception):
    """Raised to answer ``status`` with the JSON error envelope.

    ``extra`` keys go into the body (e.g. ``field``, ``limit``); ``log_extra`` is
    appended to the operator's one log line (e.g. `` value='9999'``), never sent.
    """

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        log_extra: str = "",
        retry_after_s: int | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.extra = extra
        self.log_extra = log_extra
        #: ``Retry-After`` of the answer (a 429's); None: the status's default.
        self.retry_after_s = retry_after_s

    def payload(self) -> dict[str, Any]:
        """Return the body as a dict: ``{"error", "code", **extra}``."""
        return {"error": self.message, "code": self.code, **self.extra}

    def body(self) -> bytes:
        """Return the body as compact JSON bytes."""
        return orjson.dumps(self.payload())


def error_headers(status: int, retry_after_s: int | None = None) -> list[tuple[bytes, bytes]]:
    """Return the headers of an error answer with ``status`` (content type, no-store,
    the 401 challenge, ``Retry-After``: ``retry_after_s`` if given, else 3 on a 503)."""
    headers = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="qwenweb"'))
    if retry_after_s is None and status == 503:
        retry_after_s = RETRY_AFTER_S
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    return headers


def backend_unavailable(detail: object = "") -> ApiError:
    """The 503 for a request the event store cannot serve now (``backend_unavailable``).

    An error with its own ``code`` and ``public_message`` (``session_held_elsewhere``)
    answers those instead.
    """
    text = str(detail)[:200].replace("\n", " ")
    return ApiError(
        503,
        str(getattr(detail, "code", "backend_unavailable")),
        str(getattr(detail, "public_message", BACKEND_UNAVAILABLE_MESSAGE)),
        log_extra=f" detail={text!r}" if text else "",
    )


def quota_exceeded(error: Any) -> ApiError:
    """The 429 of a :class:`~sessions.backends.errors.QuotaExceededError`: code
    ``rate_limited`` (publish rates) or ``quota_exceeded``, naming the setting (``quota``)
    and its ``limit``, with ``Retry-After``."""
    code = "rate_limited" if error.quota.startswith("PUBLISH_") else "quota_exceeded"
    return ApiError(
        429,
        code,
        str(error),
        retry_after_s=error.retry_after_s,
        quota=error.quota,
        limit=int(error.limit) if float(error.limit).is_integer() else error.limit,
        retryAfterS=error.retry_after_s,
    )
