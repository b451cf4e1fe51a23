"""EB-17: the stream gzipped per stream when the request accepts it (docs/protocol.md,
"Compression"), through the real ASGI application."""

from __future__ import annotations

import gzip
import zlib
from typing import Any

import pytest

from sessions.auth import issue_token
from sessions.wire import ServerSentEvent, SSEParser
from tests.integration.conftest import Stream, assert_error, bearer, call, close, publish

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

BROWSER = {"accept-encoding": "gzip, deflate, br, zstd"}


def _token(n: int) -> dict[str, Any]:
    text = {"type": "text", "text": f"word{n} "}
    return {
        "type": "session_update",
        "data": {"sessionUpdate": "agent_message_chunk", "content": text},
    }


class _Gunzip:
    """Decode a gzipped body chunk by chunk; parse the decoded SSE as it comes."""

    def __init__(self) -> None:
        self.inflate = zlib.decompressobj(zlib.MAX_WBITS | 16)
        self.events: list[ServerSentEvent] = []
        self.parser = SSEParser(self.events.append)

    def feed(self, chunk: bytes) -> None:
        self.parser.feed_bytes(self.inflate.decompress(chunk))


async def _published(sid: str, count: int) -> None:
    for n in range(count):
        assert (await publish(sid, _token(n))).status == 200


async def test_stream_is_gzipped_when_accepted_and_every_chunk_decodes_at_once(
    make_session, stream_of
):
    sid = await make_session()
    stream = await stream_of(sid, headers=BROWSER)
    assert stream.headers["content-encoding"] == "gzip"
    assert stream.headers["vary"] == "accept-encoding"
    gunzip = _Gunzip()
    gunzip.feed(await stream.read_chunk())  # retry: 3000
    for n in range(5):
        await _published(sid, 1)
        gunzip.feed(await stream.read_chunk())
        assert [e.last_event_id for e in gunzip.events] == [str(i + 1) for i in range(n + 1)]
    assert [e.type for e in gunzip.events] == ["session_update"] * 5


async def test_stream_without_accept_encoding_is_plain_and_varies(make_session, stream_of):
    sid = await make_session()
    stream = await stream_of(sid)
    assert "content-encoding" not in stream.headers
    assert stream.headers["vary"] == "accept-encoding"
    assert await stream.read_chunk() == b"retry: 3000\n\n"


@pytest.mark.parametrize("accept", ["br, zstd", "gzip;q=0, *", "identity"])
async def test_stream_is_plain_when_gzip_is_not_accepted(make_session, stream_of, accept):
    sid = await make_session()
    stream = await stream_of(sid, headers={"accept-encoding": accept})
    assert "content-encoding" not in stream.headers


async def test_compress_0_turns_compression_off_for_one_stream(make_session, stream_of):
    sid = await make_session()
    stream = await stream_of(sid, headers=BROWSER, query="compress=0")
    assert "content-encoding" not in stream.headers
    assert await stream.read_chunk() == b"retry: 3000\n\n"


async def test_setting_turns_compression_off_for_the_deployment(
    make_session, stream_of, qwenweb_settings
):
    qwenweb_settings(STREAM_COMPRESSION=False)
    sid = await make_session()
    stream = await stream_of(sid, headers=BROWSER)
    assert "content-encoding" not in stream.headers


async def test_a_session_created_with_compression_off_is_never_gzipped(make_session, stream_of):
    # The per-session switch (POST /session ``streamCompression``): whatever the request
    # accepts and even with ?compress=1; a session with the default beside it is gzipped.
    creator = bearer(issue_token("*", ["create"]))
    created = await call(
        "POST", "/session", headers=creator, json_body={"streamCompression": False}
    )
    assert created.status == 201
    assert created.json()["streamCompression"] is False
    sid = created.json()["id"]
    for query in ("", "compress=1"):
        stream = await stream_of(sid, headers=BROWSER, query=query)
        assert "content-encoding" not in stream.headers
        assert stream.headers["vary"] == "accept-encoding"
        assert await stream.read_chunk() == b"retry: 3000\n\n"
        await _published(sid, 1)
        assert b"word0" in await stream.read_chunk()
    default = await call("POST", "/session", headers=creator, json_body={})
    assert default.json()["streamCompression"] is True
    other = await stream_of(default.json()["id"], headers=BROWSER)
    assert other.headers["content-encoding"] == "gzip"
    made = await make_session(stream_compression=False)  # manage.py create_session's way
    assert "content-encoding" not in (await stream_of(made, headers=BROWSER)).headers


@pytest.mark.parametrize("query", ["compress=yes", "compress=1&compress=0", "compress="])
async def test_bad_compress_parameter_is_400_naming_it(make_session, stream_of, query):
    sid = await make_session()
    stream = await (await stream_of(sid, headers=BROWSER, query=query)).read_to_end()
    assert "compress" in assert_error(stream, 400, "invalid_compress")["error"]


async def test_ended_stream_is_one_complete_gzip_member(make_session, stream_of):
    sid = await make_session()
    stream = await stream_of(sid, headers=BROWSER)
    await stream.read_chunk()
    await _published(sid, 3)
    await close(sid)
    body = b"".join([*stream.chunks, *[await _chunk(stream) for _ in _until_end(stream)]])
    plain = gzip.decompress(body)  # checks the CRC-32 and length of the trailer
    events: list[ServerSentEvent] = []
    parser = SSEParser(events.append)
    parser.feed_bytes(plain)
    assert [e.type for e in events][-1] == "session_closed"
    updates = [e.last_event_id for e in events if e.type == "session_update"]
    assert updates == ["1", "2", "3"]


def _until_end(stream: Stream) -> Any:
    for _ in range(50):  # bounded: 3 events, session_closed and the end
        if stream.ended:
            return
        yield


async def _chunk(stream: Stream) -> bytes:
    message = await stream._receive()
    assert message["type"] == "http.response.body", message
    stream.ended = not message.get("more_body", False)
    return bytes(message.get("body", b""))


async def test_heartbeats_of_a_gzipped_stream_decode(make_session, stream_of, qwenweb_settings):
    qwenweb_settings(HEARTBEAT_INTERVAL_S=0.05)
    sid = await make_session()
    stream = await stream_of(sid, headers=BROWSER)
    inflate = zlib.decompressobj(31)
    decoded = [inflate.decompress(await stream.read_chunk()) for _ in range(3)]
    assert decoded == [b"retry: 3000\n\n", b": heartbeat\n\n", b": heartbeat\n\n"]
