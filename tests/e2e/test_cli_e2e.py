"""The terminal tools and `runserver` against real server processes on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from sessions.api_client import newest_events
from tests.support.manage import manage, manage_process
from tests.support.server import (
    REPO,
    RemoteSession,
    ServerProcess,
    event_ids,
    free_port,
    open_stream,
    request_json,
    runserver_argv,
    serve_argv,
    server_env,
)

pytestmark = pytest.mark.e2e


def test_tail_session_resumes_after_cursor(
    daphne_server: ServerProcess, e2e_database: Path
) -> None:
    # SC-9 / EB-7: `--last-event-id 3` prints exactly 4 ... 10, then replay_complete.
    session = RemoteSession.create(daphne_server.base_url)
    for n in range(10):
        session.publish("note", {"n": n})
    result = manage(
        e2e_database, "tail_session", session.id, "--url", daphne_server.base_url,
        "--token", session.read_token, "--last-event-id", "3", "--max-events", "8",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [int(line.split()[0]) for line in lines[:7]] == list(range(4, 11))
    assert lines[7].split()[:2] == ["-", "replay_complete"]


def test_tail_session_resumes_in_its_epoch_and_resyncs_in_another(
    daphne_server: ServerProcess, e2e_database: Path
) -> None:
    # EB-7: `--epoch` goes with `--last-event-id`: the session's epoch replays 3 ... 5,
    # another epoch starts with state_resync_required (never a silent gap).
    session = RemoteSession.create(daphne_server.base_url)
    for n in range(5):
        session.publish("note", {"n": n})
    epoch = session.load()["epoch"]
    args = [
        "tail_session", session.id, "--url", daphne_server.base_url,
        "--token", session.read_token, "--last-event-id", "2",
    ]  # fmt: skip
    same = manage(e2e_database, *args, f"--epoch={epoch}", "--max-events", "4")
    assert same.returncode == 0, same.stderr
    assert [line.split()[:2] for line in same.stdout.splitlines()] == [
        ["3", "note"], ["4", "note"], ["5", "note"], ["-", "replay_complete"],
    ]  # fmt: skip
    other = manage(e2e_database, *args, "--epoch", "another-epoch", "--max-events", "1")
    assert other.returncode == 0, other.stderr
    assert other.stdout.split()[:2] == ["-", "state_resync_required"], other.stdout
    bad = manage(e2e_database, "tail_session", session.id, "--token", "t", "--epoch", "x y")
    assert bad.returncode != 0
    assert "--epoch must be" in bad.stderr, bad.stderr
    alone = manage(e2e_database, "tail_session", session.id, "--token", "t", "--epoch", "e")
    assert alone.returncode != 0
    assert "needs --last-event-id" in alone.stderr, alone.stderr


def test_tail_session_reconnects_and_stops_on_204(
    daphne_server: ServerProcess, e2e_database: Path
) -> None:
    # EB-15 / SC-10: the stream ends when the session closes; the reconnect gets 204.
    session = RemoteSession.create(daphne_server.base_url)
    for n in range(3):
        session.publish("note", {"n": n})
    with manage_process(
        e2e_database, "tail_session", session.id, "--url", daphne_server.base_url,
        "--token", session.read_token, "--last-event-id", "0",
    ) as tail:  # fmt: skip
        assert tail.stdout is not None
        assert "replay_complete" in "".join(tail.stdout.readline() for _ in range(4))
        close_url = f"{daphne_server.base_url}/session/{session.id}/close"
        status, _ = request_json("POST", close_url, token=session.publish_token)
        assert status == 200
        out, err = tail.communicate(timeout=30)
    assert tail.returncode == 0
    assert "session_closed" in out
    assert "session ended (204)" in err


def test_demo_agent_streams_acp_shaped_updates(
    daphne_server: ServerProcess, e2e_database: Path
) -> None:
    session = RemoteSession.create(daphne_server.base_url)
    result = manage(
        e2e_database, "demo_agent", session.id, "--url", daphne_server.base_url,
        "--token", session.publish_token, "--tokens-per-s", "100000", timeout_s=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    events = session.load()["events"]
    updates = [e["data"]["sessionUpdate"] for e in events if e["type"] == "session_update"]
    assert {"user_message_chunk", "tool_call", "tool_call_update", "agent_message_chunk"} <= set(
        updates
    )
    chunk = next(e for e in events if e["data"].get("sessionUpdate") == "agent_message_chunk")
    assert chunk["data"]["content"]["type"] == "text"
    assert [e["type"] for e in events].count("turn_complete") == 2


def test_a_session_played_again_counts_its_turns_on_with_new_tool_call_ids(
    daphne_server: ServerProcess, e2e_database: Path
) -> None:
    # `make demo` twice: the demo agent reads the session's newest turn_complete with its
    # read token and numbers on; each run has tool call ids of its own.
    session = RemoteSession.create(daphne_server.base_url)
    for _ in range(2):
        result = manage(
            e2e_database, "demo_agent", session.id, "--url", daphne_server.base_url,
            "--token", session.publish_token, "--read-token", session.read_token,
            "--tokens-per-s", "100000", timeout_s=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
    events = list(newest_events(daphne_server.base_url, session.id, session.read_token))
    events.reverse()
    assert [e["id"] for e in events] == list(range(1, len(events) + 1))
    turns = [e["data"]["turn"] for e in events if e["type"] == "turn_complete"]
    assert turns == [1, 2, 3, 4]
    calls = [
        e["data"]["toolCallId"] for e in events if e["data"].get("sessionUpdate") == "tool_call"
    ]
    assert len(calls) == len(set(calls)) == 4


@pytest.mark.asyncio
async def test_runserver_serves_the_stream_with_event_ring_size(
    e2e_database: Path, tmp_path: Path
) -> None:
    # `runserver --event-ring-size 5` (RING_SIZE); EB-7: a cursor behind the ring resyncs.
    port = free_port()
    argv = runserver_argv(port, "--event-ring-size", "5")
    server = ServerProcess(argv, port, server_env(e2e_database), tmp_path / "rs.log").start()
    try:
        session = RemoteSession.create(server.base_url)
        for n in range(10):
            session.publish("note", {"n": n})
        client = await open_stream(
            port, session.events_path, session.read_token, [("Last-Event-ID", "2")]
        )
        events = await client.read_until(lambda evs: any(e.type == "replay_complete" for e in evs))
        resync = json.loads(events[0].data)["data"]
        assert resync == {"reason": "ring_evicted", "lastDeliveredId": 2, "earliestAvailableId": 6}
        assert event_ids(events) == [6, 7, 8, 9, 10]
        client.close()
    finally:
        server.stop()


@pytest.mark.parametrize("env", [{"QWENWEB_BACKEND": "bogus"}, {"QWENWEB_RING_SIZE": "0"}])
def test_serve_refuses_to_start_with_bad_settings(env: dict[str, str], tmp_path: Path) -> None:
    """The production entry point checks the settings first (system checks): a bad value
    stops start-up with ``qwenweb.E001`` and exit status 1, like ``runserver``."""
    done = subprocess.run(
        serve_argv(free_port()),
        cwd=REPO,
        env=server_env(tmp_path / "unused.sqlite3", **env),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stdout[-2000:]
    assert b"qwenweb.E001" in done.stderr


class _AnswerDroppingProxy:
    """A TCP proxy on 127.0.0.1 that forwards the first connection's whole request (its
    headers and ``Content-Length`` body, however the kernel splits them) and then drops
    the answer (reads it from the server, closes the client's socket); later connections
    are relayed both ways. Each connection gets its own thread, so a stuck one never stops
    the accept loop; every socket operation times out and every socket is closed, also
    when a step fails (``errors`` keeps what failed, for the assertion message)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.dropped = 0
        self.errors: list[str] = []
        self._first = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listener was closed
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client) -> None:
        client.settimeout(10)
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10)
        except OSError as error:
            self.errors.append(f"connect upstream: {error!r}")
            client.close()
            return
        with self._first:
            drop = self.dropped == 0
            if drop:
                self.dropped += 1
        if not drop:
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(source, target), daemon=True).start()
            return
        try:
            upstream.sendall(_read_request(client))
            if not upstream.recv(65536):  # the server answered: nobody hears it
                self.errors.append("the server closed without an answer")
        except OSError as error:
            self.errors.append(f"first request: {error!r}")
        finally:
            client.close()
            upstream.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.listener.close()


def _read_request(sock) -> bytes:
    """One HTTP/1.1 request off ``sock``: up to the blank line, then ``Content-Length`` more."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"the client closed after {len(data)} bytes of headers")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"the client closed after {len(body)} of {length} body bytes")
        body += chunk
    return head + b"\r\n\r\n" + body


def _pipe(source, target) -> None:
    try:
        while chunk := source.recv(65536):
            target.sendall(chunk)
    except OSError:
        pass
    finally:
        for sock in (source, target):
            with contextlib.suppress(OSError):
                sock.close()


def test_publisher_retry_after_a_lost_answer_publishes_once(daphne_server: ServerProcess) -> None:
    # The answer to the first POST is lost after the server published: the Publisher
    # resends with the same Idempotency-Key and the server answers the first id again.
    from sessions.api_client import Publisher

    session = RemoteSession.create(daphne_server.base_url)
    proxy = _AnswerDroppingProxy(daphne_server.port)
    publisher = Publisher(f"http://127.0.0.1:{proxy.port}", session.id, session.publish_token)
    try:
        first_id = publisher.publish("note", {"n": 1}, attempts=3)
        # (the retry waited 1 s: the Publisher's pause after a failed connection)
    finally:
        publisher.close()
        proxy.close()
    assert proxy.dropped == 1, proxy.errors
    assert proxy.errors == []
    events = [e for e in session.load()["events"] if e.get("type") == "note"]
    assert [e["id"] for e in events] == [first_id]
