"""The batched recorder (``sessions.ops.records``) with a fake writer: memory only, no database.

Every wait is bounded by ``asyncio.timeout``; the writer is an ``asyncio`` fake that
records each batch (and can be told to fail or to block).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from django.utils import timezone

from sessions.bus import Frame, synthetic_frame
from sessions.hooks import ConnectionInfo
from sessions.ops.records import Batch, ConnectionRecord, Recorder

pytestmark = pytest.mark.asyncio

WARNING = synthetic_frame(
    "slow_client_warning",
    {"queueSize": 12, "maxQueued": 16, "lastEventId": 40, "threshold": "frames"},
)
EVICTED = synthetic_frame("client_evicted", {"reason": "queue_overflow", "droppedAfter": 57})
NOTE = Frame({"id": 1, "v": 1, "type": "note", "data": {}}, b'{"id":1,"v":1,"type":"note"}')


def write(record: ConnectionRecord, frame: Frame, wire_bytes: int | None = None) -> bytes:
    """Tell ``record`` that ``frame`` was written as the route writes it; return the payload
    (the JSON of its ``data:`` line). ``wire_bytes`` pads the wire to that length."""
    payload = json.dumps({**dict(frame), "_meta": {"serverTimestamp": 1}}).encode()
    wire = b"event: " + frame.type.encode() + b"\ndata: " + payload + b"\n\n"
    if wire_bytes is not None:
        wire = wire.ljust(wire_bytes, b" ")
    record.frames_written((frame,), (wire,), (payload,), len(wire))
    return payload


class FakeWriter:
    """Collects every batch; ``fail`` makes the next writes raise, ``gate`` holds them."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.fail = False
        self.gate: asyncio.Event | None = None
        self.written = asyncio.Event()
        self.entered = asyncio.Event()  # a write has the batch (it may wait at the gate)

    async def __call__(self, batch: Batch) -> None:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise RuntimeError("database is down")
        self.batches.append(batch)
        self.written.set()

    def connections(self) -> list[dict[str, Any]]:
        return [row for batch in self.batches for row in batch.connections]

    def incidents(self) -> list[dict[str, Any]]:
        return [row for batch in self.batches for row in batch.incidents]

    def counters(self) -> list[tuple[uuid.UUID, int, int]]:
        return [row for batch in self.batches for row in batch.counters]


def open_record(recorder: Recorder, session_id: str = "s-1") -> ConnectionRecord:
    info = ConnectionInfo(
        id=uuid.uuid4(),
        session_id=session_id,
        auth="token",
        user_id=None,
        subject="tester",
        client_addr="127.0.0.1",
        user_agent="ua",
        client_id="tab-1",
        max_queued=16,
        resumed_from=None,
    )
    record = ConnectionRecord(info, opened_at=timezone.now(), recorder=recorder)
    recorder.opened(record)
    return record


@pytest.fixture
def writer() -> FakeWriter:
    return FakeWriter()


@pytest.fixture
def recorder(writer: FakeWriter) -> Recorder:
    return Recorder(writer=writer, flush_interval_s=3600, batch_size=1000)


# -- the hot side: memory only -------------------------------------------------------------


async def test_frames_and_bytes_are_counted_without_writing(recorder, writer):
    record = open_record(recorder)
    record.bytes_written(13)
    for _ in range(3):
        write(record, NOTE, wire_bytes=100)
    assert (record.frames_sent, record.bytes_sent) == (3, 313)
    assert writer.batches == []
    assert recorder.pending == 1  # one connection changed, not one change per frame


async def test_warning_and_eviction_frames_become_incidents_with_exact_payloads(recorder, writer):
    record = open_record(recorder)
    write(record, WARNING)
    evicted_payload = write(record, EVICTED)
    record.closed("client_evicted")
    await recorder.flush()
    warning, evicted = writer.incidents()
    assert (warning["kind"], warning["reason"], warning["event_id"]) == (
        "slow_client_warning",
        "frames",
        40,
    )
    assert (evicted["kind"], evicted["reason"], evicted["event_id"]) == (
        "client_evicted",
        "queue_overflow",
        57,
    )
    assert evicted["payload"] == evicted_payload.decode()
    (row,) = writer.connections()
    assert (row["end_reason"], row["end_detail"]) == ("client_evicted", "queue_overflow")
    assert json.loads(row["end_payload"])["data"]["droppedAfter"] == 57


async def test_closed_is_recorded_once_first_reason_wins(recorder, writer):
    record = open_record(recorder)
    record.closed("client_disconnect")
    record.closed("server_shutdown")
    await recorder.flush()
    (row,) = writer.connections()
    assert row["end_reason"] == "client_disconnect"
    assert row["closed_at"] is not None
    assert recorder.open_connections == 0


async def test_eviction_whose_frame_was_never_written_says_so(recorder, writer):
    record = open_record(recorder)
    record.closed("client_evicted")
    await recorder.flush()
    assert writer.connections()[0]["end_detail"] == "client_evicted frame never written"
    assert writer.incidents() == []


# -- batching -----------------------------------------------------------------------------


async def test_flush_writes_one_batch_and_empties_the_queue(recorder, writer):
    first, second = open_record(recorder), open_record(recorder)
    write(first, NOTE)
    assert await recorder.flush() == 2
    assert {row["id"] for row in writer.connections()} == {first.id, second.id}
    assert recorder.pending == 0
    assert await recorder.flush() == 0
    assert len(writer.batches) == 1


async def test_an_open_connection_is_written_again_when_it_changes(recorder, writer):
    record = open_record(recorder)
    await recorder.flush()
    write(record, NOTE, wire_bytes=100)
    await recorder.flush()
    # The whole row once; then only its counters (the row is written already).
    assert [row["frames_sent"] for row in writer.connections()] == [0]
    assert writer.counters() == [(record.id, 1, 100)]
    record.closed("client_disconnect")
    await recorder.flush()
    # Its end changes more than the counters: the whole row again, final counters in it.
    assert [(row["frames_sent"], row["end_reason"]) for row in writer.connections()] == [
        (0, ""),
        (1, "client_disconnect"),
    ]
    assert len(writer.counters()) == 1


async def test_a_full_batch_wakes_the_writer_at_once(writer):
    recorder = Recorder(writer=writer, flush_interval_s=3600, batch_size=3)
    recorder.start(asyncio.get_running_loop())
    for _ in range(3):
        open_record(recorder)
    async with asyncio.timeout(2):
        await writer.written.wait()
    assert len(writer.connections()) == 3
    recorder.discard()


async def test_counters_alone_never_fill_the_batch(writer):
    recorder = Recorder(writer=writer, flush_interval_s=3600, batch_size=3)
    records = [open_record(recorder) for _ in range(2)]
    assert await recorder.flush() == 2
    recorder.start(asyncio.get_running_loop())
    for _ in range(5):
        for record in records:
            write(record, NOTE)
    assert recorder.pending == 2  # one entry per open connection, however many sends
    third = open_record(recorder)  # a row to insert: with the counters, not yet 3 rows
    assert recorder.pending == 3
    assert recorder._wake is not None
    assert not recorder._wake.is_set()  # the writer was not woken early
    write(third, NOTE)
    open_record(recorder)  # two rows to insert, and a third: the batch is full
    open_record(recorder)
    async with asyncio.timeout(2):
        while len(writer.batches) < 2:
            writer.written.clear()
            await writer.written.wait()
    last = writer.batches[1]
    assert len(last.connections) == 3
    assert sorted(frames for _, frames, _ in last.counters) == [5, 5]
    recorder.discard()


async def test_counters_of_a_failed_write_are_put_back_and_not_written_twice(recorder, writer):
    record = open_record(recorder)
    await recorder.flush()
    write(record, NOTE, wire_bytes=100)
    writer.fail = True
    assert await recorder.flush() == 0
    assert recorder.pending == 1
    write(record, NOTE, wire_bytes=100)  # changed again meanwhile: one entry, newest values
    writer.fail = False
    assert await recorder.flush() == 1
    assert writer.counters() == [(record.id, 2, 200)]


async def test_counters_moved_after_a_close_survive_a_failed_write(recorder, writer):
    # drain(): close_all() closes a stream still running and the flush writes its closed
    # row; the stream then writes a heartbeat before it ends, and the next write fails.
    record = open_record(recorder)
    recorder.close_all("server_shutdown", "open at shutdown")
    assert await recorder.flush() == 1
    record.bytes_written(7)
    writer.fail = True
    assert await recorder.flush() == 0
    assert recorder.pending == 1
    writer.fail = False
    assert await recorder.flush() == 1
    assert writer.connections()[-1]["bytes_sent"] == 7


async def test_counters_moved_while_a_closed_row_is_put_back_are_written(recorder, writer):
    record = open_record(recorder)
    recorder.close_all("server_shutdown", "open at shutdown")
    writer.fail = True
    assert await recorder.flush() == 0  # the closed row is put back as it was
    record.bytes_written(7)
    writer.fail = False
    assert await recorder.flush() == 1
    assert writer.connections()[-1]["bytes_sent"] == 7


async def test_a_whole_row_in_flight_then_counters_writes_the_whole_row_again(recorder, writer):
    record = open_record(recorder)
    writer.gate = asyncio.Event()
    flushing = asyncio.create_task(recorder.flush())
    async with asyncio.timeout(2):  # the flush took the batch and waits in the writer
        await writer.entered.wait()
    write(record, NOTE)
    writer.gate.set()
    await flushing
    writer.gate = None
    assert not record.row_written  # a newer whole row is pending
    await recorder.flush()
    assert [row["frames_sent"] for row in writer.connections()] == [0, 1]
    assert writer.counters() == []


async def test_the_timer_flushes_what_is_pending(writer):
    recorder = Recorder(writer=writer, flush_interval_s=0.01, batch_size=1000)
    recorder.start(asyncio.get_running_loop())
    open_record(recorder)
    async with asyncio.timeout(2):
        await writer.written.wait()
    assert len(writer.connections()) == 1
    recorder.discard()


async def test_a_failed_write_is_put_back_and_written_next_time(recorder, writer, caplog):
    record = open_record(recorder)
    write(record, WARNING)
    writer.fail = True
    assert await recorder.flush() == 0
    assert recorder.pending == 2
    writer.fail = False
    assert await recorder.flush() == 2
    assert len(writer.incidents()) == 1
    assert writer.connections()[0]["id"] == record.id


async def test_a_closed_record_put_back_keeps_its_final_state(recorder, writer):
    record = open_record(recorder)
    record.closed("client_disconnect")
    writer.fail = True
    await recorder.flush()
    writer.fail = False
    await recorder.flush()
    assert writer.connections()[0]["end_reason"] == "client_disconnect"


async def test_a_cancelled_write_is_put_back(recorder, writer):
    open_record(recorder)
    writer.gate = asyncio.Event()
    flushing = asyncio.create_task(recorder.flush())
    async with asyncio.timeout(2):  # the flush took the batch and waits in the writer
        await writer.entered.wait()
    flushing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await flushing
    assert recorder.pending == 1
    writer.gate = None
    assert await recorder.flush() == 1


# -- shutdown -----------------------------------------------------------------------------


async def test_drain_waits_for_streams_to_record_their_end(writer):
    recorder = Recorder(writer=writer, flush_interval_s=3600, batch_size=1000)
    recorder.start(asyncio.get_running_loop())
    record = open_record(recorder)
    draining = asyncio.create_task(recorder.drain(timeout_s=5))
    await asyncio.sleep(0)  # one step: drain waits for the open connection
    assert not draining.done()
    record.closed("server_shutdown")
    async with asyncio.timeout(2):
        assert await draining == 1
    assert writer.connections()[0]["end_reason"] == "server_shutdown"
    recorder.discard()


async def test_drain_closes_what_is_still_open_after_the_timeout(writer):
    recorder = Recorder(writer=writer, flush_interval_s=3600, batch_size=1000)
    recorder.start(asyncio.get_running_loop())
    open_record(recorder)
    async with asyncio.timeout(2):
        await recorder.drain(timeout_s=0.01)
    (row,) = writer.connections()
    assert (row["end_reason"], row["end_detail"]) == ("server_shutdown", "open at shutdown")
    recorder.discard()


async def test_discard_forgets_everything_pending(recorder):
    open_record(recorder)
    recorder.discard()
    assert (recorder.pending, recorder.open_connections) == (0, 0)
