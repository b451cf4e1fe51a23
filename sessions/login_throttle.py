"""Login throttling: repeated failed logins lock a username and an address out (issue 26).

With Django's own means, no extra package: :class:`ThrottledModelBackend`, first in
``AUTHENTICATION_BACKENDS``, refuses (``PermissionDenied``, which ends Django's
``authenticate()``) while the username has ``LOGIN_MAX_FAILURES`` failed logins within
``LOGIN_LOCKOUT_S``, or the client address ten times that (many users may share one
address), even with the right password; otherwise it
steps aside for the ``ModelBackend`` after it. :func:`count_failure`, connected to
``user_login_failed``, counts the failures in Django's cache; a successful login clears
its username's count. It covers every login form (``/accounts/login/``, the admin's).

The counts live in Django's default cache: per process with the local-memory cache (N
processes allow N times the failures), server-wide with a shared cache.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from django.contrib.auth.backends import ModelBackend
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest

from sessions.conf import get_config
from sessions.wire import sanitize_for_log

__all__ = ["ThrottledModelBackend", "clear_failures", "count_failure"]

logger = logging.getLogger("qwenweb.auth")

ADDRESS_FACTOR: Final = 10
"""An address is locked out after this many times ``LOGIN_MAX_FAILURES`` (a username
after ``LOGIN_MAX_FAILURES``): users behind one NAT or proxy share it."""
_USER_KEY: Final = "qwenweb:login:u:"


def _keys(request: HttpRequest | None, username: str | None) -> list[str]:
    keys = []
    if username:
        keys.append(f"{_USER_KEY}{username.casefold()[:150]}")
    address = request.META.get("REMOTE_ADDR") if request is not None else None
    if address:
        keys.append(f"qwenweb:login:a:{address}")
    return keys


class ThrottledModelBackend(ModelBackend):
    """Django's ``ModelBackend`` behind a lockout check (the module docstring)."""

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Raise ``PermissionDenied`` while the username or the address is locked out;
        return None otherwise (the next backend checks the password)."""
        limit = get_config().login_max_failures
        counts = cache.get_many(_keys(request, username))
        if any(
            count >= (limit if key.startswith(_USER_KEY) else limit * ADDRESS_FACTOR)
            for key, count in counts.items()
        ):
            logger.warning(
                "login_throttled username=%s address=%s",
                sanitize_for_log(username or "", 60),
                request.META.get("REMOTE_ADDR") if request is not None else "",
            )
            raise PermissionDenied("too many failed logins; try again later")
        return None


def count_failure(sender: Any, credentials: dict[str, Any], request: Any = None, **_: Any) -> None:
    """``user_login_failed``: count one failure for the username and the address (each
    count expires ``LOGIN_LOCKOUT_S`` after its first failure)."""
    lockout_s = get_config().login_lockout_s
    for key in _keys(request, credentials.get("username")):
        if cache.add(key, 1, timeout=lockout_s):
            continue
        try:
            cache.incr(key)
        except ValueError:  # expired in between
            cache.add(key, 1, timeout=lockout_s)


def clear_failures(sender: Any, request: Any, user: Any, **_: Any) -> None:
    """``user_logged_in``: forget the username's failures."""
    cache.delete_many(_keys(None, user.get_username()))
