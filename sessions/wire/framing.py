"""Write the SSE wire format: the bytes of the route's stream body (EB-18).

- `encode_retry`, `encode_frame`, `encode_comment` and `HEARTBEAT` are pure; they raise
  `FramingError` for any value that would change the framing instead of writing a
  stream a client would misread (SC-3 ... SC-9).
- `encode_synthetic` / `synthetic_payload` write a synthetic frame, stamping
  ``_meta.serverTimestamp`` at write time (EB-18).
- `FrameEncoder` turns any bus :class:`~sessions.bus.Frame` into its wire bytes and
  frames each real event once, however many subscribers it is fanned out to.

Concurrency: no I/O, no event loop. A `FrameEncoder` is not thread-safe: like the bus
(EB-11) it belongs to one event loop. Imports nothing from Django or Redis.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Final

import orjson

from sessions.bus import Frame
from sessions.bus.limits import MAX_SAFE_INTEGER

__all__ = [
    "DEFAULT_RETRY_MS",
    "HEARTBEAT",
    "MAX_EVENT_ID",
    "FrameEncoder",
    "FramingError",
    "encode_comment",
    "encode_frame",
    "encode_retry",
    "encode_synthetic",
    "synthetic_payload",
]

MAX_EVENT_ID: Final = MAX_SAFE_INTEGER
"""Largest event id (and Last-Event-ID cursor): the largest integer a JavaScript number
holds exactly (EB-13)."""

DEFAULT_RETRY_MS: Final = 3000
"""Reconnection time in milliseconds written first on every stream (EB-18)."""

HEARTBEAT: Final[bytes] = b": heartbeat\n\n"
"""Comment written while a stream is idle; parsers never dispatch it (SC-4, EB-18)."""


class FramingError(ValueError):
    """Raised when a value would change SSE framing."""


def encode_retry(retry_ms: int) -> bytes:
    r"""Encode a ``retry`` frame: ``encode_retry(3000) == b"retry: 3000\n\n"`` (EB-18).

    `retry_ms` is the reconnection time in milliseconds, a non-negative int (bool is not
    accepted). Raises FramingError otherwise. Pure.
    """
    if isinstance(retry_ms, bool) or not isinstance(retry_ms, int) or retry_ms < 0:
        raise FramingError(f"retry_ms must be a non-negative int, got {retry_ms!r}")
    return b"retry: %d\n\n" % retry_ms


def encode_frame(*, event_type: str, data_json: bytes, event_id: int | None = None) -> bytes:
    r"""Encode one frame: optional ``id``, ``event`` and one ``data`` line (EB-18).

    ``encode_frame(event_type="t", data_json=b'{"a":1}', event_id=7)`` returns
    ``b'id: 7\nevent: t\ndata: {"a":1}\n\n'``. `data_json` is the compact JSON of
    the whole envelope, UTF-8, written as is (serialize once, reuse the bytes).
    Synthetic frames pass ``event_id=None`` and get no ``id`` line, so they never move
    a cursor (SC-9).

    Raises FramingError when `event_type` is not a non-empty str, contains CR, LF or
    NUL or cannot be encoded as UTF-8 (a lone surrogate); when `data_json` is not bytes
    or contains a CR or LF byte (compact JSON is always one line); when `event_id` is
    not None and not an int in [1, MAX_EVENT_ID] (bool is not accepted). Pure.
    """
    type_bytes = _encode_line("event_type", event_type)
    if not type_bytes:
        raise FramingError("event_type must not be empty")
    if not isinstance(data_json, bytes):
        raise FramingError(f"data_json must be bytes, got {type(data_json).__name__}")
    if b"\n" in data_json or b"\r" in data_json:
        raise FramingError("data_json must not contain CR or LF bytes")
    if event_id is None:
        return b"event: %s\ndata: %s\n\n" % (type_bytes, data_json)
    if (
        isinstance(event_id, bool)
        or not isinstance(event_id, int)
        or not 1 <= event_id <= MAX_EVENT_ID
    ):
        raise FramingError(f"event_id must be an int in [1, 2**53 - 1]: {event_id!r}")
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (event_id, type_bytes, data_json)


def encode_comment(text: str) -> bytes:
    r"""Encode a comment frame: ``encode_comment("hi") == b": hi\n\n"`` (SC-4, EB-18).

    Parsers ignore comments (SC-4); `SSEParser` reports ``text`` to ``on_comment``.
    Raises FramingError when `text` is not a str, contains CR, LF or NUL, or cannot be
    encoded as UTF-8. Pure.
    """
    return b": %s\n\n" % _encode_line("text", text)


def _encode_line(name: str, value: str) -> bytes:
    """Return `value` as UTF-8 for one line of a frame; FramingError if it cannot be."""
    if not isinstance(value, str):
        raise FramingError(f"{name} must be a str, got {type(value).__name__}")
    if "\r" in value or "\n" in value or "\x00" in value:
        raise FramingError(f"{name} must not contain CR, LF or NUL: {value!r}")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FramingError(f"{name} is not encodable as UTF-8: {value!r}") from exc


def synthetic_payload(frame: Frame) -> tuple[bytes, bytes]:
    r"""Write a synthetic frame now: return ``(wire_bytes, data_json)`` (EB-18).

    ``data_json`` is the compact JSON written on the frame's ``data:`` line, exactly: the
    envelope with ``_meta`` replaced by ``{"serverTimestamp": <epoch ms now>}``. The wire
    bytes are ``event: <type>\ndata: <data_json>\n\n``, with no ``id`` line, so the frame
    never moves a client's cursor (SC-9); a frame with ``retry_ms`` starts with
    ``retry: <ms>\n`` (the drain's ``server_draining``). An observer can keep ``data_json`` without
    parsing the wire bytes back.

    Never raises for a synthetic frame made by the bus or the route; raises FramingError
    or ``orjson.JSONEncodeError`` (a TypeError) for data that cannot be written.
    """
    envelope = dict(frame)
    envelope["_meta"] = {"serverTimestamp": time.time_ns() // 1_000_000}
    data_json = orjson.dumps(envelope)
    wire = encode_frame(event_type=frame.type, data_json=data_json)
    retry_ms = getattr(frame, "retry_ms", None)  # a RetryFrame
    if retry_ms is not None:  # in the same block: set before the frame is handled
        wire = encode_retry(retry_ms).removesuffix(b"\n") + wire
    return wire, data_json


def encode_synthetic(frame: Frame) -> bytes:
    """Return the wire bytes of a synthetic frame, stamped now (EB-18); no ``id`` line.

    The first half of :func:`synthetic_payload`; raises what it raises.
    """
    return synthetic_payload(frame)[0]


def _unserializable_event(frame: Frame) -> bytes:
    """EB-2: an event whose data could not be serialized goes out with ``data: null``.

    It keeps its id and type, so the client's cursor stays exact; ``_meta.dataError``
    says why the data is missing.
    """
    envelope = dict(frame)
    envelope["data"] = None
    envelope["_meta"] = {**envelope.get("_meta", {}), "dataError": "not JSON-serializable"}
    return encode_frame(
        event_type=frame.type, data_json=orjson.dumps(envelope, default=str), event_id=frame.id
    )


# A FrameEncoder's default byte budget: the wire bytes plus JSON of about two full
# byte-capped subscriber queues (2 MiB of JSON each, EB-3), so writers that lag behind by
# up to a queue still share bytes, while memory stays bounded by the caps (EB-21).
_DEFAULT_CACHE_BYTES: Final = 8 * 1024 * 1024


class FrameEncoder:
    """Turn bus frames into SSE wire bytes, framing each real event once (EB-18).

    A published event is fanned out to every subscriber of its session, and each
    subscriber's writer asks for its bytes: the encoder keeps the wire bytes of the
    events it framed last, so a hit costs one dict lookup and every writer shares one
    bytes object. The cache is keyed by ``id(frame)`` and holds the frame itself,
    checked by identity on a hit, so another frame never gets its bytes. It keeps at
    most ``cache_size`` events and, beyond the newest one, at most ``max_cache_bytes``
    of their wire bytes plus JSON: the cached frames stay alive after the ring dropped
    them, and without a byte budget a few thousand large events would hold the memory
    that the queue caps bound (EB-21). The oldest insertion is dropped first.

    Args:
        cache_size: events whose wire bytes are kept (a positive int).
        max_cache_bytes: budget in bytes for ``len(wire) + frame.nbytes`` of the cached
            events (a positive int); the newest event is cached even if it alone is
            larger, so a huge event fanned out to many subscribers is still framed once.

    Raises:
        ValueError: ``cache_size`` or ``max_cache_bytes`` is not a positive int.

    Not thread-safe: one encoder per event loop (EB-11). Never awaits.
    """

    __slots__ = ("_cache", "_cached_bytes", "_order", "cache_size", "max_cache_bytes")

    def __init__(
        self, cache_size: int = 4096, *, max_cache_bytes: int = _DEFAULT_CACHE_BYTES
    ) -> None:
        for name, value in (("cache_size", cache_size), ("max_cache_bytes", max_cache_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.cache_size = cache_size
        self.max_cache_bytes = max_cache_bytes
        self._cache: dict[int, tuple[Frame, bytes]] = {}
        # Insertion order of the cache's keys; a deque, because evicting the first key
        # of a dict that keeps losing its front is O(size) per eviction.
        self._order: deque[int] = deque()
        self._cached_bytes = 0

    def __len__(self) -> int:
        """Return how many events' wire bytes are cached (``<= cache_size``)."""
        return len(self._cache)

    def encode(self, frame: Frame) -> bytes:
        """Return the wire bytes of any bus frame: :meth:`event` or :meth:`synthetic`.

        A frame with an ``id`` is an event (cached); one without is synthetic and
        stamped now. This is what a writer calls for every frame of a subscription.
        Never raises for a Frame from the bus, except in the one case :meth:`event`
        names (unserializable data with an unwritable ``_meta`` or ``type``).
        """
        if frame.id is None:
            return synthetic_payload(frame)[0]
        entry = self._cache.get(id(frame))
        if entry is not None and entry[0] is frame:
            return entry[1]
        return self._frame_event(frame)

    def event(self, frame: Frame) -> bytes:
        r"""Return ``id: <id>\nevent: <type>\ndata: <frame.json>\n\n`` for a real event.

        Framed on the first call and cached: later calls for the same frame return the
        same bytes object. When ``frame.json`` is None (the data could not be
        serialized, EB-2) the event goes out with ``data`` null and
        ``_meta.dataError``, framed on every call and not cached.

        Never raises for an event published by the bus, except for one whose data could
        not be serialized and whose ``_meta`` or ``type`` cannot be written either (a
        non-str key or an integer beyond 64 bits in ``_meta``, a lone surrogate in the
        type): then ``orjson.JSONEncodeError`` (a TypeError). Raises ValueError for a
        frame without an ``id`` (use :meth:`synthetic`).
        """
        entry = self._cache.get(id(frame))
        if entry is not None and entry[0] is frame:
            return entry[1]
        return self._frame_event(frame)

    def synthetic(self, frame: Frame) -> tuple[bytes, bytes]:
        """Return ``(wire_bytes, data_json)`` of a synthetic frame, stamped now (EB-18).

        Never cached: each write gets its own timestamp. See :func:`synthetic_payload`.
        """
        return synthetic_payload(frame)

    def _frame_event(self, frame: Frame) -> bytes:
        if frame.id is None:
            raise ValueError("a synthetic frame has no event bytes: use synthetic()")
        if frame.json is None:
            return _unserializable_event(frame)
        wire = encode_frame(event_type=frame.type, data_json=frame.json, event_id=frame.id)
        key = id(frame)
        cache = self._cache
        replaced = cache.get(key)
        # A cached frame stays alive, so its id is never reused while cached: a key
        # already present only replaces its entry, in its place.
        if replaced is None:
            self._order.append(key)
        else:
            self._cached_bytes -= len(replaced[1]) + replaced[0].nbytes
        cache[key] = (frame, wire)
        self._cached_bytes += len(wire) + frame.nbytes
        while len(cache) > self.cache_size or (
            self._cached_bytes > self.max_cache_bytes and len(cache) > 1
        ):
            old_frame, old_wire = cache.pop(self._order.popleft())
            self._cached_bytes -= len(old_wire) + old_frame.nbytes
        return wire
