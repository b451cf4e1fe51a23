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

from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt

from sessions.backends.base import BackendUnavailableError
from sessions.conf import get_config
from sessions.cors import cors_headers, is_preflight
from sessions.errors import ApiError, backend_unavailable, error_headers
from sessions.hooks import hooks
from sessions.wire import sanitize_for_log

__all__ = ["api_error_response", "api_view", "enforce_csrf", "error_response"]

logger = logging.getLogger("qwenweb.api")


def api_error_response(error: ApiError) -> JsonResponse:
    """Return ``error`` as a JSON response with its status and headers, and count it
    (:meth:`Hooks.request_rejected`: ``qwenweb_rejected_requests_total``): every JSON error
    answer of a Django view is built here, so each is counted once."""
    hooks.request_rejected(error.status, error.code)
    response = JsonResponse(error.payload(), status=error.status)
    for name, value in error_headers(error.status, error.retry_after_s):
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


_View = Callable[..., Coroutine[Any, Any, HttpResponseBase]]


def api_view(*methods: str, served_elsewhere: tuple[str, ...] = ()) -> Callable[[_View], _View]:
    """Make an async view a JSON API endpoint accepting ``methods``.

    Other methods get a JSON 405 with ``Allow`` (``methods`` plus ``served_elsewhere``: the
    methods of the same URL that another application answers, e.g. the stream's ``GET``);
    an ``ApiError`` raised inside becomes its JSON error and one log line; a database
    failure, or the event store out of reach, becomes a JSON 503 (never a 500 page).
    CSRF is checked by the views for login-session callers only (bearer tokens are not
    ambient credentials), so Django's middleware is told to skip these views. CORS
    (:mod:`sessions.cors`): a preflight is answered here (204), and every answer to an
    allowed origin carries the CORS headers.
    """

    def decorate(view: _View) -> _View:
        @csrf_exempt
        @functools.wraps(view)
        async def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            method = request.method or ""
            preflight = is_preflight(method, request.headers.get("Access-Control-Request-Method"))
            response = (
                HttpResponse(status=204) if preflight else await answer(request, *args, **kwargs)
            )
            allowed = (*served_elsewhere, *methods, "OPTIONS")
            for name, value in cors_headers(
                request.headers.get("Origin"),
                _own_origin(request),
                get_config().cors_allowed_origins,
                path=sanitize_for_log(request.path, 120),
                preflight_methods=allowed if preflight else None,
            ):
                if name == "Vary" and response.has_header("Vary"):
                    value = f"{response['Vary']}, {value}"
                response[name] = value
            return response

        async def answer(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            if request.method not in methods:
                allowed = (*served_elsewhere, *methods)
                response = error_response(
                    405, "method_not_allowed", f"use {' or '.join(allowed)} here"
                )
                logger.warning(
                    "api_rejected method=%s path=%s status=405 code=method_not_allowed",
                    sanitize_for_log(request.method, 16),
                    sanitize_for_log(request.path, 120),
                )
                response["Allow"] = ", ".join(allowed)
                return response
            try:
                return await view(request, *args, **kwargs)
            except ApiError as exc:
                return _fail(request, exc)
            except RequestDataTooBig:  # a form body read by the CSRF check, beyond Django's cap
                return _fail(
                    request, ApiError(413, "body_too_large", "the request body is too large")
                )
            except TooManyFieldsSent:
                return _fail(
                    request, ApiError(400, "invalid_request", "the form has too many fields")
                )
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


def _own_origin(request: HttpRequest) -> str:
    """``scheme://host`` of the request as it reached the server ("" if the host is bad)."""
    try:
        return f"{request.scheme}://{request.get_host()}"
    except Exception:  # DisallowedHost: the view answers its own 400
        return ""
