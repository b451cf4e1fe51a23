"""Frames: the envelope of one event or synthetic frame, built and serialized once.

Protocol: ``docs/protocol.md``, "Frames" (the envelope), EB-2 and EB-10.

A :class:`Frame` is a read-only mapping in envelope key order. A published event is
serialized to compact JSON once (:attr:`Frame.json`) and every subscriber and the wire
share those bytes; synthetic frames carry no ``id`` and no bytes (the writer stamps them
when it writes them, EB-18). A real event keeps *only* its bytes (plus ``id`` and
``type``): its other fields are parsed from :attr:`Frame.json` when a reader asks for one
(docs/protocol.md, "Ring limits"), so what a ring holds is what its byte limit counts,
whatever the payload's shape. Framing them as SSE is the wire package's job, not the
bus's: ``sessions.wire.FrameEncoder`` frames each event once and caches the bytes itself.

Everything here is pure and synchronous; nothing imports Django or Redis.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, Final

import orjson

from sessions.bus.limits import EVENT_SCHEMA_VERSION, MAX_SAFE_INTEGER

__all__ = [
    "Frame",
    "disconnect_frame",
    "encode_envelope",
    "envelope_fields",
    "is_valid_epoch",
    "parse_json",
    "synthetic_frame",
]

logger = logging.getLogger("qwenweb.bus")

_EPOCH_ALPHABET: Final = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
)
_FORBIDDEN_TYPE_CHARS: Final = ("\r", "\n", "\0")
# A run of 19+ digits may be an integer beyond 64 bits, which orjson reads as a float.
_LONG_DIGITS: Final = re.compile(rb"[0-9]{19,}")


def is_valid_epoch(value: object) -> bool:
    """Return whether ``value`` is an epoch token: ``[A-Za-z0-9_-]{1,64}`` (EB-10, EB-13).

    Never raises.
    """
    return (
        isinstance(value, str)
        and 1 <= len(value) <= 64
        and all(ch in _EPOCH_ALPHABET for ch in value)
    )


class Frame(Mapping[str, Any]):
    """One frame: a read-only mapping in envelope key order (docs/protocol.md, "Frames").

    Keys, in order, absent ones left out: ``id`` (real events only), ``v``, ``type``,
    ``data``, ``_meta``, ``originatorClientId``.

    Attributes:
        id: the per-session event id (``int >= 1``), or ``None`` on a synthetic frame.
        type: the event type (non-empty, no CR/LF/NUL).
        json: the whole envelope as compact UTF-8 JSON, serialized once; ``None`` when
            the data could not be serialized (EB-2) or for a synthetic frame whose bytes
            the writer produces itself (synthetic frames get a timestamp at write time).
        nbytes: ``len(json)`` (0 when ``json`` is None): what counts against the byte caps.
        accepted_at: ``time.monotonic()`` when a bus of this process accepted the event
            (``publish`` or ``ingest``); 0.0 for a synthetic frame. Operators measure the
            delivery latency from it.

    A frame built by :meth:`from_json` holds no parsed fields: reading a key parses
    ``json`` each time (nothing is cached, so the frame's memory stays ``nbytes`` plus a
    constant: docs/protocol.md, "Ring limits"). The delivery path reads only ``id``,
    ``type`` and ``json``.
    """

    __slots__ = ("_fields", "accepted_at", "id", "json", "nbytes", "type")

    def __init__(self, fields: dict[str, Any], json: bytes | None) -> None:
        self._fields: Mapping[str, Any] | None = MappingProxyType(fields)
        self.id: int | None = fields.get("id")
        self.type: str = fields["type"]
        self.json = json
        self.nbytes = len(json) if json is not None else 0
        self.accepted_at = 0.0

    @classmethod
    def from_json(cls, event_id: int, event_type: str, json: bytes) -> Frame:
        """A real event that keeps only its bytes (``json``: the whole envelope, with
        ``"id": event_id`` and ``"type": event_type``); fields are parsed on demand."""
        frame = cls.__new__(cls)
        frame._fields = None
        frame.id = event_id
        frame.type = event_type
        frame.json = json
        frame.nbytes = len(json)
        frame.accepted_at = 0.0
        return frame

    @property
    def synthetic(self) -> bool:
        """Whether the frame was made up by the bus or route (it has no ``id``)."""
        return self.id is None

    def _view(self) -> Mapping[str, Any]:
        if self._fields is not None:
            return self._fields
        assert self.json is not None
        fields: Mapping[str, Any] = parse_json(self.json)
        return fields

    def __getitem__(self, key: str) -> Any:
        return self._view()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._view())

    def __len__(self) -> int:
        return len(self._view())

    def __repr__(self) -> str:
        return f"Frame({dict(self._view())!r})"


def parse_json(raw: bytes) -> Any:
    """Parse JSON bytes written by this package (orjson; integers beyond 64 bits exact).

    Raises ``ValueError`` for bytes that are not JSON.
    """
    if _LONG_DIGITS.search(raw):
        return json.loads(raw)
    return orjson.loads(raw)


def synthetic_frame(event_type: str, data: Any, *, retry_ms: int | None = None) -> Frame:
    """Build a synthetic frame ``{"v": 1, "type": event_type, "data": data}`` (no id).

    Its ``json`` is ``None``: the writer serializes it when it writes it, adding
    ``_meta.serverTimestamp`` (EB-18). With ``retry_ms`` it is a :class:`RetryFrame`: the
    writer starts its block with ``retry: <retry_ms>``. Never raises for a str
    ``event_type``.
    """
    fields = {"v": EVENT_SCHEMA_VERSION, "type": event_type, "data": data}
    if retry_ms is not None:
        return RetryFrame(fields, retry_ms)
    return Frame(fields, None)


class RetryFrame(Frame):
    """A synthetic frame whose block carries a ``retry:`` line ahead of ``event:``, so a
    client sets its reconnection time before it handles the frame (the drain's
    ``server_draining``). ``retry_ms``: milliseconds. Its own class, so that no other
    frame (the ring holds many) pays for the slot."""

    __slots__ = ("retry_ms",)

    def __init__(self, fields: dict[str, Any], retry_ms: int) -> None:
        super().__init__(fields, None)
        self.retry_ms = retry_ms


def disconnect_frame(reason: str) -> Frame:
    """Build the terminal frame of ``EventBus.disconnect`` and ``disconnect_all`` (EB-9).

    Shape: ``{"v": 1, "type": "stream_error", "data": {"error": "disconnected by the
    server", "code": "server_disconnect", "reason": reason}}``. It is a ``stream_error``
    so that every client already treats it as terminal and reconnects after its
    ``retry`` (SC-12). Never raises.
    """
    return synthetic_frame(
        "stream_error",
        {"error": "disconnected by the server", "code": "server_disconnect", "reason": reason},
    )


def envelope_fields(event: Mapping[str, Any], event_id: int | None) -> dict[str, Any] | None:
    """Return the envelope of ``event`` in key order ("Frames"), or None if refused.

    ``event_id`` None leaves ``id`` out (a shared store assigns it later). Stamps
    ``_meta.serverTimestamp`` (epoch ms) unless the caller gave a finite one (EB-2).
    Returns None, with one log line, when ``type`` is missing, empty or holds CR/LF/NUL.
    Never raises.
    """
    event_type = event.get("type") if isinstance(event, Mapping) else None
    if (
        not isinstance(event_type, str)
        or not event_type
        or any(ch in event_type for ch in _FORBIDDEN_TYPE_CHARS)
    ):
        logger.warning("publish refused: type must be a non-empty string without CR/LF/NUL")
        return None
    meta_in = event.get("_meta")
    meta = dict(meta_in) if isinstance(meta_in, Mapping) else {}
    if not _is_timestamp(meta.get("serverTimestamp")):
        meta["serverTimestamp"] = time.time_ns() // 1_000_000
    fields: dict[str, Any] = {} if event_id is None else {"id": event_id}
    fields["v"] = EVENT_SCHEMA_VERSION
    fields["type"] = event_type
    if "data" in event:
        fields["data"] = event["data"]
    fields["_meta"] = meta
    originator = event.get("originatorClientId")
    if originator is not None:
        fields["originatorClientId"] = originator
    return fields


def encode_envelope(fields: Mapping[str, Any]) -> bytes | None:
    """Compact UTF-8 JSON of an envelope ("Frames"), or None if not serializable."""
    return _dumps(fields)


def _dumps(fields: Mapping[str, Any]) -> bytes | None:
    """Compact UTF-8 JSON of ``fields``, or None when it is not JSON-serializable (EB-2).

    orjson is fast but refuses integers beyond 64 bits, which are valid JSON numbers; the
    standard library serializes those (same compact form, non-ASCII kept as UTF-8).
    """
    try:
        # orjson's bytes keep a 4 KiB allocation however short the JSON; a frame lives in
        # the ring for thousands of events, so keep an exact-size copy (~0.2 us).
        return bytes(memoryview(orjson.dumps(fields)))
    except orjson.JSONEncodeError:
        pass
    try:
        return json.dumps(
            fields, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        ).encode()
    except (TypeError, ValueError, RecursionError):
        return None


def _is_timestamp(value: object) -> bool:
    """A caller's ``serverTimestamp`` is kept if it is a finite JSON-safe number (EB-2)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER
    return isinstance(value, float) and math.isfinite(value)
