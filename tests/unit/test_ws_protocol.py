"""The WebSocket transport's messages (sessions/transport/ws_protocol.py)."""

from __future__ import annotations

import json

import pytest

from sessions.bus import Frame, synthetic_frame
from sessions.errors import ApiError
from sessions.transport.ws_protocol import CommandError, WsFramer, error_reply, parse_command
from sessions.wire import FrameEncoder


def _refused(message: str | bytes, max_bytes: int = 1024) -> CommandError:
    with pytest.raises(CommandError) as refused:
        parse_command(message, max_bytes)
    return refused.value


def test_subscribe_carries_its_cursor_as_the_sse_header_would() -> None:
    command = parse_command(
        '{"op":"subscribe","ref":1,"session":"s","token":"t","lastEventId":42,"epoch":"e"}', 1024
    )
    assert (command.session, command.token, command.last_event_id, command.epoch) == (
        "s", "t", "42", "e",
    )  # fmt: skip


@pytest.mark.parametrize("value", [-1, 1.5, True, [1], {"a": 1}])
def test_a_cursor_of_another_json_type_becomes_text_the_strict_rule_refuses(value: object) -> None:
    message = json.dumps({"op": "subscribe", "session": "s", "lastEventId": value})
    raw = parse_command(message, 1024).last_event_id
    assert raw is not None
    assert not raw.isdigit()


@pytest.mark.parametrize("value", [15, 2049, "x", 1.0, None])
def test_max_queued_out_of_range_is_the_400_of_sse(value: object) -> None:
    message = json.dumps({"op": "subscribe", "session": "s", "maxQueued": value})
    result = parse_command(message, 1024).max_queued
    if value is None:
        assert result == 256
    else:
        assert isinstance(result, ApiError)
        assert result.code == "invalid_max_queued"


def test_refusals_name_their_codes() -> None:
    assert _refused("nope").code == "invalid_json"
    assert _refused(b"{}").code == "invalid_json"
    assert _refused("[1]").code == "invalid_request"
    assert _refused('{"op":"x","ref":3}').code == "unknown_op"
    assert _refused('{"op":"x","ref":3}').ref == 3
    assert _refused('{"op":"subscribe","session":1}').extra == {"field": "session"}
    assert _refused('{"op":"refresh","session":"s"}').extra == {"field": "token"}
    assert _refused('{"op":"ping","ref":true}').extra == {"field": "ref"}


def test_a_message_over_the_limit_is_too_large_whatever_it_holds() -> None:
    refused = _refused('{"op":"ping","pad":"' + "é" * 600 + '"}', max_bytes=1024)
    assert (refused.code, refused.extra) == ("message_too_large", {"limit": 1024})
    assert _refused(b"x" * 2000).code == "message_too_large"


def test_a_frame_message_carries_the_envelope_bytes_of_the_sse_data_line() -> None:
    frame = Frame.from_json(7, "note", b'{"v":1,"id":7,"type":"note","data":{"t":"\xc3\xa9"}}')
    wire, payload = WsFramer(FrameEncoder(), "abc").encode(frame)
    assert payload == frame.json
    assert wire == b'{"op":"frame","session":"abc","frame":' + payload + b"}"
    assert json.loads(wire)["frame"]["data"] == {"t": "é"}


def test_a_synthetic_frame_message_is_the_sse_data_line_too() -> None:
    encoder = FrameEncoder()
    wire, payload = WsFramer(encoder, "abc").encode(synthetic_frame("replay_complete", {}))
    assert json.loads(wire)["frame"] == json.loads(payload)
    assert json.loads(payload)["type"] == "replay_complete"


def test_an_error_reply_echoes_ref_and_session() -> None:
    text = error_reply("r", "s", "not_found", "unknown session", limit=3)
    assert json.loads(text) == {
        "op": "reply", "ref": "r", "ok": False, "session": "s",
        "error": {"code": "not_found", "error": "unknown session", "limit": 3},
    }  # fmt: skip
