"""Replay for a resuming subscriber: resync, ring events after the cursor, completion (EB-7).

Everything is force-pushed (it bypasses the queue caps, EB-3), so a resumed subscriber
is never evicted for its replay backlog. Synchronous; never awaits.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from sessions.bus.frame import synthetic_frame
from sessions.bus.queue import Subscription
from sessions.bus.ring import Ring

logger = logging.getLogger("qwenweb.bus")


def replay(
    sub: Subscription,
    ring: Ring,
    next_id: int,
    bus_epoch: str,
    cursor: int,
    epoch: str | None,
    session: str,
    *,
    gap: tuple[int, int] | None = None,
    lineage: Mapping[str, int] | None = None,
) -> tuple[str | None, int]:
    """Queue EB-7's replay into ``sub`` for a client whose cursor is ``cursor`` (``>= 0``).

    In order: an optional ``state_resync_required`` (``epoch_reset`` when the cursor is
    not below ``next_id`` or ``epoch`` differs from ``bus_epoch``; ``ring_evicted`` when
    events after the cursor are gone), the ring events after the cursor (the whole ring
    after an epoch reset), then ``replay_complete``. ``ring`` holds contiguous ids but for
    a forked epoch's ``gap`` (EB-23): an ``epoch`` of
    ``lineage`` with a cursor at or below its shared id counts as ``bus_epoch``; a cursor
    inside the gap has missed nothing before the gap's end with ``bus_epoch``, and is
    from a lost tail (``epoch_reset``) without an epoch.

    Returns ``(resync reason or None, events replayed)`` for the bus's counters; logs one
    line per resync. Never raises for a valid ring.
    """
    ring.expire()
    earliest = ring.earliest_id if len(ring) else next_id
    assert earliest is not None
    resync: dict[str, Any] | None = None
    replay_from = cursor
    shared = lineage is not None and epoch is not None and cursor <= lineage.get(epoch, -1)
    mismatch = epoch is not None and epoch != bus_epoch and not shared
    first_missed = cursor + 1
    in_gap = gap is not None and gap[0] < cursor < gap[1]
    if gap is not None and gap[0] <= cursor < gap[1]:
        first_missed = gap[1]  # ids inside the gap were never issued in this epoch
    if cursor >= next_id or mismatch or (in_gap and epoch is None):
        resync = {
            "reason": "epoch_reset",
            "lastDeliveredId": cursor,
            "earliestAvailableId": earliest,
        }
        if mismatch:
            resync["detail"] = "epoch_mismatch"
        replay_from = 0  # the whole ring
    elif earliest > first_missed:
        # Covers both a ring that dropped events after the cursor and an empty ring
        # on a bus whose ids were issued elsewhere (start_id after a restart).
        resync = {
            "reason": "ring_evicted",
            "lastDeliveredId": cursor,
            "earliestAvailableId": earliest,
        }
    if resync is not None:
        logger.info(
            "state_resync_required session=%s subscriber=%s reason=%s lastDeliveredId=%d "
            "earliestAvailableId=%d%s",
            session,
            sub.label,
            resync["reason"],
            cursor,
            earliest,
            " detail=epoch_mismatch" if "detail" in resync else "",
        )
        sub._force_push(synthetic_frame("state_resync_required", resync))
    replayed = 0
    last_replayed: int | None = None
    # Ids in the ring are contiguous, so the first frame after the cursor is computed,
    # not searched: replay costs O(replayed), not O(ring).
    for frame in ring.frames_after(replay_from):
        sub._force_push(frame)
        replayed += 1
        last_replayed = frame.id
    complete: dict[str, Any] = {"replayedCount": replayed}
    if last_replayed is not None:
        complete["lastReplayedEventId"] = last_replayed
    sub._force_push(synthetic_frame("replay_complete", complete))
    return (resync["reason"] if resync is not None else None), replayed
