"""Request bodies that do not arrive in time are answered 408 and closed (issue 26,
point 3), under the production entry point (``python -m qwenweb.serve``).

600 slow bodies (a third each to ``/session`` and ``/accounts/login/`` without a
credential, a third to a publish URL with a token), each sending its headers and 10 of
its 1000 announced bytes, then nothing: every one must read 408 and the end of the
connection within its bound + 5 s, while ordinary requests are served meanwhile.
Bounds are shortened (1 s anonymous, 2 s with a credential) to keep the test lean.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.server import (
    RemoteSession,
    ServerProcess,
    free_port,
    get_json,
    serve_argv,
    server_env,
)

ANONYMOUS_S, CREDENTIAL_S = 1.0, 2.0


pytestmark = [pytest.mark.e2e]


@pytest.fixture(scope="module")
def granian(
    e2e_database: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    port = free_port()
    env = server_env(
        e2e_database,
        QWENWEB_ANONYMOUS_BODY_TIMEOUT_S=str(ANONYMOUS_S),
        QWENWEB_REQUEST_BODY_TIMEOUT_S=str(CREDENTIAL_S),
    )
    server = ServerProcess(
        serve_argv(port), port, env, tmp_path_factory.mktemp("logs") / "granian.log"
    ).start()
    yield server
    server.stop()


async def _slow_body(port: int, path: str, token: str | None) -> tuple[bytes, float]:
    """Send headers and 10 of 1000 bytes; return the status line and when EOF came."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}"
        'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"type": '.encode()
    )
    await writer.drain()
    try:
        async with asyncio.timeout(CREDENTIAL_S + 5):
            answer = await reader.read()  # to EOF
    finally:
        writer.close()
    return answer.split(b"\r\n", 1)[0], time.monotonic()


def test_600_slow_bodies_are_answered_408_and_closed_within_their_bound(
    granian: ServerProcess,
) -> None:
    session = RemoteSession.create(granian.base_url)
    paths = [("/session", None, ANONYMOUS_S), ("/accounts/login/", None, ANONYMOUS_S),
             (session.events_path, session.publish_token, CREDENTIAL_S)]  # fmt: skip

    async def run() -> tuple[list[tuple[bytes, float]], float, int]:
        started = time.monotonic()
        slow = [
            asyncio.create_task(_slow_body(granian.port, path, token))
            for n in range(600)
            for path, token, _ in [paths[n % 3]]
        ]
        served = 0
        while not all(task.done() for task in slow) and served < 200:
            await asyncio.to_thread(get_json, f"{granian.base_url}/capabilities")
            served += 1
        return await asyncio.gather(*slow), started, served

    results, started, served = asyncio.run(run())
    late = [
        (n, line, round(at - started, 2))
        for n, (line, at) in enumerate(results)
        if line != b"HTTP/1.1 408 Request Timeout" or at - started > paths[n % 3][2] + 5
    ]
    print(f"slow bodies=600 served meanwhile={served} last closed at "
          f"{max(at for _, at in results) - started:.2f} s")  # fmt: skip
    assert late == []
    assert served >= 1
    assert "code=body_timeout" in granian.log()


def test_an_invalid_chunk_size_line_is_400_not_a_500(granian: ServerProcess) -> None:
    # granian hands the application http.disconnect for it, and answered a request left
    # unanswered with its own plain-text 500.
    async def send_bad_chunk() -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", granian.port)
        writer.write(
            b"POST /session HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/json\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"
        )
        try:
            async with asyncio.timeout(10):
                return await reader.read()
        finally:
            writer.close()

    answer = asyncio.run(send_bad_chunk())
    assert answer.startswith(b"HTTP/1.1 400")
    assert b'"code":"invalid_request"' in answer
