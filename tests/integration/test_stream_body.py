"""``GET /session/<id>/events`` through the real ASGI application: what the stream writes
(the pump, ``sessions/transport/pump.py``): the body (EB-18), a client that stops reading
(EB-4, EB-5), a failing pump (EB-19), a client that disconnects (EB-20) and a session
closed while streaming.

Protocol: ``docs/protocol.md``, "The stream"; comments name its sections in quotes.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from sessions.wire import FrameEncoder
from tests.integration.conftest import (
    burst,
    close,
    ids_of,
    live_bus,
    load,
    publish,
    publish_many,
    records,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


# -- EB-4, EB-5 through the route: a client that stops reading ----------------------------


@pytest.mark.usefixtures("strict_caps")
async def test_client_that_stops_reading_is_warned_then_evicted_and_the_body_ends(
    make_session, stream_of
):
    # EB-4, EB-5 (the pump is held off by publishing without yielding)
    sid = await make_session()
    stream = await stream_of(sid, query="maxQueued=16")
    await burst(sid, 40)
    await stream.read_to_end()
    assert stream.types[-1] == "client_evicted"
    assert "slow_client_warning" in stream.types
    evicted = stream.frames[-1]["data"]
    delivered = ids_of(stream.frames)
    assert delivered == list(range(1, len(delivered) + 1))
    assert evicted["reason"] == "queue_overflow"
    assert evicted["droppedAfter"] == delivered[-1] + 1
    assert live_bus(sid).subscriber_count == 0


# -- EB-18: body ---------------------------------------------------------------------------


async def test_first_body_chunk_is_retry_3000_before_any_event(make_session, stream_of):
    # EB-18
    sid = await make_session()
    stream = await stream_of(sid)
    assert await stream.read_chunk() == b"retry: 3000\n\n"
    assert not stream.ended


async def test_published_event_reaches_the_open_stream_at_once(make_session, stream_of):
    # EB-18: nothing is held until the stream ends
    sid = await make_session()
    stream = await stream_of(sid)
    response = await publish(sid, {"type": "progress", "data": {"pct": 50}})
    frame = await stream.read_until_type("progress")
    assert frame["id"] == response.json()["id"] == 1
    assert frame["data"] == {"pct": 50}
    assert not stream.ended


async def test_only_real_events_carry_an_id_line(make_session, stream_of):
    # EB-18
    sid = await make_session()
    await publish_many(sid, 1)
    stream = await stream_of(sid, headers={"last-event-id": "0"})
    await publish(sid, {"type": "live"})
    await stream.read_until_type("live")
    blocks = stream.blocks()
    assert blocks[0] == ["retry: 3000"]
    assert blocks[1][:2] == ["id: 1", "event: step"]
    assert blocks[3][:2] == ["id: 2", "event: live"]
    assert blocks[2][0] == "event: replay_complete"
    assert len(blocks[2]) == 2


async def test_frames_are_written_as_compact_json_of_the_whole_envelope(make_session, stream_of):
    # EB-18, "Frames"
    sid = await make_session()
    stream = await stream_of(sid)
    await publish(sid, {"type": "t", "data": {"a": "é"}, "originatorClientId": "c1"})
    frame = await stream.read_until_type("t")
    assert list(frame) == ["id", "v", "type", "data", "_meta", "originatorClientId"]
    assert 'data: {"id":1,"v":1,"type":"t","data":{"a":"é"},' in stream.body.decode()


async def test_synthetic_frames_get_a_server_timestamp_at_write_time(make_session, stream_of):
    # EB-18
    sid = await make_session()
    before = time.time_ns() // 1_000_000
    stream = await stream_of(sid, headers={"last-event-id": "0"})
    frame = await stream.read_until_type("replay_complete")
    assert "id" not in frame
    assert frame["v"] == 1
    assert before <= frame["_meta"]["serverTimestamp"] <= time.time_ns() // 1_000_000


async def test_idle_stream_writes_heartbeat_comments(make_session, stream_of, qwenweb_settings):
    # EB-18
    qwenweb_settings(HEARTBEAT_INTERVAL_S=0.05)
    sid = await make_session()
    stream = await stream_of(sid)
    await stream.read_until(lambda s: len(s.comments) >= 2)
    assert stream.comments == ["heartbeat", "heartbeat"]
    assert stream.events == []
    assert stream.chunks[1:] == [b": heartbeat\n\n"] * 2
    assert not stream.ended


# -- EB-19: the pump fails ----------------------------------------------------------------


@pytest.fixture
def encode_fails_on_explode(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the route's frame encoder raise for frames of type ``explode`` (EB-19)."""
    encode = FrameEncoder.event

    def failing_encode(self, frame):
        if frame.type == "explode":
            raise RuntimeError("cannot encode this frame")
        return encode(self, frame)

    monkeypatch.setattr(FrameEncoder, "event", failing_encode)


@pytest.mark.usefixtures("encode_fails_on_explode")
async def test_pump_failure_writes_one_stream_error_and_ends_the_body(
    make_session, stream_of, logs
):
    # EB-19
    sid = await make_session()
    stream = await stream_of(sid)
    await publish(sid, {"type": "explode"})
    await stream.read_to_end()
    assert stream.types == ["stream_error"]
    assert list(stream.frames[0]["data"]) == ["error"]
    assert isinstance(stream.frames[0]["data"]["error"], str)
    assert len(records(logs, "stream_error")) == 1
    assert live_bus(sid).subscriber_count == 0


# -- EB-20: client disconnect --------------------------------------------------------------


async def test_disconnect_removes_the_subscriber_within_one_second(make_session, stream_of, logs):
    # EB-20
    sid = await make_session()
    stream = await stream_of(sid)
    assert (await load(sid)).json()["subscriberCount"] == 1
    async with asyncio.timeout(1):
        await stream.disconnect()  # returns once the application has returned
    assert stream.done
    assert live_bus(sid).subscriber_count == 0
    assert (await load(sid)).json()["subscriberCount"] == 0
    assert [r for r in logs.records if r.levelname in ("ERROR", "CRITICAL")] == []


async def test_disconnect_while_frames_are_queued_removes_the_subscriber(make_session, stream_of):
    # EB-20, EB-8
    sid = await make_session()
    stream = await stream_of(sid)
    await burst(sid, 50)
    async with asyncio.timeout(1):
        await stream.disconnect()
    assert live_bus(sid).subscriber_count == 0


# -- session close while streaming ---------------------------------------------------------


async def test_closing_the_session_sends_session_closed_then_ends_the_body(make_session, stream_of):
    # "Endpoints", POST /session/<id>/close, EB-9
    sid = await make_session()
    stream = await stream_of(sid)
    assert (await close(sid)).status == 200
    closed = await stream.read_until_type("session_closed")
    await stream.read_to_end()
    assert closed["id"] == 1
    assert stream.types == ["session_closed"]
    assert stream.ended
    async with asyncio.timeout(1):
        await stream.communicator.wait(1)


async def test_stream_after_close_is_204(make_session, stream_of):
    # EB-15
    sid = await make_session()
    await close(sid)
    stream = await (await stream_of(sid)).read_to_end()
    assert stream.status == 204
    assert stream.body == b""
