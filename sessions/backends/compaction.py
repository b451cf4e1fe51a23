"""Compacted history: runs of token events merged into one entry (``?compact=1``).

Rules (docs/protocol.md, "Compacted history"): consecutive ``session_update`` events of
one agent message (``data.sessionUpdate`` ``agent_message_chunk`` with a text content, the
same ``data.messageId`` or none on both) merge into one entry whose text is the run's text;
consecutive ``tool_call_update`` events of one tool call (the same ``data.toolCallId``)
merge into one whose fields are the run's fields, later ones replacing earlier ones (how an
Agent Client Protocol client applies them). Nothing else merges: not other types, not two
runs with another event between them, not events whose envelopes differ beyond ``id``,
``_meta`` and ``data`` (``originatorClientId``), not chunks whose data differs beyond the
text. A run of one event stays the event itself.

An entry: ``{"v": 1, "type": "compacted", "firstId": a, "lastId": b, "count": n,
"event": "session_update", "data": {…merged data…}, "_meta": {…of the last event…}}``.
It covers every id from ``a`` to ``b`` (``count`` = b − a + 1 events), so a cursor (an
entry's ``lastId``, a page's ``firstEventId``) is always the edge of an entry, never inside.

Pure: no I/O, no event loop; imports nothing from Django or Redis.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import orjson

__all__ = ["compact_events"]

_UPDATE: Final = "session_update"
_CHUNK: Final = "agent_message_chunk"
_TOOL_UPDATE: Final = "tool_call_update"
_MARKER: Final = b'"type":"session_update"'


def _run_key(envelope: dict[str, Any]) -> tuple[Any, ...] | None:
    """What must be equal for two consecutive events to merge; None: never merges."""
    data = envelope.get("data")
    if envelope.get("type") != _UPDATE or not isinstance(data, dict):
        return None
    kind = data.get("sessionUpdate")
    outer = tuple(
        sorted(
            (k, orjson.dumps(v)) for k, v in envelope.items() if k not in ("id", "data", "_meta")
        )
    )
    if kind == _CHUNK:
        content = data.get("content")
        if not isinstance(content, dict) or content.get("type") != "text":
            return None
        if not isinstance(content.get("text"), str):
            return None
        rest = {k: v for k, v in data.items() if k != "content"}
        others = {k: v for k, v in content.items() if k != "text"}
        return (
            _CHUNK,
            outer,
            orjson.dumps(rest, option=orjson.OPT_SORT_KEYS),
            orjson.dumps(others, option=orjson.OPT_SORT_KEYS),
        )
    if kind == _TOOL_UPDATE and isinstance(data.get("toolCallId"), str):
        return (_TOOL_UPDATE, outer, data["toolCallId"])
    return None


def _merged(run: list[dict[str, Any]], raw: list[bytes]) -> bytes:
    first, last = run[0], run[-1]
    if len(run) == 1:
        return raw[0]  # the event's own bytes, as the plain answer has them
    data: dict[str, Any]
    if first["data"]["sessionUpdate"] == _CHUNK:
        text = "".join(event["data"]["content"]["text"] for event in run)
        data = {**first["data"], "content": {**first["data"]["content"], "text": text}}
    else:
        data = {}
        for event in run:
            data.update(event["data"])
    entry: dict[str, Any] = {
        "v": 1,
        "type": "compacted",
        "firstId": first["id"],
        "lastId": last["id"],
        "count": len(run),
        "event": _UPDATE,
        "data": data,
    }
    if "_meta" in last:
        entry["_meta"] = last["_meta"]
    return orjson.dumps(entry)


def compact_events(events: Iterable[bytes]) -> tuple[bytes, ...]:
    """Return ``events`` (JSON bytes, oldest first) with mergeable runs merged.

    An event that can never merge (another type, or a synthetic entry) is returned as the
    same bytes object, unparsed. Ids inside a run are consecutive: a gap (an event another
    page holds, or lost) ends the run. Never raises on well-formed JSON objects.
    """
    out: list[bytes] = []
    run: list[dict[str, Any]] = []
    run_raw: list[bytes] = []
    key: tuple[Any, ...] | None = None

    def flush() -> None:
        if run:
            out.append(_merged(run, run_raw))
            run.clear()
            run_raw.clear()

    for raw in events:
        envelope = orjson.loads(raw) if _MARKER in raw[:80] else None
        this_key = _run_key(envelope) if isinstance(envelope, dict) else None
        if this_key is None or not isinstance(envelope, dict):
            flush()
            key = None
            out.append(raw)
            continue
        event_id = envelope.get("id")
        if run and (
            this_key != key or not isinstance(event_id, int) or event_id != run[-1]["id"] + 1
        ):
            flush()
        run.append(envelope)
        run_raw.append(raw)
        key = this_key
    flush()
    return tuple(out)
