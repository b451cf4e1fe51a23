"""System checks: bad settings stop start-up with a clear message (docs/protocol.md, limits).

``qwenweb.E001``: a ``QWENWEB`` value of the wrong type or out of range, or a ``BACKEND``
that cannot be imported. ``qwenweb.W002`` (``check --deploy``): the backend's own deploy
problems (the Redis backend: Redis does not answer).
"""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, Warning, register

from sessions.conf import config_errors, get_config

_HINT = "Fix the value in settings.QWENWEB or the environment."


@register()
def check_qwenweb_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Report every invalid ``QWENWEB`` setting, and an unloadable backend, as ``E001``."""
    errors: list[CheckMessage] = [
        Error(message, hint=_HINT, id="qwenweb.E001") for message in config_errors()
    ]
    if errors:
        return errors
    from sessions.backends import resolve_backend

    name = get_config().backend
    try:
        resolve_backend(name)
    except (ImportError, TypeError) as exc:
        errors.append(
            Error(
                f"QWENWEB['BACKEND'] = {name!r} cannot be used: {exc}",
                hint=_HINT,
                id="qwenweb.E001",
            )
        )
    return errors


@register(deploy=True)
def check_backend_deploy(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``manage.py check --deploy``: the backend's deploy problems, as ``qwenweb.W002``.

    Warnings, not errors: the servers start anyway (a shared store that does not answer
    means 503 until it does).
    """
    if config_errors():
        return []
    from sessions.backends import resolve_backend

    config = get_config()
    try:
        backend_class = resolve_backend(config.backend)
    except (ImportError, TypeError):
        return []  # reported by check_qwenweb_settings
    return [
        Warning(problem, hint=hint, id="qwenweb.W002")
        for problem, hint in backend_class.deploy_problems(config)
    ]
