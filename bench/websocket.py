"""WebSocket next to SSE on one ``python -m qwenweb.serve`` (granian): resume, fan-out, idle RSS.

    .venv/bin/python -m bench.websocket [--sessions 100] [--fanout 100] [--events 100]
                                        [--idle 500]

Scenarios (each against a fresh server; figures are ratios within one run, the machine's
load average is printed with them):

1. *Resume* (issue 27's Done-when): one socket subscribes ``--sessions`` sessions, 10
   events are published to each, the socket is cut, 10 more are published to each; a new
   socket resubscribes all of them with their cursors and epochs in one burst. Checked:
   every event exactly once and in order per session, ``replay_complete`` each, no
   ``state_resync_required``. Timed: the new socket's open to the last
   ``replay_complete``, against ``--sessions`` concurrent SSE resumes of the same sessions
   from the same cursors (open to the last ``replay_complete``).
2. *Fan-out*: ``--fanout`` subscribers of one session (SSE streams, or sockets with one
   subscription each), ``--events`` events published; time from the first publish to the
   last delivery.
3. *Idle memory*: RSS growth of the server's process tree per idle subscriber: ``--idle``
   SSE streams; the same number of WebSocket subscriptions on sockets of 10 sessions each;
   and on sockets of one subscription each.

Every wait is bounded (``WAIT_S`` per step).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "qwenweb.settings")
django.setup()  # the test support issues tokens with the project's secret

from tests.support.server import (  # noqa: E402
    RemoteSession,
    ServerProcess,
    free_port,
    migrate,
    open_stream,
    serve_argv,
    server_env,
)
from tests.support.wsclient import WsClient, ids, types  # noqa: E402

WAIT_S = 120.0


def _server(database: Path, log: Path) -> ServerProcess:
    port = free_port()
    env = server_env(database, QWENWEB_MAX_SUBSCRIBERS="2000", QWENWEB_PUBLISH_RATE_PER_S="100000")
    return ServerProcess(serve_argv(port), port, env, log).start(timeout_s=120)


def _ws(server: ServerProcess) -> WsClient:
    return WsClient(f"ws://127.0.0.1:{server.port}/ws")


async def resume(server: ServerProcess, count: int) -> dict[str, Any]:
    """Scenario 1; returns the two timings and the checks."""
    sessions = [RemoteSession.create(server.base_url) for _ in range(count)]
    first = await _ws(server).connect()
    for index, session in enumerate(sessions):
        await first.subscribe(index, session.id, session.read_token)
    await first.read_until(lambda c: len(c.replies) == count, WAIT_S)
    for session in sessions:
        for n in range(10):
            session.publish("note", {"n": n})
    await first.read_until(lambda c: all(len(ids(c.frames[s.id])) == 10 for s in sessions), WAIT_S)
    epochs = [first.replies[i]["epoch"] for i in range(count)]
    first.connection.transport.abort()
    await first.close()
    for session in sessions:
        for n in range(10, 20):
            session.publish("note", {"n": n})
    started = time.perf_counter()
    second = await _ws(server).connect()
    await asyncio.gather(
        *(second.subscribe(i, s.id, s.read_token, lastEventId=10, epoch=epochs[i])
          for i, s in enumerate(sessions))
    )  # fmt: skip
    await second.read_until(
        lambda c: all("replay_complete" in types(c.frames[s.id]) for s in sessions), WAIT_S
    )
    ws_s = time.perf_counter() - started
    exact = all(ids(second.frames[s.id]) == list(range(11, 21)) for s in sessions)
    resyncs = sum("state_resync_required" in types(second.frames[s.id]) for s in sessions)
    await second.close()

    async def sse_resume(session: RemoteSession, epoch: str) -> list[int]:
        headers = [("Last-Event-ID", "10"), ("X-Event-Epoch", epoch)]
        client = await open_stream(server.port, session.events_path, session.read_token, headers)
        await client.read_until(lambda evs: any(e.type == "replay_complete" for e in evs), WAIT_S)
        await client.aclose()
        return [json.loads(e.data)["id"] for e in client.events if e.type == "note"]

    started = time.perf_counter()
    replayed = await asyncio.gather(*(sse_resume(s, epochs[i]) for i, s in enumerate(sessions)))
    sse_s = time.perf_counter() - started
    sse_exact = all(r == list(range(11, 21)) for r in replayed)
    return {"sessions": count, "ws_s": ws_s, "sse_s": sse_s, "ws_exactly_once": exact,
            "ws_resyncs": resyncs, "sse_exactly_once": sse_exact}  # fmt: skip


async def fanout(server: ServerProcess, subscribers: int, events: int) -> dict[str, float]:
    """Scenario 2: seconds from the first publish to the last delivery, per transport."""
    out: dict[str, float] = {}
    session = RemoteSession.create(server.base_url)
    sse = [await open_stream(server.port, session.events_path, session.read_token)
           for _ in range(subscribers)]  # fmt: skip
    out["sse_s"] = await _timed_publish(
        session, events,
        [c.read_until(lambda evs: sum(e.type == "note" for e in evs) >= events, WAIT_S)
         for c in sse],
    )  # fmt: skip
    for stream in sse:
        await stream.aclose()
    session = RemoteSession.create(server.base_url)
    sockets = [await _ws(server).connect() for _ in range(subscribers)]
    for client in sockets:
        await client.subscribe(1, session.id, session.read_token)
        await client.reply(1)
    out["ws_s"] = await _timed_publish(
        session, events,
        [c.read_until(lambda c: len(ids(c.frames[session.id])) >= events, WAIT_S)
         for c in sockets],
    )  # fmt: skip
    for client in sockets:
        await client.close()
    return out


async def _timed_publish(session: RemoteSession, events: int, readers: list[Any]) -> float:
    tasks = [asyncio.ensure_future(reader) for reader in readers]
    started = time.perf_counter()
    for n in range(events):
        await asyncio.to_thread(session.publish, "note", {"n": n})
    await asyncio.gather(*tasks)
    return time.perf_counter() - started


async def idle(server: ServerProcess, count: int, per_socket: int) -> float:
    """Scenario 3: KiB of server RSS per idle subscriber (``per_socket`` 0: SSE)."""
    sessions = [RemoteSession.create(server.base_url) for _ in range(max(10, per_socket))]
    before = server.rss_kib()
    streams: list[Any] = []
    held: list[WsClient] = []
    if per_socket == 0:
        for n in range(count):
            s = sessions[n % len(sessions)]
            streams.append(await open_stream(server.port, s.events_path, s.read_token))
    else:
        for start in range(0, count, per_socket):
            client = await _ws(server).connect()
            for offset in range(per_socket):
                s = sessions[(start + offset) % len(sessions)]
                await client.subscribe(offset, s.id, s.read_token)
            await client.read_until(lambda c: len(c.replies) == per_socket, WAIT_S)
            held.append(client)
    await asyncio.sleep(1.0)  # the server's allocations settle (no wait stands for a cause)
    grown = server.rss_kib() - before
    for stream in streams:
        await stream.aclose()
    for client in held:
        await client.close()
    return grown / count


async def main(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bench-ws-"))
    database = workdir / "db.sqlite3"
    migrate(database)
    results: dict[str, Any] = {"loadavg_start": os.getloadavg()}
    server = _server(database, workdir / "resume.log")
    try:
        results["resume"] = await resume(server, args.sessions)
        results["fanout"] = await fanout(server, args.fanout, args.events)
    finally:
        server.stop()
    for label, per_socket in (("idle_sse_kib", 0), ("idle_ws10_kib", 10), ("idle_ws1_kib", 1)):
        server = _server(database, workdir / f"{label}.log")
        try:
            results[label] = await idle(server, args.idle, per_socket)
        finally:
            server.stop()
    results["loadavg_end"] = os.getloadavg()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--fanout", type=int, default=100)
    parser.add_argument("--events", type=int, default=100)
    parser.add_argument("--idle", type=int, default=500)
    asyncio.run(main(parser.parse_args()))
