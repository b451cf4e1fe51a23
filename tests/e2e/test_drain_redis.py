"""Graceful drain across two real processes under Redis (issue 16, "Done when").

Two ``python -m qwenweb.serve`` processes share one Redis key prefix and one SQLite file.
20 raw-socket clients stream a session from process A while events are published
through B; A gets SIGTERM. Every client must see its stream end with ``stream_error``
``server_draining`` and a jittered ``retry:``, reconnect to B after that ``retry`` with
its cursor, and end up with every published event exactly once, in order; the ends are
spread over ``DRAIN_S`` instead of arriving at once. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.server import (
    RawSSEClient,
    RemoteSession,
    ServerProcess,
    event_ids,
    open_stream,
    redis_cluster,
    request_json,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.own_backend, pytest.mark.asyncio]

CLIENTS = 20
DRAIN_S = 4.0
WAIT_S = 30.0


@pytest.fixture
def start_server(e2e_database: Path, tmp_path: Path) -> Iterator[Callable[[str], ServerProcess]]:
    with redis_cluster(e2e_database, tmp_path, QWENWEB_DRAIN_S=str(DRAIN_S)) as cluster:
        yield cluster


@dataclass
class Client:
    """One subscriber: its first stream on A, then (after the drain) one on B."""

    ids: list[int] = field(default_factory=list)
    connected: asyncio.Event = field(default_factory=asyncio.Event)
    ended_at: float = 0.0
    reconnected_at: float = 0.0
    retry_ms: int = 0
    code: str = ""


def _last_retry(body: bytes | bytearray) -> int:
    values = re.findall(rb"^retry: (\d+)$", bytes(body), re.MULTILINE)
    return int(values[-1])


async def _follow(
    client: Client,
    a: ServerProcess,
    b: ServerProcess,
    session: RemoteSession,
    last_id: Callable[[], Awaitable[int]],
) -> None:
    stream = await open_stream(a.port, session.events_path, session.read_token)
    assert stream.status == 200
    client.connected.set()
    await stream.read_to_end(timeout_s=WAIT_S)
    client.ended_at = time.monotonic()
    client.ids += event_ids(stream.events)
    final = json.loads(stream.events[-1].data)
    client.code = final["data"].get("code", "")
    client.retry_ms = _last_retry(stream.body)
    epoch = stream.response_headers["x-event-epoch"]
    stream.close()
    await asyncio.sleep(client.retry_ms / 1000)  # what a client does: wait `retry`, reconnect
    client.reconnected_at = time.monotonic()
    headers = [("Last-Event-ID", str(client.ids[-1])), ("X-Event-Epoch", epoch)]
    resumed: RawSSEClient = await open_stream(
        b.port, session.events_path, session.read_token, headers
    )
    assert resumed.status == 200
    target = await last_id()
    await resumed.read_until(
        lambda events: bool(event_ids(events)) and event_ids(events)[-1] >= target,
        timeout_s=WAIT_S,
    )
    client.ids += event_ids(resumed.events)
    resumed.close()


async def test_sigterm_drains_streams_onto_the_other_process_spread_without_loss(start_server):
    a, b = start_server("a"), start_server("b")
    session = RemoteSession.create(b.base_url)
    published: list[int] = []
    stop_publishing = asyncio.Event()
    published_all = asyncio.Event()

    def publish_one(n: int) -> int:
        status, body = request_json(
            "POST", f"{b.base_url}{session.events_path}", {"type": "tick", "data": n},
            token=session.publish_token,
        )  # fmt: skip
        assert status == 200, body
        return int(body["id"])

    async def publisher() -> None:
        n = 0
        while not stop_publishing.is_set() and n < 2000:
            published.append(await asyncio.to_thread(publish_one, n))
            n += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop_publishing.wait(), 0.05)
        published_all.set()

    async def last_id() -> int:
        await published_all.wait()  # (bounded by the test's timeout)
        return published[-1]

    clients = [Client() for _ in range(CLIENTS)]
    followers = [asyncio.ensure_future(_follow(c, a, b, session, last_id)) for c in clients]
    async with asyncio.timeout(WAIT_S):
        await asyncio.gather(*(c.connected.wait() for c in clients))
    publishing = asyncio.ensure_future(publisher())
    async with asyncio.timeout(WAIT_S):
        while len(published) < 10:
            await asyncio.sleep(0.05)
    assert a.process is not None
    sigterm_at = time.monotonic()
    a.process.send_signal(signal.SIGTERM)
    # Readiness turns 503 while A still listens and drains (the load balancer's cue).
    readiness = await asyncio.to_thread(
        wait_for, lambda: request_json("GET", f"{a.base_url}/readyz")[0] == 503, DRAIN_S
    )
    assert readiness
    async with asyncio.timeout(WAIT_S + DRAIN_S):
        while not all(c.reconnected_at for c in clients):
            await asyncio.sleep(0.05)
        mark = len(published)  # a few more events after the last reconnect
        while len(published) < mark + 5:
            await asyncio.sleep(0.05)
        stop_publishing.set()
        await publishing
        await asyncio.gather(*followers)
    a.process.wait(timeout=WAIT_S)

    expected = list(range(published[0], published[-1] + 1))
    for client in clients:
        assert client.code == "server_draining"
        assert 1000 <= client.retry_ms <= 3000
        lost = sorted(set(expected) - set(client.ids))
        duplicated = len(client.ids) - len(set(client.ids))
        assert (lost, duplicated) == ([], 0)
        assert client.ids == expected  # in order, nothing else
    ends = sorted(c.ended_at - sigterm_at for c in clients)
    reconnects = sorted(c.reconnected_at - sigterm_at for c in clients)
    spread = ends[-1] - ends[0]
    busiest = max(sum(1 for t in ends if lo <= t < lo + DRAIN_S / 10) for lo in ends)
    print(
        f"drain: {CLIENTS} streams ended over {spread:.2f} s of a {DRAIN_S:g} s window "
        f"(first {ends[0]:.2f} s, last {ends[-1]:.2f} s after SIGTERM); reconnects "
        f"{reconnects[0]:.2f} … {reconnects[-1]:.2f} s; at most {busiest} ends in any "
        f"{DRAIN_S / 10:g} s"
    )
    assert spread >= DRAIN_S / 2
    assert busiest <= CLIENTS // 2
    assert "drain_started streams=20" in a.log()
