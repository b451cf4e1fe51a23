"""The event bus settings: one dict, ``settings.QWENWEB``, overridable from the environment.

Rules: docs/protocol.md, "Errors and limits". Every default is defined here, once (the bus's
own limits come from :mod:`sessions.bus`). :func:`get_config` returns a frozen
:class:`QwenwebConfig`; ``checks.py`` reports bad values at start-up (``manage.py check``,
``runserver``) with the allowed range, and :func:`get_config` raises
``ImproperlyConfigured`` with the same message if one slips through.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
from dataclasses import dataclass
from typing import Any, Final

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from sessions.bus import (
    DEFAULT_MAX_QUEUED_BYTES,
    DEFAULT_MAX_SUBSCRIBERS,
    DEFAULT_OVERFLOW_GRACE_S,
    DEFAULT_RING_MAX_BYTES,
    DEFAULT_RING_SIZE,
    MAX_EVENT_RING_SIZE,
    MAX_SAFE_INTEGER,
)

__all__ = [
    "ENV_OVERRIDES",
    "SNAPSHOT_MAX_LIMIT",
    "QwenwebConfig",
    "config_errors",
    "default_ring_bytes_total",
    "get_config",
]

_MIB: Final = 1024 * 1024


def default_ring_bytes_total() -> int:
    """``MAX_RING_BYTES_TOTAL``'s default: a quarter of physical RAM, in [256 MiB, 4 GiB].

    A quarter leaves room for the rest of the process (frames being written, subscriber
    queues, the encoder cache, Python's own heap and allocator slack: docs/capacity.md)
    and for other processes; the cap keeps a large host from letting one process's rings
    grow past what a restart can afford to lose. 1 GiB when the host does not say.
    """
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1024 * _MIB
    return max(256 * _MIB, min(4096 * _MIB, physical // 4))


#: settings key -> environment variable that overrides it.
ENV_OVERRIDES: Final = {
    "RING_SIZE": "QWENWEB_RING_SIZE",
    "MAX_SUBSCRIBERS": "QWENWEB_MAX_SUBSCRIBERS",
    "MAX_QUEUED_BYTES": "QWENWEB_MAX_QUEUED_BYTES",
    "OVERFLOW_GRACE_S": "QWENWEB_OVERFLOW_GRACE_S",
    "HEARTBEAT_INTERVAL_S": "QWENWEB_HEARTBEAT_INTERVAL_S",
    "WRITER_IDLE_TIMEOUT_S": "QWENWEB_WRITER_IDLE_TIMEOUT_S",
    "TCP_USER_TIMEOUT_S": "QWENWEB_TCP_USER_TIMEOUT_S",
    "EVICTED_LINGER_S": "QWENWEB_EVICTED_LINGER_S",
    "TOKEN_LIFETIME_S": "QWENWEB_TOKEN_LIFETIME_S",
    "PUBLISH_MAX_BODY_BYTES": "QWENWEB_PUBLISH_MAX_BODY_BYTES",
    "ID_RESERVATION_BLOCK": "QWENWEB_ID_RESERVATION_BLOCK",
    "BACKEND": "QWENWEB_BACKEND",
    "REDIS_URL": "QWENWEB_REDIS_URL",
    "REDIS_KEY_PREFIX": "QWENWEB_REDIS_KEY_PREFIX",
    "REDIS_SENTINELS": "QWENWEB_REDIS_SENTINELS",
    "REDIS_SENTINEL_SERVICE": "QWENWEB_REDIS_SENTINEL_SERVICE",
    "REDIS_SENTINEL_PASSWORD": "QWENWEB_REDIS_SENTINEL_PASSWORD",
    "REDIS_CLUSTER": "QWENWEB_REDIS_CLUSTER",
    "REDIS_WAIT_REPLICAS": "QWENWEB_REDIS_WAIT_REPLICAS",
    "REDIS_WAIT_TIMEOUT_MS": "QWENWEB_REDIS_WAIT_TIMEOUT_MS",
    "PROCESS_TTL_S": "QWENWEB_PROCESS_TTL_S",
    "RECORDS_FLUSH_INTERVAL_S": "QWENWEB_RECORDS_FLUSH_INTERVAL_S",
    "RECORDS_BATCH_SIZE": "QWENWEB_RECORDS_BATCH_SIZE",
    "RECORDS_RETENTION_DAYS": "QWENWEB_RECORDS_RETENTION_DAYS",
    "IDEMPOTENCY_TTL_S": "QWENWEB_IDEMPOTENCY_TTL_S",
    "IDEMPOTENCY_MAX_KEYS": "QWENWEB_IDEMPOTENCY_MAX_KEYS",
    "IDEMPOTENCY_MAX_KEYS_TOTAL": "QWENWEB_IDEMPOTENCY_MAX_KEYS_TOTAL",
    "CORS_ALLOWED_ORIGINS": "QWENWEB_CORS_ALLOWED_ORIGINS",
    "METRICS": "QWENWEB_METRICS",
    "METRICS_TOKEN": "QWENWEB_METRICS_TOKEN",
    "METRICS_ALLOWED_NETS": "QWENWEB_METRICS_ALLOWED_NETS",
    "METRICS_FLUSH_INTERVAL_S": "QWENWEB_METRICS_FLUSH_INTERVAL_S",
    "DRAIN_S": "QWENWEB_DRAIN_S",
    "REQUEST_HEADER_TIMEOUT_S": "QWENWEB_REQUEST_HEADER_TIMEOUT_S",
    "REQUEST_BODY_TIMEOUT_S": "QWENWEB_REQUEST_BODY_TIMEOUT_S",
    "LOGIN_MAX_FAILURES": "QWENWEB_LOGIN_MAX_FAILURES",
    "WS_MAX_SUBSCRIPTIONS": "QWENWEB_WS_MAX_SUBSCRIPTIONS",
    "WS_COMMAND_BURST": "QWENWEB_WS_COMMAND_BURST",
    "WS_COMMAND_RATE_PER_S": "QWENWEB_WS_COMMAND_RATE_PER_S",
    "WS_MAX_MESSAGE_BYTES": "QWENWEB_WS_MAX_MESSAGE_BYTES",
    "WS_MAX_SOCKETS_PER_USER": "QWENWEB_WS_MAX_SOCKETS_PER_USER",
    "WS_MAX_UNSENT_BYTES": "QWENWEB_WS_MAX_UNSENT_BYTES",
    "LOGIN_LOCKOUT_S": "QWENWEB_LOGIN_LOCKOUT_S",
    "ANONYMOUS_BODY_TIMEOUT_S": "QWENWEB_ANONYMOUS_BODY_TIMEOUT_S",
    "SERVER_BACKLOG": "QWENWEB_SERVER_BACKLOG",
    "RING_MAX_BYTES": "QWENWEB_RING_MAX_BYTES",
    "RING_MAX_AGE_S": "QWENWEB_RING_MAX_AGE_S",
    "MAX_RING_BYTES_TOTAL": "QWENWEB_MAX_RING_BYTES_TOTAL",
    "MAX_SESSIONS_PER_USER": "QWENWEB_MAX_SESSIONS_PER_USER",
    "MAX_USER_RING_SIZE": "QWENWEB_MAX_USER_RING_SIZE",
    "PUBLISH_RATE_PER_S": "QWENWEB_PUBLISH_RATE_PER_S",
    "PUBLISH_BYTES_PER_S": "QWENWEB_PUBLISH_BYTES_PER_S",
    "PUBLISH_MAX_VALUES": "QWENWEB_PUBLISH_MAX_VALUES",
    "PUBLISH_VALUES_PER_S": "QWENWEB_PUBLISH_VALUES_PER_S",
    "PUBLISH_USER_VALUES_PER_S": "QWENWEB_PUBLISH_USER_VALUES_PER_S",
    "IDLE_UNLOAD_S": "QWENWEB_IDLE_UNLOAD_S",
    "SESSION_HOLD_TTL_S": "QWENWEB_SESSION_HOLD_TTL_S",
    "SNAPSHOT_LIMIT": "QWENWEB_SNAPSHOT_LIMIT",
    "SNAPSHOT_MAX_BYTES": "QWENWEB_SNAPSHOT_MAX_BYTES",
    "STREAM_COMPRESSION": "QWENWEB_STREAM_COMPRESSION",
    "CLOSED_HISTORY_S": "QWENWEB_CLOSED_HISTORY_S",
    "EVENT_LOG_PATH": "QWENWEB_EVENT_LOG_PATH",
    "EVENT_LOG_SYNCHRONOUS": "QWENWEB_EVENT_LOG_SYNCHRONOUS",
    "EVENT_LOG_MAX_BYTES": "QWENWEB_EVENT_LOG_MAX_BYTES",
    "EVENT_LOG_ON_MISMATCH": "QWENWEB_EVENT_LOG_ON_MISMATCH",
    "DASHBOARD_LAG_WARN_EVENTS": "QWENWEB_DASHBOARD_LAG_WARN_EVENTS",
    "DASHBOARD_LAG_ALERT_EVENTS": "QWENWEB_DASHBOARD_LAG_ALERT_EVENTS",
    "DASHBOARD_EVICTIONS_WARN": "QWENWEB_DASHBOARD_EVICTIONS_WARN",
    "DASHBOARD_EVICTIONS_ALERT": "QWENWEB_DASHBOARD_EVICTIONS_ALERT",
}

_DEFAULTS: Final[dict[str, Any]] = {
    "RING_SIZE": DEFAULT_RING_SIZE,
    "MAX_SUBSCRIBERS": DEFAULT_MAX_SUBSCRIBERS,
    "MAX_QUEUED_BYTES": DEFAULT_MAX_QUEUED_BYTES,
    "OVERFLOW_GRACE_S": DEFAULT_OVERFLOW_GRACE_S,
    "HEARTBEAT_INTERVAL_S": 15.0,
    "WRITER_IDLE_TIMEOUT_S": 30.0,
    # None: WRITER_IDLE_TIMEOUT_S + TCP_USER_TIMEOUT_GRACE_S; 0: leave the sockets alone.
    "TCP_USER_TIMEOUT_S": None,
    # A reader frozen while evicted reads its last frames if it wakes within
    # WRITER_IDLE_TIMEOUT_S + this of its socket filling (docs/protocol.md, B21).
    "EVICTED_LINGER_S": 90.0,
    "TOKEN_LIFETIME_S": 3600,
    # 2 MiB: an event of 1 MiB of data fits with its envelope (and Django's
    # DATA_UPLOAD_MAX_MEMORY_SIZE, 64 MiB + 1, above the range's top, never cuts first).
    "PUBLISH_MAX_BODY_BYTES": 2 * _MIB,
    "ID_RESERVATION_BLOCK": 100_000,
    "BACKEND": "durable",
    "REDIS_URL": "redis://127.0.0.1:6379/0",
    "REDIS_KEY_PREFIX": "qwenweb",
    # Sentinel (docs/deployment.md "Redis with Sentinel"): none by default.
    "REDIS_SENTINELS": (),
    "REDIS_SENTINEL_SERVICE": "",
    "REDIS_SENTINEL_PASSWORD": "",
    # Redis Cluster seed nodes: not supported yet; set, it is a configuration error.
    "REDIS_CLUSTER": (),
    # A publish is answered once this many replicas have it (WAIT); 0: at once (async).
    "REDIS_WAIT_REPLICAS": 0,
    "REDIS_WAIT_TIMEOUT_MS": 1000,
    "PROCESS_TTL_S": 10.0,
    "RECORDS_FLUSH_INTERVAL_S": 1.0,
    "RECORDS_BATCH_SIZE": 500,
    "RECORDS_RETENTION_DAYS": 30,
    "IDEMPOTENCY_TTL_S": 900,
    "IDEMPOTENCY_MAX_KEYS": 10_000,
    # Memory backend, every session of the process: about 400 B a key (docs/capacity.md).
    "IDEMPOTENCY_MAX_KEYS_TOTAL": 200_000,
    "CORS_ALLOWED_ORIGINS": (),
    "METRICS": True,
    "METRICS_TOKEN": "",
    "METRICS_ALLOWED_NETS": ("127.0.0.0/8", "::1/128"),
    "METRICS_FLUSH_INTERVAL_S": 1.0,
    "DRAIN_S": 10.0,
    "REQUEST_HEADER_TIMEOUT_S": 10.0,
    # A whole request body, from its headers (sessions.transport.body_deadline): 2 MiB
    # takes 10 s at 1.7 Mbit/s; a request without a credential gets less.
    "REQUEST_BODY_TIMEOUT_S": 10.0,
    "ANONYMOUS_BODY_TIMEOUT_S": 5.0,
    # Failed logins per username and per address before a lockout (sessions.login_throttle).
    "LOGIN_MAX_FAILURES": 10,
    # The WebSocket transport (docs/protocol.md, "The WebSocket transport"): a socket may
    # carry 256 subscriptions and resubscribe them all in one burst of commands.
    "WS_MAX_SUBSCRIPTIONS": 256,
    "WS_COMMAND_BURST": 300,
    "WS_COMMAND_RATE_PER_S": 50.0,
    "WS_MAX_MESSAGE_BYTES": 65_536,
    "WS_MAX_SOCKETS_PER_USER": 32,
    # A socket's kernel send queue (unacknowledged bytes) above this: its writer waits
    # (sessions.transport.unsent; uvicorn's and daphne's send do not wait themselves).
    "WS_MAX_UNSENT_BYTES": _MIB,
    "LOGIN_LOCKOUT_S": 900,
    "SERVER_BACKLOG": 4096,
    # Memory and quotas (docs/protocol.md "Ring limits" and "Quotas"; docs/capacity.md).
    "RING_MAX_BYTES": DEFAULT_RING_MAX_BYTES,
    "RING_MAX_AGE_S": 0.0,  # off
    "MAX_RING_BYTES_TOTAL": None,  # None: default_ring_bytes_total()
    "MAX_SESSIONS_PER_USER": 100,
    "MAX_USER_RING_SIZE": 10_000,
    "PUBLISH_RATE_PER_S": 1000.0,
    "PUBLISH_BYTES_PER_S": 64 * _MIB,
    # JSON values (issue 26): 2 MiB of "{}," is about 700,000 values, 40 ms of parsing
    # that holds the GIL (the loop waits) and 60 ms of validation; an ordinary event holds
    # a few dozen. 100,000 values parse in about 6 ms.
    "PUBLISH_MAX_VALUES": 100_000,
    "PUBLISH_VALUES_PER_S": 250_000.0,
    "PUBLISH_USER_VALUES_PER_S": 500_000.0,
    "IDLE_UNLOAD_S": 0.0,  # off
    "SESSION_HOLD_TTL_S": 30.0,
    "SNAPSHOT_LIMIT": 500,
    "SNAPSHOT_MAX_BYTES": 8 * 1024 * 1024,
    # EB-17: gzip the stream when the client accepts it (docs/protocol.md, "Compression").
    "STREAM_COMPRESSION": True,
    "CLOSED_HISTORY_S": 86400.0,  # a day
    # Durable backend (docs/protocol.md "Durable history"): "" derives the path from the
    # database (sessions.backends.durable.log_path).
    "EVENT_LOG_PATH": "",
    "EVENT_LOG_SYNCHRONOUS": "NORMAL",
    "EVENT_LOG_MAX_BYTES": 10 * 1024 * _MIB,
    "EVENT_LOG_ON_MISMATCH": "refuse",
    # The dashboard's thresholds (amber from WARN, red from ALERT): a subscriber's lag in
    # events behind the head (the default maxQueued is 256; slow_client_warning at 75 %),
    # and a session's evictions.
    "DASHBOARD_LAG_WARN_EVENTS": 64,
    "DASHBOARD_LAG_ALERT_EVENTS": 192,
    "DASHBOARD_EVICTIONS_WARN": 1,
    "DASHBOARD_EVICTIONS_ALERT": 10,
}

# key -> (kind, minimum, maximum)
_RANGES: Final[dict[str, tuple[type, float, float]]] = {
    "RING_SIZE": (int, 1, MAX_EVENT_RING_SIZE),
    "MAX_SUBSCRIBERS": (int, 1, 100_000),
    "MAX_QUEUED_BYTES": (int, 1, MAX_SAFE_INTEGER),
    "OVERFLOW_GRACE_S": (float, 0, 60),
    "HEARTBEAT_INTERVAL_S": (float, 0.01, 3600),
    "WRITER_IDLE_TIMEOUT_S": (float, 0.01, 3600),
    "EVICTED_LINGER_S": (float, 0, 3600),
    "TOKEN_LIFETIME_S": (int, 1, 30 * 24 * 3600),
    "PUBLISH_MAX_BODY_BYTES": (int, 64, 64 * 1024 * 1024),
    # At least 1,000: the block must stay ahead of publishing while a renewal is written.
    "ID_RESERVATION_BLOCK": (int, 1000, MAX_SAFE_INTEGER // 4),
    "PROCESS_TTL_S": (float, 0.2, 3600),
    "REDIS_WAIT_REPLICAS": (int, 0, 16),
    # Below the 5 s command timeout of the Redis connections (sessions.backends.redis_store).
    "REDIS_WAIT_TIMEOUT_MS": (int, 1, 4000),
    "RECORDS_FLUSH_INTERVAL_S": (float, 0.01, 3600),
    "RECORDS_BATCH_SIZE": (int, 1, 100_000),
    "RECORDS_RETENTION_DAYS": (int, 1, 36_500),
    "IDEMPOTENCY_TTL_S": (int, 1, 7 * 24 * 3600),
    "IDEMPOTENCY_MAX_KEYS": (int, 1, 1_000_000),
    "IDEMPOTENCY_MAX_KEYS_TOTAL": (int, 1, 100_000_000),
    "METRICS_FLUSH_INTERVAL_S": (float, 0.01, 60),
    "DRAIN_S": (float, 0, 600),
    # granian's --http1-header-read-timeout takes 1 ms ... 60 s.
    "REQUEST_HEADER_TIMEOUT_S": (float, 0.001, 60),
    "REQUEST_BODY_TIMEOUT_S": (float, 0.1, 3600),
    "ANONYMOUS_BODY_TIMEOUT_S": (float, 0.1, 3600),
    "LOGIN_MAX_FAILURES": (int, 1, 1_000_000),
    "WS_MAX_SUBSCRIPTIONS": (int, 1, 100_000),
    "WS_COMMAND_BURST": (int, 1, 1_000_000),
    "WS_COMMAND_RATE_PER_S": (float, 0.01, 1_000_000),
    "WS_MAX_MESSAGE_BYTES": (int, 1024, 65_536),
    "WS_MAX_SOCKETS_PER_USER": (int, 1, 100_000),
    "WS_MAX_UNSENT_BYTES": (int, 65_536, 64 * _MIB),
    "LOGIN_LOCKOUT_S": (int, 1, 7 * 24 * 3600),
    # The listen queue (the kernel caps it at net.core.somaxconn).
    "SERVER_BACKLOG": (int, 128, 65_535),
    "RING_MAX_BYTES": (int, 1024, MAX_SAFE_INTEGER),
    "RING_MAX_AGE_S": (float, 0, 30 * 24 * 3600),
    "MAX_RING_BYTES_TOTAL": (int, 1024 * 1024, MAX_SAFE_INTEGER),
    "MAX_SESSIONS_PER_USER": (int, 1, 10_000_000),
    "MAX_USER_RING_SIZE": (int, 1, MAX_EVENT_RING_SIZE),
    "PUBLISH_RATE_PER_S": (float, 0.01, 1_000_000),
    "PUBLISH_BYTES_PER_S": (int, 1024, MAX_SAFE_INTEGER),
    "PUBLISH_MAX_VALUES": (int, 1000, 100_000_000),
    "PUBLISH_VALUES_PER_S": (float, 1, 1e12),
    "PUBLISH_USER_VALUES_PER_S": (float, 1, 1e12),
    "IDLE_UNLOAD_S": (float, 0, 30 * 24 * 3600),
    "SESSION_HOLD_TTL_S": (float, 1, 3600),
    "SNAPSHOT_LIMIT": (int, 1, 5000),
    "SNAPSHOT_MAX_BYTES": (int, 64 * 1024, 64 * 1024 * 1024),
    "CLOSED_HISTORY_S": (float, 0, 10 * 365 * 86400),
    "EVENT_LOG_MAX_BYTES": (int, 16 * _MIB, MAX_SAFE_INTEGER),
    "DASHBOARD_LAG_WARN_EVENTS": (int, 1, MAX_SAFE_INTEGER),
    "DASHBOARD_LAG_ALERT_EVENTS": (int, 1, MAX_SAFE_INTEGER),
    "DASHBOARD_EVICTIONS_WARN": (int, 1, MAX_SAFE_INTEGER),
    "DASHBOARD_EVICTIONS_ALERT": (int, 1, MAX_SAFE_INTEGER),
}
#: Choices of the settings that take a word (the first is the default).
_CHOICES: Final[dict[str, tuple[str, ...]]] = {
    "EVENT_LOG_SYNCHRONOUS": ("NORMAL", "FULL"),
    "EVENT_LOG_ON_MISMATCH": ("refuse", "new_epoch"),
}
TCP_USER_TIMEOUT_GRACE_S: Final = 2.0
"""How much longer than the writer idle timeout the kernel waits for an acknowledgement
(``TCP_USER_TIMEOUT``, sessions.transport.peer_timeout): where ``send`` itself waits on a
full socket (daphne with flow control), the application's timeout fires first and the
subscriber gets ``client_evicted``."""
_TCP_USER_TIMEOUT_RANGE: Final = (0.0, 3600.0)
#: The most events one ``GET /session/<id>`` answers, whatever ``?limit=`` asks.
SNAPSHOT_MAX_LIMIT: Final = 5000
_BACKEND_ALIASES: Final = ("memory", "redis", "durable")
_BOOL_WORDS: Final = {"1": True, "true": True, "yes": True, "on": True, "0": False,
                      "false": False, "no": False, "off": False}  # fmt: skip
# Or the dotted path of a Backend subclass (checked for importability by sessions.checks).
_DOTTED_PATH: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")
_REDIS_SCHEMES: Final = ("redis://", "rediss://", "unix://")
# An origin as browsers send it: scheme, host, optional port; no path, no trailing slash.
_ORIGIN: Final = re.compile(r"https?://(?:[a-z0-9.-]+|\[[0-9a-f:.]+\])(?::[0-9]{1,5})?")


@dataclass(frozen=True, slots=True)
class QwenwebConfig:
    """The effective bus and route settings (units in the names)."""

    ring_size: int
    max_subscribers: int
    max_queued_bytes: int
    overflow_grace_s: float
    heartbeat_interval_s: float
    writer_idle_timeout_s: float
    #: None: derived (:attr:`peer_timeout_s`); 0: off.
    tcp_user_timeout_s: float | None
    #: How long an evicted subscriber's blocked ``send`` may wait after the writer idle
    #: bound passed, so that a frozen reader still reads ``client_evicted`` (B21).
    evicted_linger_s: float
    token_lifetime_s: int
    publish_max_body_bytes: int
    id_reservation_block: int
    backend: str
    redis_url: str
    redis_key_prefix: str
    #: Sentinels ``(host, port)`` naming the primary of ``redis_sentinel_service``; empty:
    #: ``redis_url`` is the server.
    redis_sentinels: tuple[tuple[str, int], ...]
    redis_sentinel_service: str
    redis_sentinel_password: str
    #: Redis Cluster seed nodes ``(host, port)`` (not supported yet: a check error).
    redis_cluster: tuple[tuple[str, int], ...]
    #: Replicas that must have a publish before it is answered (``WAIT``); 0: off.
    redis_wait_replicas: int
    #: How long a publish waits for them (ms); then it answers 503 ``outcome_unknown``.
    redis_wait_timeout_ms: int
    process_ttl_s: float
    records_flush_interval_s: float
    records_batch_size: int
    records_retention_days: int
    idempotency_ttl_s: int
    idempotency_max_keys: int
    #: Memory backend: the keys of every session of the process together.
    idempotency_max_keys_total: int
    #: Browser origins allowed to call the bearer-token API and the stream (CORS); empty:
    #: same origin only.
    cors_allowed_origins: tuple[str, ...]
    #: Whether ``/metrics`` is served and the metrics listener counts (``QWENWEB_METRICS=0``:
    #: off, e.g. for a bench A/B).
    metrics: bool
    #: A bearer token that may read ``/metrics`` from anywhere; empty: none.
    metrics_token: str
    #: Client networks that may read ``/metrics`` without a token (never trusted when the
    #: request carries forwarding headers).
    metrics_allowed_nets: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
    #: How often the per-frame counters are handed to Prometheus (seconds).
    metrics_flush_interval_s: float
    #: Graceful drain: open streams end spread over this many seconds at shutdown.
    drain_s: float
    #: ``python -m qwenweb.serve`` (granian): a connection whose request headers are not
    #: complete within this many seconds is closed (HTTP/1.1; streams are not affected).
    request_header_timeout_s: float
    #: A request body must arrive whole within this many seconds of its headers (408 and
    #: closed past it); without a credential, within ``anonymous_body_timeout_s``.
    request_body_timeout_s: float
    anonymous_body_timeout_s: float
    #: Failed logins of one username or from one address within ``login_lockout_s``
    #: seconds that lock them out for the rest of that time.
    login_max_failures: int
    #: The WebSocket transport's limits: subscriptions per socket, the command bucket
    #: (burst, refill per second), the largest client message (bytes), sockets per user.
    ws_max_subscriptions: int
    ws_command_burst: int
    ws_command_rate_per_s: float
    ws_max_message_bytes: int
    ws_max_sockets_per_user: int
    #: A socket's writer waits while its kernel send queue holds more than this (bytes).
    ws_max_unsent_bytes: int
    login_lockout_s: int
    #: ``python -m qwenweb.serve`` (granian): the listen backlog of its socket.
    server_backlog: int
    #: A session's ring: bytes (of ``sessions.bus.held_bytes``) and age (s, 0 = off).
    ring_max_bytes: int
    ring_max_age_s: float
    #: Every ring of the process together (bytes); its default: default_ring_bytes_total.
    max_ring_bytes_total: int
    #: Quotas: open sessions per user, the largest ringSize a non-staff user may ask for,
    #: and each session's publish token buckets (events/s, bytes/s; a burst of 2 s).
    max_sessions_per_user: int
    max_user_ring_size: int
    publish_rate_per_s: float
    publish_bytes_per_s: int
    #: The most JSON values (their bound: sessions.web.offload.json_values_bound) of one
    #: publish body, and those parsed per second, per session and per user.
    publish_max_values: int
    publish_values_per_s: float
    publish_user_values_per_s: float
    #: Memory backend: unload a bus idle (no subscriber, no publish) this long; 0 = off.
    idle_unload_s: float
    #: Memory backend: how long a process's hold on a session lasts without renewal.
    session_hold_ttl_s: float
    #: Events a snapshot answers when ``?limit=`` is absent (at most SNAPSHOT_MAX_LIMIT).
    snapshot_limit: int
    #: Byte cap of a snapshot's events (the newest event is answered even if larger).
    snapshot_max_bytes: int
    #: Whether a stream is gzipped when its request accepts it (EB-17; off: never).
    stream_compression: bool
    #: How long a closed session's history stays readable (snapshot), seconds.
    closed_history_s: float
    #: Durable backend: the log file ("" = beside the SQLite database, or
    #: var/events-<fingerprint>.sqlite3), its SQLite ``synchronous`` level (NORMAL survives
    #: a process crash, FULL a power loss), its disk budget (bytes), and what to do with a
    #: log of another deployment or an unreadable one (refuse to start, or set it aside
    #: and start a new epoch above every id ever issued).
    event_log_path: str
    event_log_synchronous: str
    event_log_max_bytes: int
    event_log_on_mismatch: str
    #: The dashboard's thresholds, amber from ``*_warn``, red from ``*_alert`` (at least
    #: the warn value): a subscriber's lag (events behind the head), a session's evictions.
    dashboard_lag_warn_events: int
    dashboard_lag_alert_events: int
    dashboard_evictions_warn: int
    dashboard_evictions_alert: int

    @property
    def peer_timeout_s(self) -> float | None:
        """``TCP_USER_TIMEOUT`` in seconds for the server's sockets, None when off: the
        setting, or ``WRITER_IDLE_TIMEOUT_S`` + 2 s when unset (docs/protocol.md, "Half-open
        peers")."""
        if self.tcp_user_timeout_s is None:
            return self.writer_idle_timeout_s + TCP_USER_TIMEOUT_GRACE_S
        return self.tcp_user_timeout_s or None

    @property
    def evicted_peer_timeout_s(self) -> float | None:
        """``TCP_USER_TIMEOUT`` in seconds for the connection of a subscriber evicted while
        its reader acknowledges everything but reads nothing (a closed receive window), None
        when the option is off: :attr:`peer_timeout_s` + ``WRITER_IDLE_TIMEOUT_S`` +
        ``EVICTED_LINGER_S`` + 2 s, so that the linger, not the kernel, decides when that
        connection ends (docs/protocol.md, "A reader frozen while it is evicted")."""
        peer = self.peer_timeout_s
        if peer is None:
            return None
        return peer + self.writer_idle_timeout_s + self.evicted_linger_s + TCP_USER_TIMEOUT_GRACE_S

    @property
    def stream_heartbeat_s(self) -> float:
        """Seconds of silence before a stream writes ``: heartbeat``: ``HEARTBEAT_INTERVAL_S``,
        at most half of :attr:`peer_timeout_s` when that is on, so that an idle stream has
        bytes in flight often enough for the kernel to find a vanished peer within
        1.5 × ``TCP_USER_TIMEOUT_S`` (docs/protocol.md, "Half-open peers")."""
        peer = self.peer_timeout_s
        return (
            self.heartbeat_interval_s if peer is None else min(self.heartbeat_interval_s, peer / 2)
        )


def _raw_values() -> dict[str, Any]:
    values = dict(_DEFAULTS)
    values.update(getattr(settings, "QWENWEB", {}) or {})
    for key, env in ENV_OVERRIDES.items():
        if env in os.environ:
            values[key] = os.environ[env]
    return values


def _coerce(key: str, raw: Any) -> tuple[Any, str | None]:
    """Return ``(value, None)`` or ``(None, error message)`` for one setting."""
    source = f"QWENWEB[{key!r}]" + (
        f" (or ${ENV_OVERRIDES[key]})" if ENV_OVERRIDES.get(key) else ""
    )
    if key == "BACKEND":
        if raw in _BACKEND_ALIASES or (isinstance(raw, str) and _DOTTED_PATH.fullmatch(raw)):
            return raw, None
        return None, (
            f"{source} must be one of {', '.join(_BACKEND_ALIASES)} or the dotted path of a "
            f"Backend subclass; got {raw!r}"
        )
    if key == "REDIS_URL":
        if isinstance(raw, str) and raw.startswith(_REDIS_SCHEMES):
            return raw, None
        return None, f"{source} must be a redis://, rediss:// or unix:// URL; got {raw!r}"
    if key == "REDIS_KEY_PREFIX":
        if isinstance(raw, str) and 1 <= len(raw) <= 64 and raw.isprintable() and " " not in raw:
            return raw, None
        return None, f"{source} must be 1-64 printable characters without spaces; got {raw!r}"
    if key in ("REDIS_SENTINELS", "REDIS_CLUSTER"):
        return _coerce_hosts(source, raw)
    if key in ("REDIS_SENTINEL_SERVICE", "REDIS_SENTINEL_PASSWORD"):
        if isinstance(raw, str) and (raw == "" or (raw.isprintable() and " " not in raw)):
            return raw, None
        return None, f"{source} must be printable characters without spaces"
    if key == "CORS_ALLOWED_ORIGINS":
        return _coerce_origins(source, raw)
    if key == "TCP_USER_TIMEOUT_S":
        return _coerce_user_timeout(source, raw)
    if key in ("METRICS", "STREAM_COMPRESSION"):
        return _coerce_bool(source, raw)
    if key == "METRICS_TOKEN":
        if isinstance(raw, str) and (raw == "" or (len(raw) >= 16 and raw.isprintable())):
            return raw.strip(), None
        return None, f"{source} must be empty or at least 16 printable characters"
    if key == "METRICS_ALLOWED_NETS":
        return _coerce_nets(source, raw)
    if key == "EVENT_LOG_PATH":
        if isinstance(raw, str) and "\x00" not in raw:
            return raw.strip(), None
        return None, f"{source} must be a file path (or empty: derived); got {raw!r}"
    if key in _CHOICES:
        word = raw.strip() if isinstance(raw, str) else raw
        for choice in _CHOICES[key]:
            if isinstance(word, str) and word.lower() == choice.lower():
                return choice, None
        return None, f"{source} must be one of {', '.join(_CHOICES[key])}; got {raw!r}"
    if key == "MAX_RING_BYTES_TOTAL" and raw in (None, ""):
        return default_ring_bytes_total(), None
    kind, low, high = _RANGES[key]
    value: Any
    try:
        if isinstance(raw, bool):
            raise ValueError
        if kind is int:
            value = int(raw.strip()) if isinstance(raw, str) else raw
            if not isinstance(value, int):
                raise ValueError
        else:
            value = float(raw.strip()) if isinstance(raw, str) else float(raw)
    except (TypeError, ValueError):
        return None, f"{source} must be {'an integer' if kind is int else 'a number'}; got {raw!r}"
    if not low <= value <= high:
        return None, f"{source} must be in [{low:_}, {high:_}]; got {value!r}"
    return value, None


def _coerce_origins(source: str, raw: Any) -> tuple[Any, str | None]:
    """``CORS_ALLOWED_ORIGINS``: a list of origins, or a comma-separated string (the env)."""
    if isinstance(raw, str):
        items: Any = [part.strip() for part in raw.split(",") if part.strip()]
    elif isinstance(raw, list | tuple):
        items = list(raw)
    else:
        return None, f"{source} must be a list of origins; got {raw!r}"
    for item in items:
        if not isinstance(item, str) or not _ORIGIN.fullmatch(item):
            return None, (
                f"{source} must hold origins like 'https://app.example.com' (lowercase scheme "
                f"and host, optional port, no path, no '*'); got {item!r}"
            )
    return tuple(dict.fromkeys(items)), None


def _coerce_hosts(source: str, raw: Any) -> tuple[Any, str | None]:
    """``REDIS_SENTINELS`` / ``REDIS_CLUSTER``: ``host:port`` items (``[v6]:port`` too), a
    list or a comma-separated string (the env)."""
    if isinstance(raw, str):
        items: Any = [part.strip() for part in raw.split(",") if part.strip()]
    elif isinstance(raw, list | tuple):
        items = list(raw)
    else:
        return None, f"{source} must be a list of host:port; got {raw!r}"
    hosts = []
    for item in items:
        host, sep, port = item.rpartition(":") if isinstance(item, str) else ("", "", "")
        host = host.removeprefix("[").removesuffix("]")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65_535:
            return None, f"{source} must hold host:port items like '10.0.0.5:26379'; got {item!r}"
        hosts.append((host, int(port)))
    return tuple(dict.fromkeys(hosts)), None


def _combination_errors(values: dict[str, Any]) -> list[str]:
    """Settings valid one by one that do not go together (each already coerced)."""
    errors = []
    if values["redis_sentinels"] and values["redis_cluster"]:
        errors.append(
            "QWENWEB['REDIS_SENTINELS'] and QWENWEB['REDIS_CLUSTER'] (or $QWENWEB_REDIS_SENTINELS "
            "and $QWENWEB_REDIS_CLUSTER) are both set: a Redis is either Sentinel-managed or a "
            "Cluster; set one"
        )
    if values["redis_sentinels"] and not values["redis_sentinel_service"]:
        errors.append(
            "QWENWEB['REDIS_SENTINELS'] (or $QWENWEB_REDIS_SENTINELS) is set but "
            "QWENWEB['REDIS_SENTINEL_SERVICE'] (or $QWENWEB_REDIS_SENTINEL_SERVICE), the "
            "primary's name in the Sentinels' configuration, is empty"
        )
    for warn, alert in (
        ("DASHBOARD_LAG_WARN_EVENTS", "DASHBOARD_LAG_ALERT_EVENTS"),
        ("DASHBOARD_EVICTIONS_WARN", "DASHBOARD_EVICTIONS_ALERT"),
    ):
        if values[warn.lower()] > values[alert.lower()]:
            errors.append(
                f"QWENWEB[{warn!r}] ({values[warn.lower()]}) is above QWENWEB[{alert!r}] "
                f"({values[alert.lower()]}): amber must start at or below red"
            )
    if values["redis_cluster"] and values["redis_wait_replicas"]:
        errors.append(
            "QWENWEB['REDIS_WAIT_REPLICAS'] (or $QWENWEB_REDIS_WAIT_REPLICAS) is set with "
            "QWENWEB['REDIS_CLUSTER']: replicated acknowledgements are not supported on a "
            "Cluster yet (WAIT must follow the publish on the slot's node); set one"
        )
    return errors


def _coerce_user_timeout(source: str, raw: Any) -> tuple[Any, str | None]:
    """``TCP_USER_TIMEOUT_S``: None or ``"auto"`` (derived), else seconds in [0, 3600]."""
    if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "auto")):
        return None, None
    low, high = _TCP_USER_TIMEOUT_RANGE
    try:
        if isinstance(raw, bool):
            raise ValueError
        value = float(raw.strip()) if isinstance(raw, str) else float(raw)
    except (TypeError, ValueError):
        return None, f"{source} must be a number of seconds or 'auto'; got {raw!r}"
    if not low <= value <= high:
        return None, f"{source} must be in [{low:g}, {high:g}] (0: off) or 'auto'; got {value!r}"
    return value, None


def _coerce_bool(source: str, raw: Any) -> tuple[Any, str | None]:
    if isinstance(raw, bool):
        return raw, None
    if isinstance(raw, str) and raw.strip().lower() in _BOOL_WORDS:
        return _BOOL_WORDS[raw.strip().lower()], None
    return None, f"{source} must be a boolean (1/0, true/false, on/off); got {raw!r}"


def _coerce_nets(source: str, raw: Any) -> tuple[Any, str | None]:
    """``METRICS_ALLOWED_NETS``: CIDR networks, a list or a comma-separated string."""
    if isinstance(raw, str):
        items: Any = [part.strip() for part in raw.split(",") if part.strip()]
    elif isinstance(raw, list | tuple):
        items = list(raw)
    else:
        return None, f"{source} must be a list of networks like '10.0.0.0/8'; got {raw!r}"
    nets = []
    for item in items:
        try:
            nets.append(ipaddress.ip_network(item, strict=False))
        except (TypeError, ValueError):
            return None, f"{source} must hold networks like '10.0.0.0/8' or '::1/128'; got {item!r}"
    return tuple(nets), None


def config_errors() -> list[str]:
    """Return one message per bad setting (empty when all are valid). Never raises."""
    errors = []
    coerced = {}
    for key, raw in _raw_values().items():
        if key in _DEFAULTS:
            value, error = _coerce(key, raw)
            if error:
                errors.append(error)
            coerced[key.lower()] = value
    return errors or _combination_errors(coerced)


@functools.cache
def get_config() -> QwenwebConfig:
    """Return the effective configuration (cached; cleared when a setting changes).

    Raises:
        ImproperlyConfigured: a value is of the wrong type or out of range; the message
            names the setting, its environment variable and the allowed range.
    """
    values = _raw_values()
    out: dict[str, Any] = {}
    for key in _DEFAULTS:
        value, error = _coerce(key, values[key])
        if error:
            raise ImproperlyConfigured(error)
        out[key.lower()] = value
    for error in _combination_errors(out):
        raise ImproperlyConfigured(error)
    return QwenwebConfig(**out)


@receiver(setting_changed)
def _clear_cache(*, setting: str, **kwargs: Any) -> None:
    if setting == "QWENWEB":
        get_config.cache_clear()
