"""JSON answers of the Django views: the error envelope and the ``api_view`` decorator.

Every error is the one envelope of :mod:`sessions.errors` (``{"error", "code", ...}``)
with one log line on ``qwenweb.api``; a database failure or an event store out of reach
is a JSON 503 with ``Retry-After``, never a 500 page.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

from sessions.backends.base import BackendUnavailableError
from sessions.errors import ApiError, backend_unavailable, error_headers
from sessions.wire import sanitize_for_log

__all__ = ["api_error_response", "api_view", "enforce_csrf", "error_response"]

logger = logging.getLogger("qwenweb.api")


def api_error_response(error: ApiError) -> JsonResponse:
    """Return ``error`` as a JSON response with its status and headers."""
    response = JsonResponse(error.payload(), status=error.status)
    for name, value in error_headers(error.status):
        if name != b"content-type":
            response[name.decode()] = value.decode()
    return response


def error_response(status: int, code: str, message: str, **extra: Any) -> JsonResponse:
    """Return ``{"error": message, "code": code, **extra}`` with ``status`` (and its headers)."""
    return api_error_response(ApiError(status, code, message, **extra))


def _fail(request: HttpRequest, exc: ApiError) -> JsonResponse:
    logger.warning(
        "api_rejected method=%s path=%s status=%d code=%s error=%s%s",
        request.method,
        sanitize_for_log(request.path, 120),
        exc.status,
        exc.code,
        sanitize_for_log(exc.message, 200),
        exc.log_extra,
    )
    return api_error_response(exc)


class _CsrfCheck(CsrfViewMiddleware):
    def _reject(self, request: HttpRequest, reason: str) -> HttpResponse:
        raise ApiError(403, "csrf_failed", f"CSRF check failed: {reason}")


def enforce_csrf(request: HttpRequest) -> None:
    """Run Django's CSRF check on ``request``; raise a 403 ``ApiError`` if it fails."""
    check = _CsrfCheck(lambda r: HttpResponse())
    check.process_request(request)
    check.process_view(request, lambda r: HttpResponse(), (), {})


_View = Callable[..., Coroutine[Any, Any, HttpResponse]]


def api_view(*methods: str, served_elsewhere: tuple[str, ...] = ()) -> Callable[[_View], _View]:
    """Make an async view a JSON API endpoint accepting ``methods``.

    Other methods get a JSON 405 with ``Allow`` (``methods`` plus ``served_elsewhere``: the
    methods of the same URL that another application answers, e.g. the stream's ``GET``);
    an ``ApiError`` raised inside becomes its JSON error and one log line; a database
    failure, or the event store out of reach, becomes a JSON 503 (never a 500 page).
    CSRF is checked by the views for login-session callers only (bearer tokens are not
    ambient credentials), so Django's middleware is told to skip these views.
    """

    def decorate(view: _View) -> _View:
        @csrf_exempt
        @functools.wraps(view)
        async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in methods:
                allowed = (*served_elsewhere, *methods)
                response = error_response(
                    405, "method_not_allowed", f"use {' or '.join(allowed)} here"
                )
                response["Allow"] = ", ".join(allowed)
                return response
            try:
                return await view(request, *args, **kwargs)
            except ApiError as exc:
                return _fail(request, exc)
            except DatabaseError as exc:
                logger.error(
                    "database_unavailable method=%s path=%s error=%s",
                    request.method,
                    sanitize_for_log(request.path, 120),
                    sanitize_for_log(str(exc), 200),
                )
                return error_response(503, "unavailable", "the database is busy; try again")
            except BackendUnavailableError as exc:
                logger.error(
                    "backend_unavailable method=%s path=%s error=%s",
                    request.method,
                    sanitize_for_log(request.path, 120),
                    sanitize_for_log(str(exc), 200),
                )
                return api_error_response(backend_unavailable(exc))

        return wrapper

    return decorate
