"""The load-session body, bounded: the newest events of the ring, written out as it is read.

``GET /session/<id>?limit=N&before=<id>`` (docs/protocol.md, "GET /session/<id>") answers at
most ``limit`` events (default ``SNAPSHOT_LIMIT``, at most ``SNAPSHOT_MAX_LIMIT``) and at most
``SNAPSHOT_MAX_BYTES`` of them, the newest first chosen, oldest first written; ``compact=1``
merges runs of token events of the chosen page (:meth:`SnapshotPage.compacted`). The events
are the bytes serialized at publish time: :class:`SnapshotPage` keeps references to them
(never a copy of the ring) and :meth:`SnapshotPage.chunks` writes them out one by one, so
answering a ring of 300 MiB costs at most one page of bytes in flight, not the ring again.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, Protocol

import orjson

from sessions.backends.compaction import compact_events
from sessions.bus import EventBus, Frame

__all__ = ["SnapshotPage", "snapshot_page"]

CHUNK_BYTES: Final = 64 * 1024
"""Small events are written out in pieces of about this size (fewer ASGI messages)."""


@dataclass(frozen=True, slots=True)
class SnapshotPage:
    """One bounded snapshot: ``head`` (every field but ``events``) and ``events``.

    ``head``: ``{"id", "title", "status", "createdAt", "lastEventId", "epoch",
    "subscriberCount", "ringSize", "earliestAvailableId", "firstEventId", "hasOlder"}``.
    ``events``: each entry's JSON bytes, oldest first: the frames' own ``json`` objects
    (shared with the ring, not copied), preceded by the synthetic ``history_truncated``
    entry when the page reaches the ring's start and events before it are gone.
    """

    head: dict[str, Any]
    events: tuple[bytes, ...]

    def chunks(self) -> Iterator[bytes]:
        """Yield the JSON body in pieces: the head, then the events, then the closing.

        An event of ``CHUNK_BYTES`` or more is yielded as its own bytes object (no copy);
        smaller ones are joined into pieces of about ``CHUNK_BYTES``. Never raises.
        """
        opening = orjson.dumps({**self.head, "events": []}, default=str)
        assert opening.endswith(b"[]}")
        pending: list[bytes] = [opening[:-2]]
        size = len(pending[0])
        for index, event in enumerate(self.events):
            if index:
                pending.append(b",")
                size += 1
            if len(event) >= CHUNK_BYTES:
                yield b"".join(pending)
                yield event
                pending, size = [], 0
                continue
            pending.append(event)
            size += len(event)
            if size >= CHUNK_BYTES:
                yield b"".join(pending)
                pending, size = [], 0
        pending.append(b"]}")
        yield b"".join(pending)

    def body(self) -> bytes:
        """The whole body at once (tests and small pages)."""
        return b"".join(self.chunks())

    def compacted(self) -> SnapshotPage:
        """Return this page with its runs of token events merged (``?compact=1``).

        The same head (``firstEventId``, ``hasOlder``, ``lastEventId``: the page chose its
        events, ``limit`` counted them raw), the events through
        :func:`~sessions.backends.compaction.compact_events`. Never raises.
        """
        return SnapshotPage(self.head, compact_events(self.events))


class LoadedSession(Protocol):
    """What a snapshot reads of a ``LiveSession`` (sessions/backends/base.py)."""

    @property
    def session_id(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def created_at(self) -> str: ...
    @property
    def bus(self) -> EventBus: ...


def _event_bytes(frame: Frame) -> bytes:
    return frame.json if frame.json is not None else orjson.dumps(dict(frame), default=str)


def snapshot_page(
    live: LoadedSession,
    *,
    limit: int,
    max_bytes: int,
    before: int | None = None,
    subscriber_count: int | None = None,
) -> SnapshotPage:
    """Choose the newest ``limit`` events with an id below ``before`` (all when None).

    Events are taken newest first while their JSON bytes (plus one separator each) stay
    within ``max_bytes``; the newest one is always taken, however large, so that every event
    can be read. ``hasOlder``: the ring holds events older than the page (ask again with
    ``before=firstEventId``). ``earliestAvailableId`` is the ring's first id (the next id
    when empty); ``subscriber_count`` overrides this process's count (a sum over processes).
    Reads the ring on the loop, in one step (no await); keeps references only. Never raises.
    """
    bus = live.bus
    ring = bus.ring_snapshot()  # references to the frames, not their bytes
    earliest = ring[0].id if ring else bus.next_id
    assert earliest is not None
    end = len(ring) if before is None else bisect_left(ring, before, key=_frame_id)
    picked: list[bytes] = []
    size = 0
    index = end
    while index > 0 and len(picked) < limit:
        data = _event_bytes(ring[index - 1])
        if picked and size + len(data) + 1 > max_bytes:
            break
        picked.append(data)
        size += len(data) + 1
        index -= 1
    picked.reverse()
    first_id = ring[index].id if picked else None
    has_older = index > 0
    if not has_older and earliest > 1:
        truncated = {"v": 1, "type": "history_truncated", "data": {"earliestAvailableId": earliest}}
        picked.insert(0, orjson.dumps(truncated))
    head = {
        "id": live.session_id,
        "title": live.title,
        "status": "closed" if bus.closed else "open",
        "createdAt": live.created_at,
        "lastEventId": _last_issued(bus),
        "epoch": bus.epoch,
        "subscriberCount": bus.subscriber_count if subscriber_count is None else subscriber_count,
        "ringSize": bus.ring_size,
        "earliestAvailableId": earliest,
        "firstEventId": first_id,
        "hasOlder": has_older,
    }
    return SnapshotPage(head, tuple(picked))


def _last_issued(bus: EventBus) -> int | None:
    """The last id ``bus`` issued: 0 before the first event of a sequence starting at 1,
    None when its epoch started above 1 and has issued nothing yet (a memory-only bus
    rebuilt after a restart: ``start_id - 1`` was reserved, never issued; EB-1). A forked
    epoch that has issued nothing of its own yet: its fork id (shared with its parent)."""
    last = bus.last_event_id
    if last >= bus.start_id or bus.start_id == 1 or (bus.gap is not None and last == bus.gap[0]):
        return last
    return None


def _frame_id(frame: Frame) -> int:
    assert frame.id is not None  # the ring holds real events only
    return frame.id
