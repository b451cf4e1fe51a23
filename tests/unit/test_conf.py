"""Configuration: one settings dict, environment overrides, clear errors.

The settings are listed in docs/protocol.md, "Errors and limits".
"""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError, SystemCheckError

from sessions.conf import config_errors, get_config


def test_defaults_match_the_contract() -> None:
    config = get_config()
    assert (config.ring_size, config.max_subscribers, config.heartbeat_interval_s) == (
        8000,
        64,
        15.0,
    )
    assert config.max_queued_bytes == 2 * 1024 * 1024


def test_environment_overrides_the_settings_dict(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QWENWEB_RING_SIZE", "123")
    get_config.cache_clear()
    assert get_config().ring_size == 123
    get_config.cache_clear()


@pytest.mark.parametrize("raw", ["0", "1000001", "ten", "1.5", ""])
def test_bad_ring_size_is_refused_naming_the_range(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    # RING_SIZE: ring sizes outside [1, 1_000_000] are refused at start-up.
    monkeypatch.setenv("QWENWEB_RING_SIZE", raw)
    get_config.cache_clear()
    with pytest.raises(ImproperlyConfigured, match="RING_SIZE"):
        get_config()
    assert any("QWENWEB_RING_SIZE" in error for error in config_errors())
    get_config.cache_clear()


def test_system_check_reports_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QWENWEB_HEARTBEAT_INTERVAL_S", "-1")
    with pytest.raises(SystemCheckError, match=r"qwenweb\.E001"):
        call_command("check")


def test_runserver_refuses_out_of_range_event_ring_size() -> None:
    # `runserver --event-ring-size N` out of range stops with a clear message.
    with pytest.raises(CommandError, match=r"--event-ring-size must be in \[1, 1_000_000\]"):
        call_command("runserver", "--event-ring-size", "0", "--noreload")


@pytest.mark.parametrize(
    ("env", "raw", "match"),
    [
        ("QWENWEB_BACKEND", "postgres", "must be one of memory, redis"),
        ("QWENWEB_REDIS_URL", "http://127.0.0.1:6379", "redis://, rediss:// or unix://"),
        ("QWENWEB_REDIS_KEY_PREFIX", "has space", "without spaces"),
        ("QWENWEB_PROCESS_TTL_S", "0", "PROCESS_TTL_S"),
    ],
)
def test_bad_backend_settings_are_refused(
    monkeypatch: pytest.MonkeyPatch, env: str, raw: str, match: str
) -> None:
    # The Redis backend's settings are checked like the others.
    monkeypatch.setenv(env, raw)
    get_config.cache_clear()
    with pytest.raises(ImproperlyConfigured, match=match):
        get_config()
    get_config.cache_clear()


def test_redis_backend_is_selected_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QWENWEB_BACKEND", "redis")
    monkeypatch.setenv("QWENWEB_REDIS_URL", "redis://127.0.0.1:6379/3")
    monkeypatch.setenv("QWENWEB_REDIS_KEY_PREFIX", "qw-a")
    get_config.cache_clear()
    config = get_config()
    assert (config.backend, config.redis_url, config.redis_key_prefix) == (
        "redis",
        "redis://127.0.0.1:6379/3",
        "qw-a",
    )
    get_config.cache_clear()


def test_deploy_check_warns_when_redis_does_not_answer(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `check --deploy` names an unreachable Redis (port 1: nothing listens there).
    monkeypatch.setenv("QWENWEB_BACKEND", "redis")
    monkeypatch.setenv("QWENWEB_REDIS_URL", "redis://127.0.0.1:1/0")
    get_config.cache_clear()
    call_command("check", "--deploy", "--fail-level", "ERROR")
    assert "qwenweb.W002" in capsys.readouterr().err
    get_config.cache_clear()


@pytest.mark.parametrize(
    "raw", ["*", "https://app.example.com/", "app.example.com", "https://App.example.com"]
)
def test_bad_cors_origins_are_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("QWENWEB_CORS_ALLOWED_ORIGINS", raw)
    get_config.cache_clear()
    with pytest.raises(ImproperlyConfigured, match="CORS_ALLOWED_ORIGINS"):
        get_config()
    get_config.cache_clear()


def test_cors_origins_come_from_a_comma_separated_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QWENWEB_CORS_ALLOWED_ORIGINS", "https://a.example, http://127.0.0.1:3000")
    get_config.cache_clear()
    assert get_config().cors_allowed_origins == ("https://a.example", "http://127.0.0.1:3000")
    get_config.cache_clear()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, 7.0), ("auto", 7.0), ("0", None), ("12.5", 12.5)],
)
def test_tcp_user_timeout_follows_the_writer_idle_timeout_unless_set(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, expected: float | None
) -> None:
    # Half-open peers: unset, TCP_USER_TIMEOUT is WRITER_IDLE_TIMEOUT_S + 2 s; 0 turns it off.
    monkeypatch.setenv("QWENWEB_WRITER_IDLE_TIMEOUT_S", "5")
    if raw is not None:
        monkeypatch.setenv("QWENWEB_TCP_USER_TIMEOUT_S", raw)
    get_config.cache_clear()
    assert get_config().peer_timeout_s == expected
    get_config.cache_clear()


@pytest.mark.parametrize("raw", ["-1", "3601", "soon"])
def test_bad_tcp_user_timeout_is_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("QWENWEB_TCP_USER_TIMEOUT_S", raw)
    get_config.cache_clear()
    with pytest.raises(ImproperlyConfigured, match="TCP_USER_TIMEOUT_S"):
        get_config()
    get_config.cache_clear()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, 15.0),  # defaults: 15 s is below half of 32 s
        ({"QWENWEB_WRITER_IDLE_TIMEOUT_S": "5"}, 3.5),  # half of 7 s
        ({"QWENWEB_WRITER_IDLE_TIMEOUT_S": "5", "QWENWEB_TCP_USER_TIMEOUT_S": "0"}, 15.0),
    ],
)
def test_stream_heartbeat_comes_at_least_every_half_peer_timeout(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: float
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_config.cache_clear()
    assert get_config().stream_heartbeat_s == expected
    get_config.cache_clear()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, (90.0, 32.0 + 30.0 + 90.0 + 2.0)),  # defaults: U + W + linger + 2 s = 154 s
        ({"QWENWEB_EVICTED_LINGER_S": "10", "QWENWEB_WRITER_IDLE_TIMEOUT_S": "5"}, (10.0, 24.0)),
        ({"QWENWEB_TCP_USER_TIMEOUT_S": "0"}, (90.0, None)),  # the kernel's option off
    ],
)
def test_an_evicted_frozen_reader_gets_a_timeout_longer_than_its_linger(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], expected: tuple[float, float | None]
) -> None:
    # B21: the kernel must not end the connection before the linger does.
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_config.cache_clear()
    config = get_config()
    assert (config.evicted_linger_s, config.evicted_peer_timeout_s) == expected
    get_config.cache_clear()


@pytest.mark.parametrize("raw", ["-1", "3601", "long"])
def test_bad_evicted_linger_is_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("QWENWEB_EVICTED_LINGER_S", raw)
    get_config.cache_clear()
    with pytest.raises(ImproperlyConfigured, match="EVICTED_LINGER_S"):
        get_config()
    get_config.cache_clear()


def test_dashboard_thresholds_amber_above_red_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QWENWEB_DASHBOARD_LAG_WARN_EVENTS", "500")
    get_config.cache_clear()
    with pytest.raises(ImproperlyConfigured, match=r"DASHBOARD_LAG_WARN_EVENTS.*amber"):
        get_config()
    monkeypatch.setenv("QWENWEB_DASHBOARD_LAG_ALERT_EVENTS", "500")
    get_config.cache_clear()
    assert get_config().dashboard_lag_warn_events == get_config().dashboard_lag_alert_events == 500
    get_config.cache_clear()
