"""The durable event log (sessions.backends.event_log): one file, one writer, group commit."""

from __future__ import annotations

import asyncio
import functools
import shutil
import sqlite3
import stat
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from sessions.backends.event_log import (
    RELEASE_SLICE,
    RELEASE_SLICE_BYTES,
    Append,
    EventLog,
    EventLogError,
    ForeignLogError,
    LogLockedError,
    Opened,
    OpenSession,
    StorageFullError,
)

pytestmark = pytest.mark.asyncio

WAIT_S = 5.0


def _open_op(session: str = "s", fresh_start: int = 1) -> OpenSession:
    return OpenSession(session, fresh_start, 100, 1 << 20, 100, 900.0)


async def _opened(log: EventLog, session: str = "s", fresh_start: int = 1) -> Opened:
    async with asyncio.timeout(WAIT_S):
        opened: Opened = await log.submit(_open_op(session, fresh_start))
    return opened


async def _append(log: EventLog, event_id: int, session: str = "s") -> Any:
    async with asyncio.timeout(WAIT_S):
        return await log.submit(Append(session, event_id, "note", b'{"v":1,"type":"note"}'))


def _log(path: Path, **options: Any) -> EventLog:
    log = EventLog(path, asyncio.get_running_loop(), deployment="d1", **options)
    log.open()
    return log


@pytest_asyncio.fixture
async def log(tmp_path: Path) -> AsyncIterator[EventLog]:
    opened = _log(tmp_path / "events.sqlite3", boot_id="boot-1")
    yield opened
    opened.close()


async def test_log_file_is_private_and_in_wal_mode(log: EventLog) -> None:
    assert stat.S_IMODE(log.path.stat().st_mode) == 0o600
    with sqlite3.connect(log.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_what_arrives_while_the_writer_waits_goes_into_one_commit(log: EventLog) -> None:
    await _opened(log)
    log.pause()
    futures = [log.submit(Append("s", n, "note", b"{}")) for n in range(1, 101)]
    log.resume()
    async with asyncio.timeout(WAIT_S):
        await asyncio.gather(*futures)
    assert log.stats.batch_sizes[-1] == 100


async def test_outcomes_arrive_in_submission_order_before_the_futures(log: EventLog) -> None:
    await _opened(log)
    seen: list[int] = []

    def noting(n: int) -> Callable[[Any, BaseException | None], None]:
        return lambda _result, _error: seen.append(n)

    futures = [log.submit(Append("s", n, "note", b"{}"), noting(n)) for n in range(1, 21)]
    async with asyncio.timeout(WAIT_S):
        await futures[0]
    assert seen == list(range(1, 21))


class Turns:
    """Counts loop turns: a task that adds one each time it runs (``asyncio.sleep(0)``)."""

    def __init__(self) -> None:
        self.now = 0
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            self.now += 1
            await asyncio.sleep(0)

    def stop(self) -> None:
        self._task.cancel()


def _slices(turns_seen: list[int]) -> list[int]:
    """How many outcomes came back in each loop turn, in order."""
    counts: dict[int, int] = {}
    for turn in turns_seen:
        counts[turn] = counts.get(turn, 0) + 1
    return list(counts.values())


class Handovers:
    """The log's loop, counting the outcomes the writer handed to it (its thread calls
    ``call_soon_threadsafe`` once per commit); everything else goes to the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.count = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loop, name)

    def call_soon_threadsafe(self, callback: Any, *args: Any) -> Any:
        handle = self.loop.call_soon_threadsafe(callback, *args)
        self.count += 1
        return handle


def _commit_while_the_loop_waits(
    log: EventLog,
    ops: list[list[Append]],
    seen: Callable[[Append], Callable[[Any, BaseException | None], None]],
    monkeypatch: pytest.MonkeyPatch,
) -> list[asyncio.Future[Any]]:
    """Submit each list of ``ops`` as one commit and hold the loop until the writer handed
    every commit's outcomes over (so they wait together); return the futures."""
    handovers = Handovers(log.loop)
    monkeypatch.setattr(log, "loop", handovers)
    futures = []
    deadline = time.monotonic() + WAIT_S
    for batch in ops:
        log.pause()
        futures += [log.submit(op, seen(op)) for op in batch]
        log.resume()
        expected = handovers.count + 1
        while handovers.count < expected:  # (the loop waits here: nothing is handed back)
            assert time.monotonic() < deadline, "the writer did not commit"
            time.sleep(0.001)
    return futures


async def test_a_large_commit_comes_back_a_slice_per_loop_turn_in_order(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 23: a commit of 10,000 events must not reach the bus in one callback.
    await _opened(log)
    turns = Turns()
    seen: list[tuple[int, int]] = []

    def noting(op: Append) -> Callable[[Any, BaseException | None], None]:
        return lambda _result, _error: seen.append((op.event_id, turns.now))

    first = [Append("s", n, "note", b"{}") for n in range(1, 601)]
    second = [Append("s", n, "note", b"{}") for n in range(601, 611)]
    futures = _commit_while_the_loop_waits(log, [first, second], noting, monkeypatch)
    async with asyncio.timeout(WAIT_S):
        await asyncio.gather(*futures)
    turns.stop()
    assert [n for n, _turn in seen] == list(range(1, 611))  # the second commit behind
    assert _slices([turn for _n, turn in seen]) == [RELEASE_SLICE, RELEASE_SLICE, 98]


async def test_a_slice_holds_at_most_its_bytes_plus_one_event(
    log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _opened(log)
    turns = Turns()
    seen: list[int] = []
    body = b"x" * (RELEASE_SLICE_BYTES // 3 + 1)  # three of them pass the slice's bytes
    ops = [Append("s", n, "note", body) for n in range(1, 9)]
    futures = _commit_while_the_loop_waits(
        log, [ops], lambda _op: lambda _result, _error: seen.append(turns.now), monkeypatch
    )
    async with asyncio.timeout(WAIT_S):
        await asyncio.gather(*futures)
    turns.stop()
    assert _slices(seen) == [3, 3, 2]


async def test_a_second_writer_is_refused_naming_the_file(log: EventLog) -> None:
    with pytest.raises(LogLockedError, match=str(log.path)):
        _log(log.path)


async def test_reopened_log_continues_the_epoch_with_its_events(tmp_path: Path) -> None:
    path = tmp_path / "events.sqlite3"
    first = _log(path, boot_id="boot-1")
    opened = await _opened(first, fresh_start=100_001)
    for n in range(100_001, 100_004):
        await _append(first, n)
    first.close()
    second = _log(path, boot_id="boot-1")
    again = await _opened(second, fresh_start=200_001)
    second.close()
    assert (again.epoch, again.next_id, again.new) == (opened.epoch, 100_004, False)
    assert [event[0] for event in again.events] == [100_001, 100_002, 100_003]


async def test_a_crash_before_a_new_boot_forks_a_new_epoch_above_every_id(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.sqlite3"
    first = _log(path, boot_id="boot-1")
    opened = await _opened(first)
    await _append(first, 1)
    crashed = tmp_path / "crashed.sqlite3"
    _copy_open_log(path, crashed)  # the files as a crash leaves them (no clean mark)
    first.close()
    rebooted = _log(crashed, boot_id="boot-2")
    again = await _opened(rebooted, fresh_start=100_001)
    rebooted.close()
    assert again.new
    assert again.epoch != opened.epoch
    assert again.next_id == 100_001
    assert [event[0] for event in again.events] == [1]  # what the log kept, carried over
    assert (again.gap, again.lineage) == ((1, 100_001), {opened.epoch: 1})


async def test_a_clean_stop_keeps_the_epoch_across_a_reboot(tmp_path: Path) -> None:
    path = tmp_path / "events.sqlite3"
    first = _log(path, boot_id="boot-1")
    opened = await _opened(first)
    first.close()
    rebooted = _log(path, boot_id="boot-2")
    again = await _opened(rebooted, fresh_start=100_001)
    rebooted.close()
    assert again.epoch == opened.epoch


async def test_a_failed_commit_fails_its_events_and_refuses_later_ids_until_rewound(
    log: EventLog,
) -> None:
    await _opened(log)
    await _append(log, 1)
    log.max_bytes = 1  # past the budget: appends fail as on a full disk
    with pytest.raises(StorageFullError):
        await _append(log, 2)
    log.max_bytes = 0
    assert not log.writable
    with pytest.raises(EventLogError, match="earlier event"):
        await _append(log, 3)  # a hole would follow 1
    await _append(log, 2)  # the caller rewound to the first failed id
    assert log.writable
    reopened = await _opened(log)
    assert [event[0] for event in reopened.events] == [1, 2]


async def test_an_unreadable_file_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "events.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ForeignLogError, match=str(path)):
        _log(path)


async def test_another_deployments_log_is_refused_or_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "events.sqlite3"
    _log(path).close()
    with pytest.raises(ForeignLogError, match="another deployment"):
        EventLog(path, asyncio.get_running_loop(), deployment="d2").open()
    fresh = EventLog(path, asyncio.get_running_loop(), deployment="d2", on_mismatch="new_epoch")
    fresh.open()
    opened = await _opened(fresh, fresh_start=100_001)
    fresh.close()
    assert opened.new
    assert opened.next_id == 100_001
    assert list(tmp_path.glob("events.sqlite3.foreign-*"))


async def test_a_torn_wal_forks_the_committed_prefix_into_a_new_epoch(tmp_path: Path) -> None:
    path = tmp_path / "events.sqlite3"
    first = _log(path, boot_id="boot-1")
    opened = await _opened(first)
    for n in range(1, 51):
        await _append(first, n)  # 50 commits, one per event
    crashed = tmp_path / "crashed.sqlite3"
    _copy_open_log(path, crashed)
    first.close()
    wal = Path(f"{crashed}-wal")
    wal.write_bytes(wal.read_bytes()[:-100])  # the last frame cut mid-record
    recovered = _log(crashed, boot_id="boot-1")
    again = await _opened(recovered, fresh_start=100_001)
    recovered.close()
    with sqlite3.connect(crashed) as conn:
        ids = [row[0] for row in conn.execute("SELECT id FROM events ORDER BY id")]
    assert ids == list(range(1, len(ids) + 1))  # a prefix of the commits, no hole
    assert len(ids) >= 49  # only the torn transaction is gone
    assert again.new
    assert again.epoch != opened.epoch
    assert again.next_id == 100_001  # above every id ever issued
    assert [event[0] for event in again.events] == ids  # the prefix, served in the new epoch
    assert again.gap == (ids[-1], 100_001)
    assert again.lineage == {opened.epoch: ids[-1]}


async def test_a_second_fork_keeps_the_lineage_and_carries_only_the_run_after_the_gap(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.sqlite3"
    first = _log(path, boot_id="boot-1")
    e1 = await _opened(first)
    await _append(first, 1)
    _copy_open_log(path, crashed := tmp_path / "crashed.sqlite3")
    first.close()
    second = _log(crashed, boot_id="boot-2")
    e2 = await _opened(second, fresh_start=101)  # forked at 1: its own ids from 101
    await _append(second, 101)
    _copy_open_log(crashed, again_crashed := tmp_path / "again.sqlite3")
    second.close()
    third = _log(again_crashed, boot_id="boot-3")
    e3 = await _opened(third, fresh_start=201)
    third.close()
    assert [event[0] for event in e3.events] == [101]
    assert e3.gap == (101, 201)
    assert e3.lineage == {e2.epoch: 101, e1.epoch: 1}


async def test_a_version_2_log_is_upgraded_in_place_and_keeps_its_sessions(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.sqlite3"
    with sqlite3.connect(path) as conn:  # what version 2 wrote: heads without a fork
        conn.executescript(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
            "CREATE TABLE heads (session_id TEXT PRIMARY KEY, epoch TEXT NOT NULL, "
            "epoch_start INTEGER NOT NULL, next_id INTEGER NOT NULL, "
            "generation INTEGER NOT NULL, closed_at REAL);"
            "INSERT INTO meta VALUES ('schema', '2'), ('deployment', 'd1'), ('clean', '1'),"
            " ('boot_id', 'boot-1'), ('generation', '0');"
            "INSERT INTO heads VALUES ('s', 'old-epoch', 1, 1, 0, NULL);"
        )
    upgraded = _log(path, boot_id="boot-1")
    opened = await _opened(upgraded)
    upgraded.close()
    assert (opened.epoch, opened.new, opened.gap) == ("old-epoch", False, None)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == ("3",)


def _copy_open_log(path: Path, to: Path) -> None:
    for suffix in ("", "-wal"):
        source = Path(f"{path}{suffix}")
        if source.exists():
            shutil.copyfile(source, f"{to}{suffix}")


async def test_a_trim_step_deletes_what_no_ring_replays_and_expired_closed_sessions(
    log: EventLog,
) -> None:
    await _opened(log, "kept")
    await _opened(log, "closed")
    for n in range(1, 11):
        await _append(log, n, "kept")
    async with asyncio.timeout(WAIT_S):
        await log.submit(Append("closed", 1, "session_closed", b"{}", closes=True))
    step = functools.partial(log.trim_step, keep_from={"kept": 8}, key_ttl_s=900.0)
    async with asyncio.timeout(WAIT_S):
        deleted = await log.submit(functools.partial(step, closed_before=0.0))
        assert deleted == 7  # the closed session is within CLOSED_HISTORY_S
        deleted = await log.submit(functools.partial(step, closed_before=time.time() + 1))
    assert deleted == 1
    with sqlite3.connect(log.path) as conn:
        rows = conn.execute("SELECT session_id, id FROM events ORDER BY id").fetchall()
        heads = [row[0] for row in conn.execute("SELECT session_id FROM heads")]
    assert rows == [("kept", 8), ("kept", 9), ("kept", 10)]
    assert heads == ["kept"]
    assert log.stats.rows == 3


async def test_a_session_trimmed_of_every_event_continues_its_ids_after_a_reopen(
    tmp_path: Path,
) -> None:
    # EB-1: ids are never reused. With no row left to read the last id from, the head
    # (advanced by the append trigger) is what carries it across the restart.
    path = tmp_path / "events.sqlite3"
    first = _log(path, boot_id="boot-1")
    opened = await _opened(first)
    for n in range(1, 11):
        await _append(first, n)
    step = functools.partial(first.trim_step, keep_from={"s": 11}, key_ttl_s=900.0)
    async with asyncio.timeout(WAIT_S):
        assert await first.submit(functools.partial(step, closed_before=0.0)) == 10
    first.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM events").fetchone() == (0,)
    second = _log(path, boot_id="boot-1")
    again = await _opened(second)
    assert (again.epoch, again.next_id, again.new, again.events) == (opened.epoch, 11, False, [])
    await _append(second, 11)
    second.close()
    third = _log(path, boot_id="boot-1")
    last = await _opened(third)
    third.close()
    assert (last.next_id, [event[0] for event in last.events]) == (12, [11])
