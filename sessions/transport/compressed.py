"""The stream route's compression hook: which streams are compressed, and their ``send``.

Rules: EB-17 (docs/protocol.md, "Compression"). The frame bytes of a real event are made
once and shared by every subscriber (:class:`~sessions.wire.FrameEncoder`); compression is
per stream, so it wraps ``send`` after them: the pump and the route write plain SSE bytes
and never know. Concurrency: one :class:`CompressedSend` per stream, on the event loop.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import parse_qs

from asgiref.typing import ASGISendCallable, ASGISendEvent

from sessions.errors import ApiError
from sessions.wire import HEARTBEAT, sanitize_for_log
from sessions.wire.compression import GzipStream, negotiate

__all__ = ["GZIP_HEADERS", "CompressedSend", "stream_codec"]

GZIP_HEADERS: Final = ((b"content-encoding", b"gzip"),)
"""Response headers of a compressed stream (``Vary: Accept-Encoding`` is on every stream)."""


def stream_codec(enabled: bool, accept_encoding: bytes | None, query_string: bytes) -> str | None:
    """Return ``"gzip"`` when this stream is compressed, else None (EB-17).

    ``enabled`` is the deployment's ``STREAM_COMPRESSION``; ``?compress=0`` turns it off
    for one stream (``?compress=1`` or no parameter: negotiated from ``Accept-Encoding``).
    Raises ApiError (400 ``invalid_compress``) for any other value or a repeated parameter.
    """
    try:
        values = parse_qs(query_string.decode("latin-1"), keep_blank_values=True).get("compress")
    except ValueError:
        values = None
    if values and (len(values) > 1 or values[0] not in ("0", "1")):
        raise ApiError(
            400,
            "invalid_compress",
            "compress must be given once, as 0 or 1",
            log_extra=f" value={sanitize_for_log(','.join(values))!r}",
        )
    if not enabled or values == ["0"]:
        return None
    return negotiate(accept_encoding)


class CompressedSend:
    """An ASGI ``send`` that gzips the body messages of one stream (EB-17).

    Each body message's bytes go out compressed and flushed, so a frame is decodable as
    soon as its message is sent; the message with ``more_body`` False ends the gzip
    member. After a ``: heartbeat`` (the stream was idle for the heartbeat interval) and
    on :meth:`release`, the deflate context is given back: an idle stream holds none.
    Other messages pass through unchanged. Raises whatever ``send`` raises.
    """

    __slots__ = ("_gzip", "_send")

    def __init__(self, send: ASGISendCallable, gzip: GzipStream | None = None) -> None:
        self._send = send
        self._gzip = gzip if gzip is not None else GzipStream()

    @property
    def holds_context(self) -> bool:
        """Whether the stream holds a deflate context now."""
        return self._gzip.holds_context

    def release(self) -> None:
        """Give the deflate context back until the next write. Never raises."""
        self._gzip.release()

    async def __call__(self, message: ASGISendEvent) -> None:
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        body = message["body"]
        more_body = message.get("more_body", False)
        data = self._gzip.write(body) if more_body else self._gzip.end(body)
        await self._send({"type": "http.response.body", "body": data, "more_body": more_body})
        if body is HEARTBEAT:  # idle for the heartbeat interval: keep no context
            self._gzip.release()
