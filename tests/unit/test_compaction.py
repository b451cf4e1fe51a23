"""Compacted history (sessions.backends.compaction): what merges, what never does."""

from __future__ import annotations

from typing import Any

import orjson

from sessions.backends.compaction import compact_events


def _chunk(event_id: int, text: str, **data: Any) -> bytes:
    content = {"type": "text", "text": text}
    body = {"sessionUpdate": "agent_message_chunk", "content": content, **data}
    return orjson.dumps({"id": event_id, "v": 1, "type": "session_update", "data": body})


def _tool(event_id: int, call: str, **fields: Any) -> bytes:
    body = {"sessionUpdate": "tool_call_update", "toolCallId": call, **fields}
    return orjson.dumps({"id": event_id, "v": 1, "type": "session_update", "data": body})


def _other(event_id: int) -> bytes:
    return orjson.dumps({"id": event_id, "v": 1, "type": "turn_complete", "data": {}})


def _entries(events: list[bytes]) -> list[dict[str, Any]]:
    return [orjson.loads(entry) for entry in compact_events(events)]


def test_chunks_of_one_message_merge_into_one_entry_naming_the_range():
    [entry] = _entries([_chunk(3, "Hello"), _chunk(4, ", "), _chunk(5, "world")])
    assert entry["type"] == "compacted"
    assert (entry["firstId"], entry["lastId"], entry["count"]) == (3, 5, 3)
    assert entry["event"] == "session_update"
    assert entry["data"]["content"] == {"type": "text", "text": "Hello, world"}


def test_chunks_of_two_messages_stay_apart():
    events = [_chunk(1, "a", messageId="m1"), _chunk(2, "b", messageId="m2")]
    assert compact_events(events) == tuple(events)


def test_a_run_ends_at_any_other_event_and_a_single_event_keeps_its_bytes():
    events = [_chunk(1, "a"), _chunk(2, "b"), _other(3), _chunk(4, "c")]
    out = compact_events(events)
    assert orjson.loads(out[0])["lastId"] == 2
    assert out[1:] == (events[2], events[3])


def test_a_gap_in_ids_ends_a_run():
    events = [_chunk(1, "a"), _chunk(3, "b")]
    assert compact_events(events) == tuple(events)


def test_chunks_differing_beyond_the_text_never_merge():
    events = [_chunk(1, "a"), _chunk(2, "b", annotations={"x": 1})]
    assert compact_events(events) == tuple(events)


def test_tool_call_updates_of_one_call_merge_later_fields_winning():
    events = [_tool(7, "c1", status="in_progress"), _tool(8, "c1", status="completed", title="t")]
    [entry] = _entries(events)
    assert (entry["firstId"], entry["lastId"], entry["count"]) == (7, 8, 2)
    assert entry["data"] == {
        "sessionUpdate": "tool_call_update",
        "toolCallId": "c1",
        "status": "completed",
        "title": "t",
    }


def test_updates_of_two_tool_calls_stay_apart():
    events = [_tool(1, "c1", status="completed"), _tool(2, "c2", status="completed")]
    assert compact_events(events) == tuple(events)


def test_synthetic_entries_pass_through_unparsed():
    truncated = b'{"v":1,"type":"history_truncated","data":{"earliestAvailableId":5}}'
    out = compact_events([truncated, _chunk(5, "a"), _chunk(6, "b")])
    assert out[0] is truncated
    assert orjson.loads(out[1])["firstId"] == 5
