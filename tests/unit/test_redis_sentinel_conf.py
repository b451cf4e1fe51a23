"""Sentinel settings: parsed from the environment, refused when they do not go together,
and turned into the clients of :mod:`sessions.backends.redis_clients` (no server needed)."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio as redis_asyncio
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from sessions.backends.redis_clients import RedisTarget, async_pool, sync_client
from sessions.backends.redis_control import redis_target
from sessions.conf import get_config


@pytest.fixture(autouse=True)
def fresh_config() -> object:
    get_config.cache_clear()
    yield
    get_config.cache_clear()


def test_sentinels_come_from_a_comma_separated_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QWENWEB_REDIS_SENTINELS", "10.0.0.5:26379, [fd00::7]:26380")
    monkeypatch.setenv("QWENWEB_REDIS_SENTINEL_SERVICE", "qw")
    config = get_config()
    assert config.redis_sentinels == (("10.0.0.5", 26379), ("fd00::7", 26380))
    assert redis_target(config).describe() == "sentinel://10.0.0.5:26379,fd00::7:26380/qw"


@pytest.mark.parametrize("raw", ["10.0.0.5", "10.0.0.5:0", "10.0.0.5:x", ":26379"])
def test_bad_sentinel_addresses_are_refused(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("QWENWEB_REDIS_SENTINELS", raw)
    monkeypatch.setenv("QWENWEB_REDIS_SENTINEL_SERVICE", "qw")
    with pytest.raises(ImproperlyConfigured, match=r"QWENWEB_REDIS_SENTINELS.*host:port"):
        get_config()


def test_sentinels_and_cluster_together_are_a_check_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QWENWEB_REDIS_SENTINELS", "127.0.0.1:26379")
    monkeypatch.setenv("QWENWEB_REDIS_SENTINEL_SERVICE", "qw")
    monkeypatch.setenv("QWENWEB_REDIS_CLUSTER", "127.0.0.1:7000")
    with pytest.raises(SystemCheckError, match=r"qwenweb\.E001.*either Sentinel-managed or"):
        call_command("check")


def test_sentinels_without_a_service_name_are_a_check_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QWENWEB_REDIS_SENTINELS", "127.0.0.1:26379")
    with pytest.raises(SystemCheckError, match=r"REDIS_SENTINEL_SERVICE"):
        call_command("check")


def test_sentinel_clients_keep_the_urls_credentials_and_database_but_not_its_address() -> None:
    target = RedisTarget(
        "redis://app:s3cret@10.9.9.9:6390/4", (("127.0.0.1", 1),), "qw", "sentinel-pw"
    )
    pool = async_pool(
        target, max_connections=3, timeout_s=1, connect_timeout_s=1, socket_timeout_s=1
    )
    kwargs = pool.connection_kwargs
    assert (kwargs["username"], kwargs["password"], kwargs["db"]) == ("app", "s3cret", 4)
    assert "host" not in kwargs
    assert "port" not in kwargs
    sentinel = pool.sentinel_manager.sentinels[0]  # type: ignore[attr-defined]
    assert sentinel.connection_pool.connection_kwargs["password"] == "sentinel-pw"
    assert "s3cret" not in target.describe()


def test_a_tls_url_makes_tls_connections_to_the_primary_sentinel_picks() -> None:
    target = RedisTarget("rediss://10.9.9.9:6390/0", (("127.0.0.1", 1),), "qw")
    pool = async_pool(
        target, max_connections=3, timeout_s=1, connect_timeout_s=1, socket_timeout_s=1
    )
    assert issubclass(pool.connection_class, redis_asyncio.SSLConnection)
    client = sync_client(target, 1.0)
    assert issubclass(client.connection_pool.connection_class, redis.SSLConnection)
    client.close()


@pytest.mark.parametrize(
    ("env", "raw"), [("REDIS_WAIT_REPLICAS", "-1"), ("REDIS_WAIT_TIMEOUT_MS", "5000")]
)
def test_wait_settings_out_of_range_are_refused(
    monkeypatch: pytest.MonkeyPatch, env: str, raw: str
) -> None:
    # The WAIT timeout stays below the connections' 5 s command timeout.
    monkeypatch.setenv(f"QWENWEB_{env}", raw)
    with pytest.raises(ImproperlyConfigured, match=env):
        get_config()
