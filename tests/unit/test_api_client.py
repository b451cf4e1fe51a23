"""The terminal client's reconnection delays (SC-11), without a server."""

from __future__ import annotations

import random

import pytest

from sessions.api_client import EventStreamClient


def client_after(failures: int, retry_ms: int = 3000) -> EventStreamClient:
    client = EventStreamClient(url="http://127.0.0.1:1/session/x/events", token="t", on_event=print)
    client.retry_ms = retry_ms
    client._failures = failures
    return client


def test_after_a_stream_that_opened_the_delay_is_exactly_retry():  # SC-11
    assert client_after(0)._delay_s() == 3.0


@pytest.mark.parametrize("failures", [1, 2, 3, 12])
def test_after_failures_the_delay_is_never_below_retry(failures):  # SC-11
    rng = random.Random(7)
    for _ in range(200):
        random.seed(rng.random())
        assert client_after(failures)._delay_s() >= 3.0


def test_after_failures_the_delay_grows_up_to_the_cap():  # SC-11
    random.seed(1)
    delays = [client_after(n)._delay_s() for n in (1, 2, 3, 20)]
    assert delays[0] <= 6.0
    assert delays[-1] <= 30.0
    assert max(delays) > 6.0
