"""The sessions app: live agent sessions streamed over SSE.

``ready()`` wires the operator side to what the inner layers announce: the records
writer, the dashboard feed, the lifecycle and the metrics listen to
:data:`sessions.hooks.hooks`, and the feed hears of new sessions through ``post_save``,
and deactivating or deleting a user revokes their tokens (:mod:`sessions.token_revocation`).
Nothing in the bus, wire format, backends, runtime or transport imports them.
"""

from django.apps import AppConfig


class SessionsConfig(AppConfig):
    """App config; the explicit label avoids the clash with ``django.contrib.sessions``."""

    name = "sessions"
    label = "agent_sessions"
    verbose_name = "Agent sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.exceptions import ImproperlyConfigured
        from django.db.models.signals import post_save

        from sessions import (
            checks,  # noqa: F401  (registers the system checks)
            token_revocation,
        )
        from sessions.conf import get_config
        from sessions.hooks import hooks
        from sessions.models import AgentSession
        from sessions.ops import dashboard, lifecycle
        from sessions.ops.feed import feed
        from sessions.ops.records import recorder

        hooks.connect(recorder)
        hooks.connect(feed)
        hooks.connect(lifecycle.listener)
        try:
            metrics_on = get_config().metrics
        except ImproperlyConfigured:
            metrics_on = True  # a bad setting: the system checks say which (qwenweb.E001)
        if metrics_on:  # QWENWEB_METRICS=0: nothing counted (bench A/B)
            from sessions.ops.metrics import metrics

            hooks.connect(metrics)
        post_save.connect(
            dashboard.session_saved, sender=AgentSession, dispatch_uid="qwenweb-dashboard-created"
        )
        token_revocation.connect_signals()
        from django.contrib.auth.signals import user_logged_in, user_login_failed

        from sessions import login_throttle

        user_login_failed.connect(login_throttle.count_failure, dispatch_uid="qwenweb-login")
        user_logged_in.connect(login_throttle.clear_failures, dispatch_uid="qwenweb-login")
