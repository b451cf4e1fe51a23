"""Cluster settings: parsed from the environment, refused where they do not go together,
and turned into the clients of :mod:`sessions.backends.redis_clients` (no server needed)."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from sessions.backends.errors import BackendUnavailableError
from sessions.backends.redis_clients import (
    RedisTarget,
    async_cluster,
    sync_client,
    unavailable_as_error,
)
from sessions.backends.redis_control import redis_target
from sessions.conf import get_config


@pytest.fixture(autouse=True)
def fresh_config() -> object:
    get_config.cache_clear()
    yield
    get_config.cache_clear()


def test_cluster_seeds_come_from_a_comma_separated_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QWENWEB_REDIS_CLUSTER", "10.0.0.21:6379, 10.0.0.22:6380")
    config = get_config()
    assert config.redis_cluster == (("10.0.0.21", 6379), ("10.0.0.22", 6380))
    assert redis_target(config).describe() == "cluster://10.0.0.21:6379,10.0.0.22:6380"
    call_command("check")  # a Cluster alone is a valid configuration


def test_cluster_with_replicated_acknowledgements_is_a_check_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QWENWEB_REDIS_CLUSTER", "127.0.0.1:7000")
    monkeypatch.setenv("QWENWEB_REDIS_WAIT_REPLICAS", "1")
    with pytest.raises(SystemCheckError, match=r"REDIS_WAIT_REPLICAS.*REDIS_CLUSTER"):
        call_command("check")


@pytest.mark.asyncio
async def test_cluster_clients_keep_the_urls_credentials_and_tls() -> None:
    target = RedisTarget("rediss://app:s3cret@ignored:1/0", cluster=(("127.0.0.1", 7000),))
    client = async_cluster(target, max_connections=3, connect_timeout_s=1, socket_timeout_s=1)
    assert isinstance(client, AsyncRedisCluster)
    kwargs = client.get_connection_kwargs()
    assert (kwargs["username"], kwargs["password"]) == ("app", "s3cret")
    assert "s3cret" not in target.describe()
    await client.aclose()


def test_a_blocking_cluster_client_that_reaches_no_seed_is_unavailable() -> None:
    target = RedisTarget("redis://ignored:1/0", cluster=(("127.0.0.1", 1),))
    with pytest.raises(BackendUnavailableError), unavailable_as_error():
        sync_client(target, 0.5)  # redis-py's blocking cluster client connects at once


@pytest.mark.parametrize(
    "message",
    [
        "'NoneType' object has no attribute 'writelines'",
        "unable to perform operation on <TCPTransport closed=True reading=False 0x5>; the "
        "handler is closed",
    ],
)
def test_a_connection_closed_under_a_command_is_unavailable_not_a_bug(message: str) -> None:
    with pytest.raises(BackendUnavailableError), unavailable_as_error():
        raise AttributeError(message) if "NoneType" in message else RuntimeError(message)


def test_other_attribute_errors_stay_bugs() -> None:
    with pytest.raises(AttributeError), unavailable_as_error():
        raise AttributeError("'Frame' object has no attribute 'idd'")
