"""Django settings for qwenweb: project wiring only.

Every value a deployment changes comes from the environment, with embedded defaults for the
demo (SQLite, in-memory bus, DEBUG on):

| variable | default | meaning |
| --- | --- | --- |
| ``DJANGO_SECRET_KEY`` | a fixed demo key (DEBUG only) | signs tokens and sessions |
| ``DJANGO_DEBUG`` | ``1`` | ``0`` for production |
| ``DJANGO_ALLOWED_HOSTS`` | ``localhost,127.0.0.1,[::1]`` | comma-separated |
| ``DATABASE_URL`` | ``sqlite:///<repo>/db.sqlite3`` | or ``postgres://user@host:5432/db`` |
| ``DATABASE_CONN_MAX_AGE`` | ``0`` | seconds a connection is kept (``DATABASE_URL`` only) |
| ``LOG_FORMAT`` | ``text`` | ``json``: one JSON object per operator log line |
| ``PROMETHEUS_MULTIPROC_DIR`` | unset | several worker processes: where their metrics meet |
| ``DJANGO_STATIC_ROOT`` | ``<repo>/var/static`` | where ``collectstatic`` puts the static files |
| ``QWENWEB_RING_SIZE`` etc. | see :data:`QWENWEB` | event bus settings (``sessions.conf``) |
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


DEBUG = _env_bool("DJANGO_DEBUG", True)
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set when DJANGO_DEBUG=0")
    SECRET_KEY = "qwenweb-demo-insecure-key-do-not-use-in-production"  # noqa: S105

ALLOWED_HOSTS = [
    host.strip()
    for host in os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")
    if host.strip()
]

INSTALLED_APPS = [
    # Before daphne, so its `runserver` (with --event-ring-size) wins over daphne's.
    "sessions.apps.SessionsConfig",
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_eventstream",
]

# Failed logins lock a username and an address out for a while (sessions.login_throttle).
AUTHENTICATION_BACKENDS = [
    "sessions.login_throttle.ThrottledModelBackend",
    "django.contrib.auth.backends.ModelBackend",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "qwenweb.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

ASGI_APPLICATION = "qwenweb.asgi.application"
WSGI_APPLICATION = None


def _conn_max_age_s() -> int:
    """``DATABASE_CONN_MAX_AGE`` in seconds; 0 (a connection per request) when unset.

    Keep it 0 under ASGI (Django's advice): each request runs its queries in a thread that
    ends with the request, so a kept connection would only be dropped there, unclosed.
    """
    raw = os.environ.get("DATABASE_CONN_MAX_AGE", "0").strip()
    if not raw.isdecimal():
        raise ImproperlyConfigured(f"DATABASE_CONN_MAX_AGE must be seconds >= 0, got {raw!r}")
    return int(raw)


# DATABASE_URL selects the database, e.g. postgres://postgres@127.0.0.1:5432/qwenweb;
# without it, SQLite in the repository (the demo).
if _database_url := os.environ.get("DATABASE_URL", "").strip():
    DATABASES = {
        "default": dj_database_url.parse(
            _database_url, conn_max_age=_conn_max_age_s(), conn_health_checks=True
        )
    }
else:
    DATABASES = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": str(BASE_DIR / "db.sqlite3")}
    }
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Requests write from several threads at once (database_sync_to_async): take the write
    # lock when a transaction starts and wait for it, instead of failing "database is
    # locked" when a read transaction tries to upgrade.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"transaction_mode": "IMMEDIATE", "timeout": 20}
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
# Times to the second in one format, pages and admin alike (qwenweb/formats/en/formats.py).
FORMAT_MODULE_PATH = ["qwenweb.formats"]

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(os.environ.get("DJANGO_STATIC_ROOT", "") or BASE_DIR / "var" / "static")
# Production (DEBUG off): `collectstatic` gives every file a hashed name, so the server can
# let browsers cache them for a year (python -m qwenweb.serve serves STATIC_ROOT). With
# DEBUG on, Django serves /static/ from the app folders: nothing to collect (the tests).
if not DEBUG:
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "qwenweb.storage.HashedStaticFilesStorage"},
    }

# Owners log in at /accounts/login/ (staff can use the admin's login too).
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "session-list"
LOGOUT_REDIRECT_URL = "login"

# The event bus and its route (docs/protocol.md, "Errors and limits"). Read through
# `sessions.conf.get_config()`; each key can be overridden by the environment variable
# named in `sessions.conf.ENV_OVERRIDES`.
# The event bus settings: every default is defined once, in sessions.conf (the bus's own
# limits from sessions.bus); override any of them here or with $QWENWEB_<NAME>.
QWENWEB: dict[str, object] = {}

# Request bodies are bounded by QWENWEB["PUBLISH_MAX_BODY_BYTES"] (at most 64 MiB), checked by
# the API with a 413 that names that limit; Django's own cap (2.5 MiB by default) must not
# refuse them first with a limit of its own.
DATA_UPLOAD_MAX_MEMORY_SIZE = 64 * 1024 * 1024 + 1

# The operator dashboard's live feed (sessions.ops.feed): one staff-only channel, no
# event storage (nothing is written to the database per dashboard event).
EVENTSTREAM_CHANNELMANAGER_CLASS = "sessions.ops.feed.OperatorChannelManager"

# LOG_FORMAT=json: one JSON object per operator line; otherwise key=value text with values
# quoted when they hold spaces or "=" (sessions.ops.logs). A bad Host header logs one
# short line (qwenweb.security disallowed_host), never Django's traceback.
LOG_FORMAT = os.environ.get("LOG_FORMAT", "text").strip().lower()
if LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT must be text or json, got {LOG_FORMAT!r}")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {
            "()": "sessions.ops.logs.KeyValueFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
        "json": {"()": "sessions.ops.logs.JsonFormatter"},
    },
    "filters": {
        "short_disallowed_host": {"()": "sessions.ops.logs.DisallowedHostFilter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "plain",
        },
        "disallowed_host": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "plain",
            "filters": ["short_disallowed_host"],
        },
    },
    "loggers": {
        "django.security.DisallowedHost": {
            "handlers": ["disallowed_host"],
            "level": "ERROR",
            "propagate": False,
        },
        "qwenweb": {
            "handlers": ["console"],
            "level": os.environ.get("QWENWEB_LOG_LEVEL", "INFO"),
            "propagate": False,
        },
        # runserver's access log; the demo sets WARNING so its output stays readable.
        "django.channels.server": {
            "level": os.environ.get("QWENWEB_ACCESS_LOG_LEVEL", "INFO"),
        },
    },
}

# The operator feed across processes: with the Redis backend, each process relays
# its dashboard activity to the others over the backend's own pub/sub control channel,
# under QWENWEB_REDIS_KEY_PREFIX (sessions.ops.feed). django-eventstream's relay,
# EVENTSTREAM_REDIS, is deliberately not set: it would deliver every item a second time,
# on a channel shared by every deployment on that Redis, with a listener that never comes
# back after an outage and a publish that blocks the event loop (docs/deployment.md).

# HTTPS deployments (docs/deployment.md): DJANGO_SECURE_COOKIES=1 sends the login session
# and CSRF cookies over HTTPS only (`manage.py check --deploy`, W012 and W016).
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = _env_bool("DJANGO_SECURE_COOKIES", False)
