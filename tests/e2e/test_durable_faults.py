"""The durable backend's log on a full disk: 503 ``storage_full``, nothing acknowledged lost,
publishing resumes without a restart once space returns (issue 24, "Faults").

The server runs in a mount namespace of its own with its log on a small tmpfs; the test
fills that file system (and frees it again) through ``/proc/<pid>/root``, the server's view.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
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

pytestmark = [
    pytest.mark.own_backend,
    pytest.mark.asyncio,
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("unshare") is None or sys.platform != "linux",
        reason="mounting a small tmpfs in a mount namespace needs root and unshare (Linux)",
    ),
]

TMPFS_SIZE = "16m"


def _fill(directory: Path) -> Path:
    """Write a file into ``directory`` until its file system is full; return it."""
    filler = directory / "filler"
    chunk = b"\0" * 65536
    with filler.open("wb") as out:
        error = _write_until_error(out.write, out.flush, chunk)
    assert error.errno == errno.ENOSPC, error
    return filler


def _write_until_error(write: Any, flush: Any, chunk: bytes) -> OSError:
    try:
        while True:
            write(chunk)
            flush()
    except OSError as exc:
        return exc


async def test_a_full_disk_refuses_publishes_with_storage_full_then_recovers(
    tmp_path: Path,
) -> None:
    database = tmp_path / "db.sqlite3"
    migrate(database)
    mount = tmp_path / "small"
    mount.mkdir()
    env = server_env(
        database,
        QWENWEB_BACKEND="durable",
        QWENWEB_EVENT_LOG_PATH=str(mount / "events.sqlite3"),
    )
    port = free_port()
    argv = [
        "unshare", "-m", "--propagation", "private", "--", "sh", "-c",
        f'mount -t tmpfs -o size={TMPFS_SIZE},mode=0700 tmpfs "$0" && exec "$@"',
        str(mount), *serve_argv(port),
    ]  # fmt: skip
    server = ServerProcess(argv, port, env, tmp_path / "serve.log").start(timeout_s=60)
    try:
        assert server.process is not None
        seen_by_server = Path(f"/proc/{server.process.pid}/root") / str(mount).lstrip("/")
        session = RemoteSession.create(server.base_url)
        acked = [session.publish("note", {"n": n}) for n in range(5)]
        filler = _fill(seen_by_server)
        url = f"{server.base_url}{session.events_path}"
        big = {"type": "note", "data": {"pad": "x" * 200_000}}
        status, body = 0, None
        for _ in range(50):  # until SQLite needs a page the file system cannot give
            status, body = request_json("POST", url, big, session.publish_token)
            if status != 200:
                break
            acked.append(int(body["id"]))
        assert status == 503, (status, body)
        assert body is not None
        assert body["code"] == "storage_full", body
        ready_status, ready = request_json("GET", f"{server.base_url}/readyz")
        assert ready_status == 503, ready
        client = await open_stream(
            port, session.events_path, session.read_token, [("Last-Event-ID", "0")]
        )
        events = await client.read_until(lambda got: got and got[-1].type == "replay_complete")
        await client.aclose()
        assert [json.loads(e.data)["id"] for e in events[:-1]] == acked  # streams still serve
        filler.unlink()  # space returns
        resumed = session.publish("note", {"n": "after"})
        assert resumed == acked[-1] + 1  # the refused events took no id
        assert request_json("GET", f"{server.base_url}/readyz")[0] == 200
    finally:
        server.stop()
