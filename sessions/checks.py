"""System checks: bad event bus settings stop start-up with a clear message (section 6)."""

from __future__ import annotations

from typing import Any

from django.core.checks import CheckMessage, Error, Warning, register

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


@register(deploy=True)
def check_redis_reachable(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``manage.py check --deploy``: with the Redis backend, Redis must answer (``W002``).

    A warning, not an error: the servers start anyway and serve 503 until Redis answers.
    """
    from sessions.conf import get_config

    if config_errors():
        return []
    config = get_config()
    if config.backend != "redis":
        return []
    import redis

    client = redis.Redis.from_url(config.redis_url, socket_connect_timeout=1.0, socket_timeout=1.0)
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        return [
            Warning(
                f"BACKEND is 'redis' but Redis does not answer at the configured URL: "
                f"{type(exc).__name__}",
                hint="Start Redis or fix QWENWEB['REDIS_URL'] / $QWENWEB_REDIS_URL; until "
                "it answers, publish and new streams get 503.",
                id="qwenweb.W002",
            )
        ]
    finally:
        client.close()
    return []
