"""Helpers of the bus's unit tests (``tests/unit/test_bus_*.py``): events of a known size,
bounded reads, one-line log checks.

Those tests are written from the contract: ``docs/protocol.md``, its rule index, "Frames"
(the envelope) and "Errors and limits" (the constants); comments name those sections in
quotes and each test cites the rule it checks. Caps are tiny (ring 3, max_queued 2 or 4,
byte caps of a few hundred bytes) so that every edge is two or three publishes away. Every
wait is bounded by ``asyncio.timeout``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sessions.bus import EventBus, Frame, Subscription

REPO_ROOT = Path(__file__).resolve().parents[2]
TS = 1_700_000_000_000  # a caller-supplied serverTimestamp keeps frame sizes predictable
EPOCH_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def ev(data: Any = "x", type_: str = "t") -> dict[str, Any]:
    """An event whose frame size is known in advance (see ``size``)."""
    return {"type": type_, "data": data, "_meta": {"serverTimestamp": TS}}


def size(event_id: int, data: Any = "x", type_: str = "t") -> int:
    """UTF-8 length of the compact JSON of ``ev(data, type_)`` published as ``event_id``."""
    envelope = {"id": event_id, "v": 1, "type": type_, "data": data}
    envelope["_meta"] = {"serverTimestamp": TS}
    return len(json.dumps(envelope, separators=(",", ":"), ensure_ascii=False).encode())


def label(frame: Mapping[str, Any]) -> int | str:
    """An event's id, or a synthetic frame's type: enough to compare streams in one line."""
    return frame["id"] if "id" in frame else frame["type"]


async def take(sub: Subscription, n: int) -> list[Frame]:
    async with asyncio.timeout(1):
        return [await anext(sub) for _ in range(n)]


async def drain(sub: Subscription) -> list[Frame]:
    """Every remaining frame; fails (TimeoutError) if the iterator does not end."""
    async with asyncio.timeout(1):
        return [frame async for frame in sub]


def pub(bus: EventBus, event: Any) -> Frame:
    """Publish and return the frame, failing the test if publish refused it."""
    frame = bus.publish(event)
    assert frame is not None, "publish returned None"
    return frame


def wire(frame: Frame) -> Any:
    """The frame's serialized bytes, parsed back."""
    assert frame.json is not None
    return json.loads(frame.json)


def publish_n(bus: EventBus, n: int) -> None:
    for _ in range(n):
        assert bus.publish(ev()) is not None


def assert_one_line(records: list[logging.LogRecord]) -> None:
    assert len(records) == 1, [r.getMessage() for r in records]
    text = logging.Formatter().format(records[0])
    assert "\n" not in text, text
