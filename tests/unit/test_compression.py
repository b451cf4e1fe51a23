"""EB-17: negotiation and the per-stream gzip member (sessions.wire.compression) and the
route's ``send`` wrapper (sessions.transport.compressed)."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from typing import Any

import pytest

from sessions.transport.compressed import CompressedSend
from sessions.wire import HEARTBEAT
from sessions.wire.compression import STORED_MAX, GzipStream, negotiate

FRAME = b'id: %d\nevent: session_update\ndata: {"v":1,"id":%d,"data":{"text":"w%d "}}\n\n'


@pytest.mark.parametrize(
    ("header", "codec"),
    [
        (b"gzip, deflate, br, zstd", "gzip"),
        (b"GZIP", "gzip"),
        (b"x-gzip", "gzip"),
        (b"*", "gzip"),
        (b"br;q=1, gzip;q=0.1", "gzip"),
        (None, None),
        (b"", None),
        (b"br, zstd", None),
        (b"gzip;q=0, *", None),
        (b"gzip;q=zero", None),
        (b"identity", None),
    ],
)
def test_negotiate_answers_gzip_only_when_accepted(header, codec):
    assert negotiate(header) == codec


def test_every_write_decodes_at_once_against_what_came_before():
    stream, inflate = GzipStream(), zlib.decompressobj(31)
    for n in range(20):
        assert inflate.decompress(stream.write(FRAME % (n, n, n))) == FRAME % (n, n, n)


def test_released_contexts_still_make_one_member_with_a_valid_trailer():
    stream = GzipStream()
    frames = [FRAME % (n, n, n) for n in range(30)]
    body = b""
    for n, frame in enumerate(frames):
        body += stream.write(frame)
        if n % 7 == 0:
            stream.release()
            assert not stream.holds_context
    body += stream.end()
    inflate = zlib.decompressobj(31)  # stops after one member: all of it must be in it
    assert inflate.decompress(body) == b"".join(frames)
    assert inflate.eof
    assert inflate.unused_data == b""
    assert gzip.decompress(body) == b"".join(frames)  # checks CRC-32 and length


def test_small_writes_without_a_context_take_none_and_still_decode_at_once():
    # The retry line and an idle stream's heartbeats: stored blocks, no context (memory).
    stream, inflate = GzipStream(), zlib.decompressobj(31)
    pieces = [b"retry: 1000\n\n", HEARTBEAT, FRAME % (1, 1, 1), HEARTBEAT, b"x" * STORED_MAX]
    body = b""
    for index, piece in enumerate(pieces):
        if index == 3:
            stream.release()  # (a heartbeat after an idle spell)
        out = stream.write(piece)
        assert inflate.decompress(out) == piece
        assert stream.holds_context == (index == 2), index
        body += out
    body += stream.write(b"y" * (STORED_MAX + 1))  # (larger: compressed, with a context)
    assert stream.holds_context
    body += stream.end()
    assert gzip.decompress(body) == b"".join(pieces) + b"y" * (STORED_MAX + 1)


def test_end_is_idempotent_and_ends_writing():
    stream = GzipStream()
    body = stream.end(b"only")
    assert stream.end() == b""
    assert gzip.decompress(body) == b"only"
    with pytest.raises(ValueError, match="ended"):
        stream.write(b"late")


def test_context_keeps_token_frames_small():
    stream = GzipStream()
    frames = [FRAME % (n, n, n) for n in range(200)]
    compressed = sum(len(stream.write(frame)) for frame in frames)
    assert compressed < 0.35 * sum(map(len, frames))


def _body(message: dict[str, Any]) -> bytes:
    return bytes(message["body"])


def test_compressed_send_gives_the_context_back_after_a_heartbeat():
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def run() -> CompressedSend:
        wrapped = CompressedSend(send)
        await wrapped({"type": "http.response.body", "body": FRAME % (1, 1, 1), "more_body": True})
        assert wrapped.holds_context
        await wrapped({"type": "http.response.body", "body": HEARTBEAT, "more_body": True})
        assert not wrapped.holds_context
        await wrapped({"type": "http.response.body", "body": b"", "more_body": False})
        return wrapped

    asyncio.run(run())
    assert gzip.decompress(b"".join(map(_body, sent))) == FRAME % (1, 1, 1) + HEARTBEAT
    assert [m["more_body"] for m in sent] == [True, True, False]
