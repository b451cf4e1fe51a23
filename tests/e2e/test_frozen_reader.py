"""B21: a reader frozen while it is evicted still reads its last frames (issue 26, point 4).

Under ``python -m qwenweb.serve`` (granian), a raw-socket reader with a small receive
buffer reads the response headers and then nothing, while 4 KiB events arrive at 100/s,
as curl stopped with SIGSTOP would. The server warns, evicts (``client_evicted``), and
its writer idle bound passes while the reader is still frozen. When the reader wakes it
must read ``slow_client_warning``, ``client_evicted`` last, only whole events, and a
clean end of the body and of the connection (FIN, not a reset). Before the fix the
server reset the connection when the idle bound passed, throwing those bytes away.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import h11
import pytest

from sessions.wire import ServerSentEvent, SSEParser
from tests.support.server import (
    RemoteSession,
    ServerProcess,
    free_port,
    serve_argv,
    server_env,
)

pytestmark = [pytest.mark.e2e]

IDLE_S = 2.0  # WRITER_IDLE_TIMEOUT_S, short to keep the test lean (the linger is as long)


@pytest.fixture(scope="module")
def granian(
    e2e_database: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    port = free_port()
    # The kernel ends a connection whose window stays closed for TCP_USER_TIMEOUT_S
    # (writer idle + 2 s by default): here long enough that only the server's own bound,
    # the writer idle timeout and the linger after it, decides.
    env = server_env(
        e2e_database,
        QWENWEB_WRITER_IDLE_TIMEOUT_S=str(IDLE_S),
        QWENWEB_TCP_USER_TIMEOUT_S="30",
    )
    server = ServerProcess(
        serve_argv(port), port, env, tmp_path_factory.mktemp("logs") / "granian.log"
    ).start()
    yield server
    server.stop()


def test_a_reader_frozen_while_evicted_reads_its_last_frames_and_a_clean_end(
    granian: ServerProcess,
) -> None:
    session = RemoteSession.create(granian.base_url)
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)  # (before connect)
    reader.connect(("127.0.0.1", granian.port))
    reader.sendall(
        f"GET {session.events_path}?maxQueued=16 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Accept: text/event-stream\r\nAuthorization: Bearer {session.read_token}\r\n\r\n".encode()
    )
    received = bytearray(reader.recv(4096))  # the headers; then the reader freezes
    assert received.startswith(b"HTTP/1.1 200")
    published = 0
    publisher = http.client.HTTPConnection("127.0.0.1", granian.port, timeout=10)
    headers = {"Authorization": f"Bearer {session.publish_token}"}
    event = json.dumps({"type": "note", "data": "x" * 4096})  # 4 KiB events, up to 100/s
    deadline = time.monotonic() + 60
    while "client_evicted" not in granian.log() and time.monotonic() < deadline:
        publisher.request("POST", session.events_path, event, headers)
        assert publisher.getresponse().read()
        assert published < 5000
        published += 1
        time.sleep(0.01)
    publisher.close()
    assert "client_evicted" in granian.log(), f"not evicted after {published} events"
    # Frozen on past the writer idle bound (which used to reset the connection), within
    # the linger after it (as long again) ...
    time.sleep(IDLE_S + 0.5)
    # ... then the reader wakes and reads to the end.
    reader.settimeout(10)
    reset = False
    try:
        while chunk := reader.recv(65536):
            received += chunk
    except ConnectionResetError:
        reset = True
    finally:
        reader.close()
    connection = h11.Connection(h11.CLIENT)
    connection.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    connection.send(h11.EndOfMessage())
    connection.receive_data(bytes(received))
    connection.receive_data(b"")
    body, ended = bytearray(), False
    for _ in range(len(received)):  # (bounded: h11 yields at most one item per byte)
        message = connection.next_event()
        if isinstance(message, h11.Data):
            body += message.data
        elif isinstance(message, h11.EndOfMessage):
            ended = True
        if not isinstance(message, h11.Data | h11.Response):
            break
    events: list[ServerSentEvent] = []
    SSEParser(events.append).feed_bytes(bytes(body))
    types = [json.loads(item.data)["type"] for item in events]
    print(f"published={published} read={len(received)} B events={len(events)} "
          f"reset={reset} clean_end={ended} last={types[-1:]}")  # fmt: skip
    assert not reset
    assert ended  # the body's last chunk: a clean end, nothing cut
    assert body.endswith(b"\n\n")  # no partial event
    assert "slow_client_warning" in types
    assert types[-1] == "client_evicted"
