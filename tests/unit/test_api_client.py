"""The terminal client's reconnection delays (SC-11), without a server."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

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


def client_with_token_source(
    source: Callable[[], str], statuses: list[str], **options: Any
) -> EventStreamClient:
    """A client holding the token ``old`` whose ``refresh_token`` is ``source``."""
    return EventStreamClient(
        url="http://127.0.0.1:1/session/x/events",
        token="old",
        on_event=print,
        on_status=statuses.append,
        refresh_token=source,
        **options,
    )


def test_a_rejected_token_waits_for_the_token_source_to_give_a_new_one():  # SC-10
    # The token file is rewritten a moment after the revocation reached the stream: the
    # first two reads still give the revoked token, which is never sent again.
    reads = iter(["old", "old", "new"])
    statuses: list[str] = []
    client = client_with_token_source(lambda: next(reads), statuses)
    assert client._renew_token("token_revoked")
    assert client.token == "new"
    assert statuses == [
        "token_revoked: waiting up to 10 s for a new token",
        "token_revoked: retrying with a fresh token",
    ]


def test_a_token_source_that_keeps_the_rejected_token_stops_after_the_wait():  # SC-10
    statuses: list[str] = []
    client = client_with_token_source(lambda: "old", statuses, refresh_wait_s=0.5)
    assert not client._renew_token("401")
    assert client.token == "old"
    assert statuses[-1] == "401: no new token to retry with"
