"""The token version cache (sessions.token_versions): concurrent misses share one read,
and an invalidation during a read keeps that read's answer out of the cache
(docs/protocol.md, "Revocation": no revoked token is accepted once the revocation
returned in the process that revoked).

Tasks created before ``wait_started`` have all reached their await when it returns: the
loop runs them (first in its ready queue) before the worker thread's answer comes back.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Iterator

import pytest
from asgiref.sync import sync_to_async

from sessions import token_versions

pytestmark = pytest.mark.asyncio

DEADLINE_S = 5.0


class GatedReads:
    """Stands in for ``read_sessions_sync``: each read waits for :meth:`release` and
    answers the version given then; ``started`` counts the reads."""

    def __init__(self) -> None:
        self.started = 0
        self._gates: list[tuple[threading.Event, list[int]]] = []
        self._lock = threading.Lock()
        self.begun = threading.Semaphore(0)

    def __call__(self, session_ids: Iterable[str]) -> dict[str, int | None]:
        gate, answer = threading.Event(), [0]
        with self._lock:
            self.started += 1
            self._gates.append((gate, answer))
        self.begun.release()
        assert gate.wait(DEADLINE_S), "the test never released this read"
        return dict.fromkeys(session_ids, answer[0])

    async def wait_started(self) -> None:
        assert await asyncio.to_thread(self.begun.acquire, timeout=DEADLINE_S)

    def release(self, index: int, version: int) -> None:
        gate, answer = self._gates[index]
        answer[0] = version
        gate.set()


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[GatedReads]:
    fake = GatedReads()
    monkeypatch.setattr(token_versions, "read_sessions_sync", fake)
    # Each read in a thread of its own: the process's one database thread may be busy
    # with an earlier test's leftovers, and what is tested here is who reads, not where.
    monkeypatch.setattr(
        token_versions,
        "database_sync_to_async",
        lambda read: sync_to_async(read, thread_sensitive=False),
    )
    token_versions.clear_cache()
    yield fake
    for index in range(len(fake._gates)):  # (never leave a worker thread waiting)
        fake.release(index, 0)
    token_versions.clear_cache()


async def version_of(session_id: str) -> int | None:
    return (await token_versions.current_versions(None, session_id))[1]


async def test_concurrent_misses_of_one_session_share_one_read(reads: GatedReads) -> None:
    waiters = [asyncio.create_task(version_of("s1")) for _ in range(20)]
    await reads.wait_started()
    reads.release(0, 3)
    assert await asyncio.wait_for(asyncio.gather(*waiters), DEADLINE_S) == [3] * 20
    assert reads.started == 1
    assert await version_of("s1") == 3  # cached: no second read
    assert reads.started == 1


async def test_an_invalidation_during_a_read_starts_a_new_read_and_keeps_the_old_answer_out(
    reads: GatedReads,
) -> None:
    before = asyncio.create_task(version_of("s1"))
    await reads.wait_started()
    token_versions.invalidate(session_id="s1")  # (a revocation while the read runs)
    after = asyncio.create_task(version_of("s1"))
    reads.release(0, 4)
    assert await asyncio.wait_for(before, DEADLINE_S) == 4
    await reads.wait_started()
    assert reads.started == 2
    reads.release(1, 5)
    assert await asyncio.wait_for(after, DEADLINE_S) == 5
    assert await version_of("s1") == 5  # the older answer was never cached
    assert reads.started == 2


async def test_a_cancelled_caller_leaves_the_shared_read_to_the_others(
    reads: GatedReads,
) -> None:
    first = asyncio.create_task(version_of("s1"))
    second = asyncio.create_task(version_of("s1"))
    await reads.wait_started()  # (both wait on the one read now)
    first.cancel()
    reads.release(0, 7)
    assert await asyncio.wait_for(second, DEADLINE_S) == 7
    with pytest.raises(asyncio.CancelledError):
        await first
    assert reads.started == 1


async def test_the_sweep_caches_nothing_it_read_before_a_revocation(reads: GatedReads) -> None:
    # The revocation sweep reads every watched session's version, then caches them: a
    # revocation landing during that read must not leave the older version cached.
    read_since = token_versions.generation()
    token_versions.invalidate(session_id="s1")  # (a revocation while the sweep reads)
    token_versions.remember({}, {"s1": 28}, read_since=read_since)
    version = asyncio.create_task(version_of("s1"))
    await reads.wait_started()  # a cache miss: the check reads the version again
    reads.release(0, 29)
    assert await asyncio.wait_for(version, DEADLINE_S) == 29
    token_versions.remember({}, {"s2": 3}, read_since=token_versions.generation())
    assert await version_of("s2") == 3  # no revocation since: cached, no read
    assert reads.started == 1
