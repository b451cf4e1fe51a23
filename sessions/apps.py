"""The sessions app: live agent sessions streamed over SSE."""

from django.apps import AppConfig


class SessionsConfig(AppConfig):
    """App config; the explicit label avoids the clash with ``django.contrib.sessions``."""

    name = "sessions"
    label = "agent_sessions"
    verbose_name = "Agent sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from sessions import (
            checks,  # noqa: F401  (registers the system checks)
            dashboard,  # noqa: F401  (connects the session_opened signal)
        )
