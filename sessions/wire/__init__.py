"""The Server-Sent Events wire format: parse it, write it, read the route's headers.

One implementation of the format for the SSE route, the Python test clients and the
benchmarks. This package imports nothing from Django or Redis; it may import
:mod:`sessions.bus` (for :class:`~sessions.bus.Frame`, the largest safe integer and the
epoch rule, each defined once there), and the bus never imports it.

- :mod:`sessions.wire.parser`: `SSEParser`, `ServerSentEvent` (WHATWG HTML §9.2.6,
  SC-1 ... SC-8).
- :mod:`sessions.wire.framing`: the bytes of the stream body (EB-18): `encode_retry`,
  `encode_frame`, `encode_comment`, `HEARTBEAT`, `encode_synthetic`, `synthetic_payload`
  and `FrameEncoder`, which frames each published event once.
- :mod:`sessions.wire.headers`: `parse_last_event_id`, `parse_epoch`, `sanitize_for_log`
  (EB-13; they never raise).

Concurrency: no I/O and no event loop here. A parser holds one stream's state and a
`FrameEncoder` its cache; neither is thread-safe.
"""

from sessions.wire.framing import (
    DEFAULT_RETRY_MS,
    HEARTBEAT,
    MAX_EVENT_ID,
    FrameEncoder,
    FramingError,
    encode_comment,
    encode_frame,
    encode_retry,
    encode_synthetic,
    synthetic_payload,
)
from sessions.wire.headers import parse_epoch, parse_last_event_id, sanitize_for_log
from sessions.wire.parser import ServerSentEvent, SSEParser

__all__ = [
    "DEFAULT_RETRY_MS",
    "HEARTBEAT",
    "MAX_EVENT_ID",
    "FrameEncoder",
    "FramingError",
    "SSEParser",
    "ServerSentEvent",
    "encode_comment",
    "encode_frame",
    "encode_retry",
    "encode_synthetic",
    "parse_epoch",
    "parse_last_event_id",
    "sanitize_for_log",
    "synthetic_payload",
]
