"""Compress one stream's body with gzip, frame by frame, without holding back a byte (EB-17).

- :func:`negotiate` reads ``Accept-Encoding`` (RFC 9110 §12.5.3) and answers ``"gzip"``
  or None.
- :class:`GzipStream` is one stream's compressor: each :meth:`~GzipStream.write` returns
  bytes that, appended to what came before, decode to everything written so far
  (``Z_SYNC_FLUSH``), so no frame waits for the next one. The deflate context is kept
  across writes (the envelope of a token event compresses to a few bytes against the
  previous one) and given back by :meth:`~GzipStream.release` when the stream goes idle.

One gzip member per stream, whatever the releases: the header is written once, the
deflate blocks of each context follow one another (a context starts with an empty window,
so it never points back into an earlier context's output, and every context ends on a
byte boundary after its sync flush), and the final block with the CRC-32 and length of
everything written ends the member. Every gzip decoder therefore reads it, including those
that stop after the first member of a concatenation. Chosen by measurement
(docs/benchmarks.md, "Stream compression"): a 512-byte window with ``memLevel`` 1 keeps
about 14 % of the bytes of token frames in about 9 KiB per context.

Concurrency: no I/O, no event loop; a :class:`GzipStream` belongs to one stream.
Imports nothing from Django or Redis.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

__all__ = [
    "GZIP_LEVEL",
    "GZIP_MEM_LEVEL",
    "GZIP_WINDOW_BITS",
    "STORED_MAX",
    "GzipStream",
    "negotiate",
]

GZIP_LEVEL: Final = 6
"""zlib's compression level (1 fastest … 9 smallest); 6 is zlib's default."""
GZIP_WINDOW_BITS: Final = 9
"""log2 of the deflate window (9 … 15): 512 bytes hold the last two or three token frames,
which is what they repeat."""
GZIP_MEM_LEVEL: Final = 1
"""zlib's ``memLevel`` (1 … 9): the hash table's size; 1 costs about 1 % of the bytes and
saves about 250 KiB per context against the default 8."""

STORED_MAX: Final = 64
"""A write of at most this many bytes while no deflate context is held (the ``retry:``
line, a heartbeat of an idle stream) goes out as a stored deflate block (RFC 1951
§3.2.4: 5 bytes of framing) instead of taking a context for a few bytes: an idle stream
then never allocates one, which the allocator would not give back whole (1.8 KiB per
idle gzipped stream, issue 23)."""

# RFC 1952 §2.3: magic, CM = 8 (deflate), no flags, no mtime, XFL 0, OS 255 (unknown).
_GZIP_HEADER: Final = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


def negotiate(accept_encoding: bytes | None) -> str | None:
    """Return ``"gzip"`` when ``accept_encoding`` accepts it, else None.

    ``accept_encoding`` is the raw header value (repeated headers joined with ``,``) or
    None when absent. ``gzip``, ``x-gzip`` or ``*`` with a q-value above 0 accept it; an
    explicit ``gzip;q=0`` refuses it even when ``*`` would accept. A malformed q-value
    counts as 0. Never raises.
    """
    if not accept_encoding:
        return None
    weights: dict[str, float] = {}
    for item in accept_encoding.decode("latin-1").split(","):
        name, _, params = item.partition(";")
        coding = name.strip().lower()
        quality = 1.0
        for param in params.split(";"):
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value.strip())
                except ValueError:
                    quality = 0.0
        if coding:
            weights[coding] = quality
    for coding in ("gzip", "x-gzip"):
        if coding in weights:
            return "gzip" if weights[coding] > 0 else None
    return "gzip" if weights.get("*", 0.0) > 0 else None


class GzipStream:
    """One stream body as one gzip member, flushed after every write (RFC 1952, EB-17).

    Memory: a deflate context (about 9 KiB at the module's defaults) while writing, none
    after :meth:`release` until the next write; a few integers otherwise. Not thread-safe.
    """

    __slots__ = (
        "_context",
        "_crc",
        "_ended",
        "_length",
        "_level",
        "_mem_level",
        "_started",
        "_wbits",
    )

    def __init__(
        self,
        *,
        level: int = GZIP_LEVEL,
        window_bits: int = GZIP_WINDOW_BITS,
        mem_level: int = GZIP_MEM_LEVEL,
    ) -> None:
        self._level = level
        self._wbits = -window_bits  # raw deflate: this class writes the gzip framing
        self._mem_level = mem_level
        self._context: zlib._Compress | None = None
        self._crc = 0
        self._length = 0
        self._started = False  # the header is written
        self._ended = False

    @property
    def holds_context(self) -> bool:
        """Whether a deflate context is held (memory), i.e. not released since the last write."""
        return self._context is not None

    def write(self, data: bytes) -> bytes:
        """Compress ``data`` and return bytes that complete its decoding (``Z_SYNC_FLUSH``;
        a stored block for at most :data:`STORED_MAX` bytes while no context is held).

        The first call's answer starts with the gzip header. Raises ValueError after
        :meth:`end`.
        """
        if self._ended:
            raise ValueError("the gzip stream has ended")
        head = b"" if self._started else _GZIP_HEADER
        self._started = True
        self._crc = zlib.crc32(data, self._crc)
        self._length += len(data)
        context = self._context
        if context is None:
            if len(data) <= STORED_MAX:  # (byte-aligned, like a sync flush's end)
                return head + b"\x00" + struct.pack("<HH", len(data), len(data) ^ 0xFFFF) + data
            context = self._context = self._new_context()
        out = context.compress(data) + context.flush(zlib.Z_SYNC_FLUSH)
        return head + out if head else out

    def release(self) -> None:
        """Give the deflate context back (an idle stream); the next write starts a fresh one.

        Costs the next frames some ratio (an empty window), nothing else: every write
        already ended on a sync flush, so nothing is pending. Idempotent; never raises.
        """
        self._context = None

    def end(self, data: bytes = b"") -> bytes:
        """Compress ``data`` and return the last bytes of the member (final block, trailer).

        Idempotent: a second call returns ``b""``.
        """
        if self._ended:
            return b""
        head = self.write(data) if data or not self._started else b""
        context = self._context if self._context is not None else self._new_context()
        self._ended = True
        self._context = None
        trailer = struct.pack("<II", self._crc & 0xFFFFFFFF, self._length & 0xFFFFFFFF)
        return head + context.flush(zlib.Z_FINISH) + trailer

    def _new_context(self) -> zlib._Compress:
        return zlib.compressobj(self._level, zlib.DEFLATED, self._wbits, self._mem_level)
