"""System checks: bad event bus settings stop start-up with a clear message (section 6)."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, register

from sessions.conf import config_errors


@register()
def check_qwenweb_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Report every invalid ``QWENWEB`` setting as ``qwenweb.E001``."""
    return [
        Error(
            message, hint="Fix the value in settings.QWENWEB or the environment.", id="qwenweb.E001"
        )
        for message in config_errors()
    ]
