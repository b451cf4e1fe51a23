"""Operator records written from real streams through the ASGI application.

Each test drives ``GET /session/<id>/events`` with ``ApplicationCommunicator``, then
writes the recorder's batch explicitly (``records.recorder.flush()``: the timed writer is
not started in the in-process tests) and reads the rows. The bytes and payloads recorded
are compared with what the test client actually received.
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.core.management import call_command
from django.utils import timezone

from sessions.auth import issue_token
from sessions.backends import get_backend
from sessions.models import AgentSession, SubscriberConnection, SubscriberIncident
from sessions.ops import lifecycle, records
from sessions.ops.records import Batch, write_batch
from sessions.wire import FrameEncoder
from tests.integration.conftest import (
    WAIT_S,
    bearer,
    burst,
    close,
    live_bus,
    login_cookie,
    publish,
    publish_many,
)
from tests.integration.conftest import records as log_records

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def rows(session_id: str) -> list[SubscriberConnection]:
    """Write the pending batch, then return the session's connection rows, oldest first."""
    await records.recorder.flush()
    return [
        row
        async for row in SubscriberConnection.objects.filter(session_id=session_id).order_by(
            "opened_at"
        )
    ]


async def incidents(session_id: str) -> list[SubscriberIncident]:
    await records.recorder.flush()
    return [
        row async for row in SubscriberIncident.objects.filter(session_id=session_id).order_by("at")
    ]


def event_data(stream: Any, event_type: str) -> str:
    """The exact ``data`` the client received for the first event of ``event_type``."""
    return next(event.data for event in stream.events if event.type == event_type)


# -- one row per connection: who, from where, how much, how it ended ------------------------


async def test_connection_row_has_who_where_and_exactly_the_bytes_the_client_received(
    make_session, stream_of
):
    sid = await make_session()
    token = issue_token(sid, ["read"], "agent-ui")
    headers = {"user-agent": "pytest-ua/1", "x-client-id": "tab-7", "last-event-id": "0"}
    stream = await stream_of(sid, token, headers=headers, query="maxQueued=32")
    await publish_many(sid, 2)
    await stream.read_until(lambda s: len(s.events) == 3)  # replay_complete + 2 events
    await stream.disconnect()
    (row,) = await rows(sid)
    assert (row.auth, row.subject, row.client_addr) == ("token", "agent-ui", "127.0.0.1")
    assert (row.user_agent, row.client_id, row.max_queued, row.resumed_from) == (
        "pytest-ua/1",
        "tab-7",
        32,
        0,
    )
    assert (row.frames_sent, row.bytes_sent) == (3, len(stream.body))
    assert (row.end_reason, row.end_payload) == ("client_disconnect", "")
    assert row.closed_at is not None
    assert row.closed_at >= row.opened_at


async def test_login_stream_records_the_user(make_session, make_user, open_stream):
    owner = await make_user("alice")
    sid = await make_session(owner=owner)
    stream = await open_stream(f"/session/{sid}/events", {"cookie": await login_cookie(owner)})
    await stream.read_chunk()  # retry
    await stream.disconnect()
    (row,) = await rows(sid)
    assert (row.auth, row.user_id, row.subject) == ("login", owner.pk, "alice")


async def test_open_connection_is_written_with_its_counts_so_far(make_session, stream_of):
    sid = await make_session()
    stream = await stream_of(sid)
    await publish_many(sid, 1)
    await stream.read_until(lambda s: len(s.events) == 1)
    (row,) = await rows(sid)
    assert (row.closed_at, row.end_reason, row.frames_sent) == (None, "", 1)


# -- warnings and evictions: the exact payload the client received ----------------------------


@pytest.mark.usefixtures("strict_caps")
async def test_eviction_is_recorded_with_the_exact_payloads_the_client_received(
    make_session, stream_of
):
    # EB-4, EB-5: a subscriber whose pump cannot run while 40 events are published
    sid = await make_session()
    stream = await stream_of(sid, query="maxQueued=16")
    await burst(sid, 40)
    await stream.read_to_end()
    warning, evicted = await incidents(sid)
    assert (warning.kind, warning.payload) == (
        "slow_client_warning",
        event_data(stream, "slow_client_warning"),
    )
    assert (evicted.kind, evicted.payload) == (
        "client_evicted",
        event_data(stream, "client_evicted"),
    )
    data = json.loads(evicted.payload)["data"]
    assert (evicted.reason, evicted.event_id) == (data["reason"], data["droppedAfter"])
    (row,) = await rows(sid)
    assert (row.end_reason, row.end_detail) == ("client_evicted", data["reason"])
    assert row.end_payload == evicted.payload
    assert (row.frames_sent, row.bytes_sent) == (len(stream.events), len(stream.body))
    assert warning.connection_id == evicted.connection_id == row.id


# -- how it ended ---------------------------------------------------------------------------


async def test_session_closed_ends_the_connection_as_session_closed(make_session, stream_of):
    sid = await make_session()
    stream = await stream_of(sid)
    await close(sid)
    await stream.read_to_end()
    (row,) = await rows(sid)
    assert row.end_reason == "session_closed"
    assert row.frames_sent == 1  # the session_closed event


async def test_disconnect_all_ends_the_connection_as_server_disconnect(make_session, stream_of):
    sid = await make_session()
    stream = await stream_of(sid)
    await publish_many(sid, 1)
    done = await get_backend().disconnect_everywhere(sid, reason="operator root")
    assert done.here == 1
    await stream.read_to_end()
    assert stream.types == ["step", "stream_error"]
    (row,) = await rows(sid)
    assert (row.end_reason, row.end_detail) == ("server_disconnect", "operator root")
    assert row.end_payload == event_data(stream, "stream_error")


async def test_pump_failure_ends_the_connection_as_stream_error(
    make_session, stream_of, monkeypatch
):
    # EB-19
    encode = FrameEncoder.event

    def failing_encode(self, frame):
        if frame.type == "explode":
            raise RuntimeError("cannot encode this frame")
        return encode(self, frame)

    monkeypatch.setattr(FrameEncoder, "event", failing_encode)
    sid = await make_session()
    stream = await stream_of(sid)
    await publish(sid, {"type": "explode"})
    await stream.read_to_end()
    (row,) = await rows(sid)
    assert row.end_reason == "stream_error"
    assert row.end_detail == "RuntimeError: cannot encode this frame"
    assert row.end_payload == event_data(stream, "stream_error")


async def test_cancelled_stream_is_recorded_as_server_shutdown(make_session, stream_of):
    # what daphne's kill_all_applications and uvicorn's forced shutdown do
    sid = await make_session()
    stream = await stream_of(sid)
    await stream.read_chunk()  # retry
    stream.communicator.future.cancel()
    await stream.communicator.wait(WAIT_S)
    (row,) = await rows(sid)
    assert row.end_reason == "server_shutdown"


# -- no row for what is not a subscriber -------------------------------------------------------


async def test_refused_and_head_requests_leave_no_row(make_session, open_stream, stream_of):
    sid = await make_session()
    path = f"/session/{sid}/events"
    assert (await stream_of(sid, query="maxQueued=9")).status == 400  # EB-14
    assert (await open_stream(path, {"authorization": "Bearer nope"})).status == 401  # EB-12
    head = await open_stream(path, bearer(issue_token(sid, ["read"])), "", "HEAD")
    assert head.status == 200
    assert await rows(sid) == []


# -- log lines -----------------------------------------------------------------------------------


async def test_rejected_max_queued_is_one_log_line_with_the_value(make_session, stream_of, logs):
    # EB-14
    sid = await make_session()
    stream = await (await stream_of(sid, query="maxQueued=99999")).read_to_end()
    assert stream.status == 400
    (record,) = log_records(logs, "invalid_max_queued")
    assert record.getMessage().endswith("value='99999'")


@pytest.mark.usefixtures("strict_caps")
async def test_eviction_log_line_names_session_and_subscriber(make_session, stream_of, logs):
    # EB-5
    sid = await make_session()
    stream = await stream_of(sid, query="maxQueued=16")
    await burst(sid, 40)
    await stream.read_to_end()
    (row,) = await rows(sid)
    (line,) = log_records(logs, "client_evicted session=")
    assert f"session={sid} subscriber={row.id} reason=queue_overflow" in line.getMessage()


# -- writing ---------------------------------------------------------------------------------------


def _connection(session_id: str, **fields: Any) -> dict[str, Any]:
    import uuid

    row = {
        "id": uuid.uuid4(),
        "session_id": session_id,
        "auth": "token",
        "user_id": None,
        "subject": "",
        "client_addr": "",
        "user_agent": "",
        "client_id": "",
        "max_queued": 16,
        "resumed_from": None,
        "opened_at": timezone.now(),
        "closed_at": None,
        "frames_sent": 0,
        "bytes_sent": 0,
        "end_reason": "",
        "end_detail": "",
        "end_payload": "",
    }
    return row | fields


async def test_writing_the_same_batch_twice_changes_nothing(make_session):
    sid = await make_session()
    connection = _connection(sid, frames_sent=5)
    batch = Batch([connection], [])
    await database_sync_to_async(write_batch)(batch)
    await database_sync_to_async(write_batch)(batch)
    later = Batch([connection | {"frames_sent": 9, "end_reason": "client_disconnect"}], [])
    await database_sync_to_async(write_batch)(later)
    (row,) = [row async for row in SubscriberConnection.objects.all()]
    assert (row.frames_sent, row.end_reason) == (9, "client_disconnect")


async def test_rows_of_a_deleted_session_are_dropped_not_failed(make_session):
    kept, deleted = await make_session(), await make_session()
    await AgentSession.objects.filter(pk=deleted).adelete()
    batch = Batch([_connection(kept), _connection(deleted)], [])
    await database_sync_to_async(write_batch)(batch)
    assert [row.session_id async for row in SubscriberConnection.objects.all()] == [kept]


async def test_counters_of_written_rows_are_updated_and_only_they(make_session):
    kept, deleted = await make_session(), await make_session()
    first, second = _connection(kept, frames_sent=1), _connection(deleted, frames_sent=1)
    await database_sync_to_async(write_batch)(Batch([first, second], []))
    await AgentSession.objects.filter(pk=deleted).adelete()  # its rows go with it
    counters = Batch([], [], [(first["id"], 7, 700), (second["id"], 7, 700)])
    await database_sync_to_async(write_batch)(counters)
    await database_sync_to_async(write_batch)(counters)  # the same again: no change
    (row,) = [row async for row in SubscriberConnection.objects.all()]
    assert (row.id, row.frames_sent, row.bytes_sent) == (first["id"], 7, 700)
    assert (row.subject, row.end_reason, row.closed_at) == (first["subject"], "", None)


async def test_counter_updates_are_not_logged_as_dropped_rows(make_session, caplog):
    sid = await make_session()
    row = _connection(sid)
    await database_sync_to_async(write_batch)(Batch([row], []))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="qwenweb.records"):
        await database_sync_to_async(write_batch)(Batch([], [], [(row["id"], 3, 300)]))
    assert [r.getMessage() for r in caplog.records if "records_dropped" in r.getMessage()] == []


async def test_a_user_deleted_before_the_first_write_does_not_fail_the_batch(
    make_session, make_user
):
    user = await make_user("gone")
    sid = await make_session()
    other, row = _connection(sid), _connection(sid, auth="login", user_id=user.pk)
    await user.adelete()
    await database_sync_to_async(write_batch)(Batch([other, row], []))
    written = {r.id: r.user_id async for r in SubscriberConnection.objects.all()}
    assert written == {other["id"]: None, row["id"]: None}


# -- a clean shutdown loses nothing (sessions.ops.lifecycle) --------------------------------------


async def test_shutdown_records_open_streams_and_saves_session_counters(make_session, stream_of):
    sid = await make_session()
    records.recorder.start(asyncio.get_running_loop())
    stream = await stream_of(sid)
    await publish_many(sid, 3)
    await stream.read_until(lambda s: len(s.events) == 3)
    stream.communicator.future.cancel()  # the server cancels its streams
    await lifecycle.shutdown(timeout_s=WAIT_S)
    (row,) = [row async for row in SubscriberConnection.objects.filter(session_id=sid)]
    assert (row.end_reason, row.frames_sent) == ("server_shutdown", 3)
    saved = await AgentSession.objects.aget(pk=sid)
    assert (saved.events_published, saved.last_event_id) == (3, live_bus(sid).last_event_id)


async def test_exit_hook_writes_what_is_pending_and_closes_open_connections(
    make_session, stream_of
):
    sid = await make_session()
    await stream_of(sid)
    await asyncio.to_thread(lifecycle.flush_at_exit)  # atexit: no loop in that thread
    (row,) = [row async for row in SubscriberConnection.objects.filter(session_id=sid)]
    assert (row.end_reason, row.end_detail) == ("server_shutdown", "open at exit")


# -- pruning ---------------------------------------------------------------------------------------


async def test_prune_records_deletes_closed_rows_older_than_the_retention(make_session):
    sid = await make_session()
    old = timezone.now() - timedelta(days=31)
    batch = Batch(
        [
            _connection(sid, opened_at=old, closed_at=old, client_id="old-closed"),
            _connection(sid, opened_at=old, client_id="old-open"),
            _connection(sid, client_id="recent", closed_at=timezone.now()),
        ],
        [],
    )
    await database_sync_to_async(write_batch)(batch)
    await database_sync_to_async(call_command)("prune_records")
    kept = {row.client_id async for row in SubscriberConnection.objects.all()}
    assert kept == {"old-open", "recent"}
    await database_sync_to_async(call_command)("prune_records", "--include-unclosed")
    assert {row.client_id async for row in SubscriberConnection.objects.all()} == {"recent"}
