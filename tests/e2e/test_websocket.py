"""``GET /ws`` against real servers, with a real WebSocket client (docs/protocol.md,
"The WebSocket transport").

The same scenarios as the SSE stream: the resume table gives the same frames on both
transports; a socket that stops reading has its subscription warned and evicted while
another socket of the same session gets every event; a batched resubscribe of many
sessions after a cut delivers every event exactly once. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import (
    RemoteSession,
    ServerProcess,
    daphne_argv,
    free_port,
    get_json,
    open_stream,
    request_json,
    serve_argv,
    server_env,
)
from tests.support.wsclient import WsClient, ids, types

pytestmark = pytest.mark.e2e

WAIT_S = 30.0
MIB = 1024 * 1024


def _uvicorn_argv(port: int) -> list[str]:
    return [
        sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port),
        "qwenweb.asgi:application",
    ]  # fmt: skip


ARGV = {"serve": serve_argv, "uvicorn": _uvicorn_argv, "daphne": daphne_argv}


def _start(kind: str, database: Path, log_dir: Path, **env: str) -> ServerProcess:
    port = free_port()
    return ServerProcess(
        ARGV[kind](port),
        port,
        server_env(database, QWENWEB_HEARTBEAT_INTERVAL_S="1", **env),
        log_dir / f"{kind}.log",
    ).start()


@pytest.fixture(scope="module")
def server(e2e_database: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The production entry point (granian)."""
    started = _start("serve", e2e_database, tmp_path_factory.mktemp("ws"))
    yield started
    started.stop()


def _ws(server: ServerProcess, **headers: str) -> WsClient:
    return WsClient(f"ws://127.0.0.1:{server.port}/ws", headers=headers)


def _comparable(frame: dict[str, Any]) -> dict[str, Any]:
    """A frame without its ``_meta`` (the server's timestamps differ between writes)."""
    return {key: value for key, value in frame.items() if key != "_meta"}


async def _sse_frames(
    server: ServerProcess, session: RemoteSession, headers: list[tuple[str, str]], until_id: int
) -> list[dict[str, Any]]:
    client = await open_stream(server.port, session.events_path, session.read_token, headers)
    try:
        await client.read_until(
            lambda events: any(json.loads(e.data).get("id") == until_id for e in events), WAIT_S
        )
        return [json.loads(event.data) for event in client.events]
    finally:
        await client.aclose()


RESUME_ROWS: dict[str, tuple[dict[str, Any], list[tuple[str, str]]]] = {
    "no cursor": ({}, []),
    "cursor 0": ({"lastEventId": 0}, [("Last-Event-ID", "0")]),
    "in ring": ({"lastEventId": 8}, [("Last-Event-ID", "8")]),
    "evicted from ring": ({"lastEventId": 2}, [("Last-Event-ID", "2")]),
    "other epoch": (
        {"lastEventId": 8, "epoch": "another-epoch"},
        [("Last-Event-ID", "8"), ("X-Event-Epoch", "another-epoch")],
    ),
    "invalid": ({"lastEventId": "8x"}, [("Last-Event-ID", "8x")]),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("row", RESUME_ROWS)
async def test_resume_table_row_gives_the_same_frames_over_websocket_as_over_sse(
    server: ServerProcess, row: str
) -> None:
    session = RemoteSession.create(server.base_url, ringSize=5)
    for index in range(10):
        session.publish("note", {"i": index})
    ws_fields, sse_headers = RESUME_ROWS[row]
    client = await _ws(server).connect()
    await client.subscribe(1, session.id, session.read_token, **ws_fields)
    reply = await client.reply(1)
    assert reply["ok"], reply
    assert reply["lastEventId"] == 10
    sse = asyncio.ensure_future(_sse_frames(server, session, sse_headers, until_id=11))
    marker = await _publish_when_subscribed(server, session, subscribers=2)
    await client.read_until(lambda c: marker in ids(c.frames[session.id]), WAIT_S)
    over_sse = await asyncio.wait_for(sse, WAIT_S)
    over_ws = client.frames[session.id]
    assert [_comparable(f) for f in over_ws] == [_comparable(f) for f in over_sse]
    await client.close()


async def _publish_when_subscribed(
    server: ServerProcess, session: RemoteSession, subscribers: int
) -> int:
    """Publish once the session has ``subscribers`` (bounded); return the new id."""
    async with asyncio.timeout(WAIT_S):
        while True:
            rows = await asyncio.to_thread(
                get_json, f"{server.base_url}/session/{session.id}", session.read_token
            )
            if rows.get("subscriberCount", 0) >= subscribers:
                break
            await asyncio.sleep(0.05)
    return await asyncio.to_thread(session.publish, "note", {"marker": True})


def _incompressible(size: int) -> str:
    return base64.b64encode(os.urandom(size * 3 // 4)).decode()


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["serve", "uvicorn", "daphne"])
async def test_a_socket_that_never_reads_is_warned_and_evicted_while_another_gets_every_event(
    kind: str, e2e_database: Path, tmp_path: Path
) -> None:
    server = _start(kind, e2e_database, tmp_path, QWENWEB_TCP_USER_TIMEOUT_S="0")
    try:
        session = RemoteSession.create(server.base_url)
        frozen = await _ws(server).connect(max_queue=1)  # stops reading: never recv()s
        reader = await _ws(server).connect()
        for client in (frozen, reader):
            await client.subscribe(1, session.id, session.read_token)
            await client.reply(1)
        count, blob = 200, _incompressible(60 * 1024)
        before = server.rss_kib()
        reading = asyncio.ensure_future(
            reader.read_until(lambda c: len(ids(c.frames[session.id])) >= count, 4 * WAIT_S)
        )
        peak = before
        for index in range(count):
            await asyncio.to_thread(session.publish, "blob", {"i": index, "pad": blob})
            peak = max(peak, server.rss_kib()) if index % 20 == 0 else peak
        await reading
        peak = max(peak, server.rss_kib())
        assert ids(reader.frames[session.id]) == list(range(1, count + 1))
        await frozen.read_until(lambda c: "client_evicted" in types(c.frames[session.id]), WAIT_S)
        seen = frozen.frames[session.id]
        assert types(seen)[-2:] == ["slow_client_warning", "client_evicted"], types(seen)[-3:]
        assert len(ids(seen)) < count  # it was evicted, not buffered whole
        ring_mib = count * 61 / 1024
        print(f"{kind}: evicted after id {ids(seen)[-1]}, RSS +{(peak - before) / 1024:.1f} MiB")
        assert (peak - before) / 1024 <= ring_mib + 16
        await frozen.close()
        await reader.close()
    finally:
        server.stop()


@pytest.mark.asyncio
async def test_a_flooded_subscription_is_evicted_while_its_sibling_on_its_socket_keeps_receiving(
    server: ServerProcess,
) -> None:
    flooded, quiet = RemoteSession.create(server.base_url), RemoteSession.create(server.base_url)
    client = await _ws(server).connect(max_queue=1)
    await client.subscribe(1, flooded.id, flooded.read_token)
    await client.subscribe(2, quiet.id, quiet.read_token)
    await client.reply(2)
    await client.reply(1)
    blob = _incompressible(60 * 1024)
    for index in range(120):  # the socket is not read meanwhile: the 2 MiB cap overflows
        await asyncio.to_thread(flooded.publish, "blob", {"i": index, "pad": blob})
    quiet_ids = [await asyncio.to_thread(quiet.publish, "note", {"i": i}) for i in range(3)]
    await client.read_until(lambda c: "client_evicted" in types(c.frames[flooded.id]), WAIT_S)
    await client.read_until(lambda c: ids(c.frames[quiet.id]) == quiet_ids, WAIT_S)
    later = await asyncio.to_thread(quiet.publish, "note", {"after": True})
    await client.read_until(lambda c: later in ids(c.frames[quiet.id]), WAIT_S)
    assert "client_evicted" not in types(client.frames[quiet.id])
    await client.close()


@pytest.mark.asyncio
async def test_batched_resubscribe_of_many_sessions_after_a_cut_delivers_each_event_once(
    server: ServerProcess,
) -> None:
    sessions = [RemoteSession.create(server.base_url) for _ in range(20)]
    first = await _ws(server).connect()
    for index, session in enumerate(sessions):
        await first.subscribe(index, session.id, session.read_token)
    await first.read_until(lambda c: len(c.replies) == len(sessions), WAIT_S)
    for session in sessions:
        for n in range(3):
            session.publish("note", {"n": n})
    await first.read_until(lambda c: all(len(ids(c.frames[s.id])) == 3 for s in sessions), WAIT_S)
    cursors = {s.id: (ids(first.frames[s.id])[-1], first.replies[i]["epoch"])
               for i, s in enumerate(sessions)}  # fmt: skip
    first.connection.transport.abort()  # cut, no close handshake
    await first.close()
    for session in sessions:
        for n in range(3, 6):
            session.publish("note", {"n": n})
    second = await _ws(server).connect()
    await asyncio.gather(
        *(
            second.subscribe(i, s.id, s.read_token, lastEventId=cursors[s.id][0],
                             epoch=cursors[s.id][1])
            for i, s in enumerate(sessions)
        )
    )  # fmt: skip
    await second.read_until(
        lambda c: all("replay_complete" in types(c.frames[s.id]) for s in sessions), WAIT_S
    )
    for session in sessions:
        frames = second.frames[session.id]
        assert ids(frames) == [4, 5, 6], frames
        assert types(frames)[-1] == "replay_complete"
        assert "state_resync_required" not in types(frames)
    await second.close()


@pytest.mark.asyncio
async def test_the_subscribe_reply_comes_first_and_unsubscribe_ends_the_frames(
    server: ServerProcess,
) -> None:
    session = RemoteSession.create(server.base_url)
    session.publish("note", {"i": 1})
    client = await _ws(server).connect()
    await client.subscribe("a", session.id, session.read_token, lastEventId=0)
    await client.read_until(lambda c: "replay_complete" in types(c.frames[session.id]), WAIT_S)
    assert client.order[0] == client.replies["a"]
    await client.send({"op": "unsubscribe", "ref": "b", "session": session.id})
    assert (await client.reply("b"))["ok"]
    session.publish("note", {"i": 2})
    await client.send({"op": "ping", "ref": 9})
    await client.read_until(lambda c: any(m.get("op") == "pong" for m in c.other), WAIT_S)
    assert ids(client.frames[session.id]) == [1]
    await client.close()


@pytest.mark.asyncio
async def test_server_pings_an_idle_socket(server: ServerProcess) -> None:
    client = await _ws(server).connect()
    await client.read_until(lambda c: {"op": "ping"} in c.other, WAIT_S)  # HEARTBEAT 1 s
    await client.close()


@pytest.mark.asyncio
async def test_metrics_count_websocket_subscriptions_beside_sse_streams(
    server: ServerProcess,
) -> None:
    def scraped() -> dict[str, float]:
        with urllib.request.urlopen(f"{server.base_url}/metrics", timeout=10) as response:
            text = response.read().decode()
        names = ("qwenweb_subscribers", "qwenweb_websocket_subscribers")
        return {
            line.split()[0]: float(line.split()[1])
            for line in text.splitlines()
            if line.split(" ")[0] in names
        }

    session = RemoteSession.create(server.base_url)
    before = await asyncio.to_thread(scraped)
    client = await _ws(server).connect()
    await client.subscribe(1, session.id, session.read_token)
    await client.reply(1)
    sse = await open_stream(server.port, session.events_path, session.read_token)
    during = await asyncio.to_thread(scraped)
    assert during["qwenweb_subscribers"] == before["qwenweb_subscribers"] + 2
    assert during["qwenweb_websocket_subscribers"] == before["qwenweb_websocket_subscribers"] + 1
    await sse.aclose()
    await client.close()


@pytest.mark.asyncio
async def test_drain_ends_websocket_subscriptions_with_server_draining_then_closes_1012(
    e2e_database: Path, tmp_path: Path
) -> None:
    server = _start("serve", e2e_database, tmp_path, QWENWEB_DRAIN_S="0.5")
    try:
        session = RemoteSession.create(server.base_url)
        client = await _ws(server).connect()
        await client.subscribe(1, session.id, session.read_token)
        await client.reply(1)
        assert server.process is not None
        os.kill(server.process.pid, signal.SIGTERM)
        await client.read_until(lambda c: c.closed_code is not None, WAIT_S)
        last = client.frames[session.id][-1]
        assert last["type"] == "stream_error"
        assert last["data"]["code"] == "server_draining"
        assert client.closed_code in (1012, 1001), client.closed_code
    finally:
        server.stop()


@pytest.mark.asyncio
async def test_closing_the_session_ends_its_subscription_and_a_resubscribe_is_refused(
    server: ServerProcess,
) -> None:
    session = RemoteSession.create(server.base_url)
    client = await _ws(server).connect()
    await client.subscribe(1, session.id, session.read_token)
    await client.reply(1)
    status, closed = await asyncio.to_thread(
        request_json, "POST", f"{server.base_url}/session/{session.id}/close", None,
        session.publish_token,
    )  # fmt: skip
    assert status == 200, closed
    await client.read_until(lambda c: "session_closed" in types(c.frames[session.id]), WAIT_S)
    await client.subscribe(2, session.id, session.read_token)
    assert (await client.reply(2))["error"]["code"] == "session_closed"
    await client.close()


@pytest.mark.asyncio
async def test_a_socket_that_takes_nothing_for_the_writer_idle_timeout_is_dropped(
    e2e_database: Path, tmp_path: Path
) -> None:
    server = _start(
        "serve", e2e_database, tmp_path,
        QWENWEB_WRITER_IDLE_TIMEOUT_S="2", QWENWEB_TCP_USER_TIMEOUT_S="0",
        QWENWEB_MAX_QUEUED_BYTES=str(64 * MIB),  # no overflow: only the idle bound can end it
    )  # fmt: skip
    try:
        session = RemoteSession.create(server.base_url)
        frozen = await _ws(server).connect(max_queue=1)
        await frozen.subscribe(1, session.id, session.read_token)
        await frozen.reply(1)
        blob = _incompressible(60 * 1024)
        for index in range(120):
            await asyncio.to_thread(session.publish, "blob", {"i": index, "pad": blob})
        async with asyncio.timeout(WAIT_S):
            while (await asyncio.to_thread(session.load))["subscriberCount"]:
                await asyncio.sleep(0.2)
        assert "ws_writer_idle" in server.log()
        assert "reason=client_evicted detail=writer_idle_timeout" in server.log()
        frozen.connection.transport.abort()
        await frozen.close()
    finally:
        server.stop()
