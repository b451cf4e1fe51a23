"""A torn last write of the event log (issue 24, "Faults"; EB-23).

One ``python -m qwenweb.serve`` process on the durable backend, a publisher posting over
HTTP; the server's process group is killed with SIGKILL, the log's WAL is cut in the middle
of its last commit frame (the write a power cut leaves half done), and the server restarts
on the same files. Recovery keeps every transaction before the torn one, in a new epoch
that carries their ids: a client resuming with its cursor and the old epoch gets every
event up to the fork id P, the same events, then ``replay_complete`` and no
``state_resync_required``; a client that saw an event of the torn tail (a cursor beyond P)
resyncs; the new epoch's own ids start above every id ever issued, so no (epoch, id) names
two events.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.server import (
    RemoteSession,
    ServerProcess,
    free_port,
    migrate,
    open_stream,
    request_json,
    serve_argv,
    server_env,
)

pytestmark = [pytest.mark.own_backend, pytest.mark.asyncio, pytest.mark.timeout(300)]

ROUNDS = 3
"""Kill-and-tear rounds tried until one tears an acknowledged event (a checkpoint that
copied the last commit into the database file just before the kill leaves the torn frame
already saved: nothing to lose in that round)."""
WAL_HEADER = 32
FRAME_HEADER = 24


def tear_last_commit(wal: Path) -> None:
    """Cut ``wal`` in the middle of its last valid commit frame (frames of the current salt,
    SQLite's WAL format: a 32-byte header, then frames of a 24-byte header and a page)."""
    data = wal.read_bytes()
    page_size = int.from_bytes(data[8:12], "big")
    salt = data[16:24]
    frame = FRAME_HEADER + page_size
    last_commit = None
    offset = WAL_HEADER
    while offset + frame <= len(data) and data[offset + 8 : offset + 16] == salt:
        if int.from_bytes(data[offset + 4 : offset + 8], "big"):  # the commit's size in pages
            last_commit = offset
        offset += frame
    assert last_commit is not None, "no commit frame in the WAL"
    with wal.open("r+b") as out:
        out.truncate(last_commit + frame // 2)


def publish(session: RemoteSession, n: int) -> tuple[int, str]:
    url = f"{session.base_url}{session.events_path}"
    status, body = request_json(
        "POST", url, {"type": "note", "data": {"n": n}}, session.publish_token
    )
    assert status == 200, body
    return int(body["id"]), str(body["epoch"])


async def resume(
    port: int, session: RemoteSession, cursor: int, epoch: str | None
) -> tuple[list[Any], str]:
    """The replay a client gets for ``cursor`` (and ``epoch``), and the stream's epoch."""
    headers = [("Last-Event-ID", str(cursor))] + ([("X-Event-Epoch", epoch)] if epoch else [])
    client = await open_stream(port, session.events_path, session.read_token, headers)
    events = await client.read_until(lambda got: any(e.type == "replay_complete" for e in got))
    await client.aclose()
    frames = [(e.type, json.loads(e.data)) for e in events]
    return frames, client.response_headers.get("x-event-epoch", "")


async def test_a_torn_wal_keeps_every_event_before_the_torn_commit_in_a_forked_epoch(
    tmp_path: Path,
) -> None:
    database = tmp_path / "db.sqlite3"
    migrate(database)
    env = server_env(database, QWENWEB_BACKEND="durable")
    wal = Path(f"{env['QWENWEB_EVENT_LOG_PATH']}-wal")
    port = free_port()
    server = ServerProcess(serve_argv(port), port, env, tmp_path / "serve.log").start(60)
    session = RemoteSession.create(server.base_url)
    acked: dict[tuple[str, int], int] = {}  # (epoch, id) -> n
    n = 0
    try:
        for _ in range(ROUNDS):
            for _ in range(10):
                n += 1
                event_id, epoch = publish(session, n)
                acked[(epoch, event_id)] = n
            server.kill()  # SIGKILL, the whole process tree
            tear_last_commit(wal)
            server = ServerProcess(serve_argv(port), port, env, tmp_path / "serve.log").start(60)
            snapshot = session.load()
            fork_id = snapshot["lastEventId"]
            if fork_id < event_id:
                break
        assert fork_id < event_id, f"no round tore an acknowledged event: {server.log()[-1500:]}"
        assert snapshot["epoch"] != epoch
        before = [i for (e, i) in acked if e == epoch and i <= fork_id]
        frames, stream_epoch = await resume(port, session, before[0], epoch)
        assert stream_epoch == snapshot["epoch"]  # the client learns the new epoch
        assert [t for t, _ in frames][-1] == "replay_complete"
        assert "state_resync_required" not in [t for t, _ in frames]
        replayed = [(f["id"], f["data"]["n"]) for t, f in frames if t == "note"]
        assert replayed == [(i, acked[(epoch, i)]) for i in before[1:]], "not the same events"
        frames, _ = await resume(port, session, fork_id + 1, epoch)  # saw a torn event
        assert frames[0][1]["data"]["reason"] == "epoch_reset"
        frames, _ = await resume(port, session, fork_id + 1, None)
        assert frames[0][1]["data"]["reason"] == "epoch_reset"
        new_id, new_epoch = publish(session, n + 1)
        assert new_epoch == snapshot["epoch"]
        assert new_id > max(i for (_, i) in acked), "an id issued twice"
        frames, _ = await resume(port, session, fork_id, snapshot["epoch"])
        assert [(t, f.get("id")) for t, f in frames] == [
            ("note", new_id),
            ("replay_complete", None),
        ]
    finally:
        server.stop()
