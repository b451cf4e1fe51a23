"""Tests for sessions.wire: the SSE parser (SC-1..SC-8, HTML §9.2.6) and the frame format.

The parser vectors (``tests/vectors/sse/``, the project's copy of the shared sample) first,
then the rules tested with inputs of our own.
"""

from __future__ import annotations

import base64
import itertools
import json
from dataclasses import FrozenInstanceError, dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sessions.wire import (
    DEFAULT_RETRY_MS,
    HEARTBEAT,
    MAX_EVENT_ID,
    FramingError,
    ServerSentEvent,
    SSEParser,
    encode_comment,
    encode_frame,
    encode_retry,
    parse_epoch,
    parse_last_event_id,
    sanitize_for_log,
)

# The project's copy of the shared parser vectors (tests/vectors/README.md).
VECTORS_PATH = Path(__file__).resolve().parents[1] / "vectors" / "sse" / "parser-cases.json"


def _vectors(key: str) -> list[Any]:
    cases: list[dict[str, Any]] = json.loads(VECTORS_PATH.read_text("utf-8"))[key]
    assert cases, f"no {key} in {VECTORS_PATH}"
    return [pytest.param(case, id=case["name"]) for case in cases]


@dataclass
class Recorder:
    """Collects callbacks and the index of the feed that dispatched each event (SC-8)."""

    events: list[tuple[str, str, str]] = field(default_factory=list)
    feeds_at_event: list[int] = field(default_factory=list)
    retries: list[int] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    feeds: int = 0
    parser: SSEParser = field(init=False)

    def __post_init__(self) -> None:
        self.parser = SSEParser(self._on_event, self.retries.append, self.comments.append)

    def _on_event(self, event: ServerSentEvent) -> None:
        self.events.append((event.type, event.data, event.last_event_id))
        self.feeds_at_event.append(self.feeds)

    def feed(self, *chunks: str) -> Recorder:
        for chunk in chunks:
            self.parser.feed(chunk)
            self.feeds += 1
        return self

    def feed_bytes(self, *chunks: bytes) -> Recorder:
        for chunk in chunks:
            self.parser.feed_bytes(chunk)
            self.feeds += 1
        return self

    def end(self) -> Recorder:
        self.parser.end()
        return self

    @property
    def data(self) -> list[str]:
        return [data for _, data, _ in self.events]


def _assert_matches_case(rec: Recorder, case: dict[str, Any]) -> None:
    expected = [(e["type"], e["data"], e["id"]) for e in case["events"]]
    assert rec.events == expected
    assert rec.parser.last_event_id == case["final_last_event_id"]
    assert rec.parser.retry_ms == case["final_retry"]
    assert rec.retries == case["retries"]


# --- the parser vectors (tests/vectors/sse/) -----------------------------------------


@pytest.mark.parametrize("case", _vectors("cases"))
def test_parser_matches_shared_text_vector(case: dict[str, Any]) -> None:
    rec = Recorder().feed(*case["chunks"])
    dispatched_before_end = list(rec.events)
    rec.end()
    assert rec.events == dispatched_before_end  # SC-7/SC-8: end() dispatches nothing
    _assert_matches_case(rec, case)


@pytest.mark.parametrize("case", _vectors("byte_cases"))
def test_parser_matches_shared_byte_vector(case: dict[str, Any]) -> None:
    chunks = [base64.b64decode(chunk) for chunk in case["chunks_b64"]]
    rec = Recorder().feed_bytes(*chunks)
    dispatched_before_end = list(rec.events)
    rec.end()
    assert rec.events == dispatched_before_end  # SC-7/SC-8: end() dispatches nothing
    _assert_matches_case(rec, case)


# --- SC-1: one streaming UTF-8 decoder ------------------------------------------------


def test_sc1_three_byte_char_split_over_three_feeds_comes_out_whole() -> None:
    rec = Recorder().feed_bytes(b"data: \xe6", b"\x97", b"\xa5!\n\n")
    assert rec.data == ["日!"]


def test_sc1_four_byte_char_split_inside_event_type_and_id() -> None:
    raw = "event: 📨\nid: 🔑\ndata: x\n\n".encode()
    rec = Recorder().feed_bytes(*(raw[i : i + 1] for i in range(len(raw))))
    assert rec.events == [("📨", "x", "🔑")]


def test_sc1_declared_latin1_bytes_are_still_decoded_as_utf8() -> None:
    rec = Recorder().feed_bytes("data: café\n\n".encode("latin-1"))
    assert rec.data == ["caf\ufffd"]


def test_sc1_truncated_sequence_at_end_of_stream_is_discarded_quietly() -> None:
    rec = Recorder().feed_bytes(b"data: a\n\ndata: \xe6\x97").end()
    assert rec.data == ["a"]


# --- SC-2: one leading BOM ------------------------------------------------------------


def test_sc2_bom_as_first_code_point_is_dropped() -> None:
    assert Recorder().feed("\ufeffevent: t\ndata: x\n\n").events == [("t", "x", "")]


def test_sc2_decoder_keeps_the_bom_so_a_second_bom_is_data() -> None:
    # utf-8-sig would strip one BOM and the parser another: "x" would leak out.
    rec = Recorder().feed_bytes(b"", b"\xef\xbb\xbf\xef\xbb\xbfdata: x\n\n")
    assert rec.events == []


def test_sc2_bom_inside_a_value_or_after_the_first_chunk_is_data() -> None:
    rec = Recorder().feed("data: \ufeff\n\n", "\ufeffdata: dropped\n\ndata: b\n\n")
    assert rec.data == ["\ufeff", "b"]


# --- SC-3: CR, LF, CRLF and nothing else ----------------------------------------------


def test_sc3_unicode_line_separators_are_not_line_endings() -> None:
    rec = Recorder().feed("event: a\u2028b\ndata: x\n\u2029\n\x85\n\n")
    assert rec.events == [("a\u2028b", "x", "")]


def test_sc3_lf_then_cr_across_chunks_is_two_endings() -> None:
    assert Recorder().feed("data: a\n", "\rdata: b\n\n").data == ["a", "b"]


def test_sc3_pending_cr_survives_empty_chunk_and_is_not_followed_by_lf() -> None:
    assert Recorder().feed("data: a\r", "", "data: b\r", "\r").data == ["a\nb"]


def test_sc3_crlf_split_across_byte_chunks_is_one_ending() -> None:
    assert Recorder().feed_bytes(b"data: a\r", b"\ndata: b\r", b"\n\r\n").data == ["a\nb"]


# --- SC-4: line kinds -----------------------------------------------------------------


def test_sc4_comment_reaches_on_comment_only() -> None:
    rec = Recorder().feed(HEARTBEAT.decode(), ":raw\n", ":  two\n\n")
    assert rec.events == []
    assert rec.comments == ["heartbeat", "raw", " two"]


def test_sc4_only_one_leading_space_is_removed_from_a_value() -> None:
    rec = Recorder().feed("event:  t\nid:\t5\ndata: a:b\n\n")
    assert rec.events == [(" t", "a:b", "\t5")]


def test_sc4_line_without_colon_is_a_field_with_empty_value() -> None:
    assert Recorder().feed("data\n\n").data == [""]


# --- SC-5: fields ---------------------------------------------------------------------


def test_sc5_string_id_survives_untouched() -> None:
    rec = Recorder().feed("id: b7-1042\ndata: x\n\n")
    assert rec.events == [("message", "x", "b7-1042")]


def test_sc5_id_with_nul_in_the_middle_is_ignored_not_cleared() -> None:
    rec = Recorder().feed("id: 3\n\nid: 4\x005\ndata: x\n\n")
    assert rec.events == [("message", "x", "3")]


@pytest.mark.parametrize("value", ["²", "١٢", "𝟗", " 100", "100 ", "1e3", "0x10", "", "Retry"])
def test_sc5_retry_other_than_ascii_digits_is_ignored(value: str) -> None:
    rec = Recorder().feed(f"retry: {value}\n")
    assert rec.retries == []
    assert rec.parser.retry_ms is None


def test_sc5_retry_field_name_is_case_sensitive() -> None:
    assert Recorder().feed("Retry: 5\nRETRY: 6\n").retries == []


def test_sc5_retry_with_thousands_of_digits_never_raises() -> None:
    rec = Recorder().feed("retry: " + "0" * 5000 + "7\n", "retry: " + "9" * 5000 + "\n")
    assert rec.retries == [7, 2**64 - 1]


# --- SC-6: dispatch -------------------------------------------------------------------


def test_sc6_empty_data_line_dispatches_an_event_with_empty_data() -> None:
    assert Recorder().feed("event: ping\ndata:\n\n").events == [("ping", "", "")]


def test_sc6_id_only_block_moves_cursor_without_an_event() -> None:
    rec = Recorder().feed("data: a\n\nid: 9\n\n")
    assert rec.events == [("message", "a", "")]
    assert rec.parser.last_event_id == "9"


def test_sc6_type_and_data_buffers_reset_but_id_persists() -> None:
    rec = Recorder().feed("id: 1\nevent: t\ndata: a\n\ndata: b\n\n")
    assert rec.events == [("t", "a", "1"), ("message", "b", "1")]


def test_sc6_seeded_last_event_id_continues_a_previous_cursor() -> None:
    events: list[ServerSentEvent] = []
    parser = SSEParser(events.append, last_event_id="41")
    parser.feed("data: resync\n\n")
    assert events == [ServerSentEvent("message", "resync", "41")]


def test_sc6_seed_with_nul_is_refused() -> None:
    with pytest.raises(ValueError, match="U\\+0000"):
        SSEParser(lambda _: None, last_event_id="1\x00")


# --- SC-7: end of stream --------------------------------------------------------------


def test_sc7_unfinished_block_and_its_id_are_discarded() -> None:
    rec = Recorder().feed("id: 1\ndata: a\n\nid: 2\ndata: b\n").end()
    assert rec.events == [("message", "a", "1")]
    assert rec.parser.last_event_id == "1"


def test_sc7_unterminated_comment_is_never_reported() -> None:
    assert Recorder().feed(": half").end().comments == []


def test_sc7_end_is_idempotent() -> None:
    rec = Recorder().feed("data: a\n\ndata: b").end().end()
    assert rec.data == ["a"]


def test_sc7_feed_after_end_raises() -> None:
    rec = Recorder().end()
    with pytest.raises(RuntimeError, match="after end"):
        rec.parser.feed("data: a\n\n")
    with pytest.raises(RuntimeError, match="after end"):
        rec.parser.feed_bytes(b"")


# --- SC-8: dispatch as soon as the blank line arrives ---------------------------------


def test_sc8_event_dispatched_by_the_feed_that_brings_its_blank_line() -> None:
    rec = Recorder().feed("data: a\n", "\n", "data: b\n\nda", "ta: c\n", "\r")
    assert rec.data == ["a", "b", "c"]
    assert rec.feeds_at_event == [1, 2, 4]  # index of the feed that dispatched each


def test_sc8_cr_blank_line_dispatches_without_waiting_for_a_possible_lf() -> None:
    rec = Recorder().feed("data: a\r", "\r")
    assert rec.feeds_at_event == [1]


@pytest.mark.timeout(3)
def test_long_line_fed_one_char_at_a_time_stays_linear() -> None:
    # SC-3 across chunks without re-scanning: linear takes ~0.3 s here; re-joining the
    # pending line on every feed takes ~10 s (4-byte chars make each copy costly).
    line = "😀" * 400_000
    rec = Recorder()
    for char in f"data: {line}\n\n":
        rec.parser.feed(char)
    assert rec.data == [line]


@pytest.mark.timeout(3)
def test_many_short_lines_in_one_chunk_stay_linear() -> None:
    # SC-3/SC-6: 50k events then 50k CR-only blank lines, which dispatch nothing.
    rec = Recorder().feed("data: x\n\n" * 50_000 + "\r" * 50_000)
    assert len(rec.events) == 50_000


def test_callback_error_propagates_and_parser_stays_usable() -> None:
    seen: list[str] = []

    def on_event(event: ServerSentEvent) -> None:
        seen.append(event.data)
        if event.data == "a":
            raise LookupError(event.data)

    parser = SSEParser(on_event)
    with pytest.raises(LookupError):
        parser.feed("data: a\n\ndata: b\n\n")  # the rest of this chunk is dropped
    parser.feed("data: c\n\n")
    assert seen == ["a", "c"]


def test_server_sent_event_is_immutable() -> None:  # HTML §9.2.6: events are values
    event = ServerSentEvent("message", "x", "")
    with pytest.raises(FrozenInstanceError):
        event.data = "y"  # type: ignore[misc]


# --- any split gives the same result (SC-1, SC-3) -------------------------------------

_TOKENS = ["data", "event", "id", "retry", ":", " ", "\r", "\n", "\r\n", "7", "x"]
_STREAM_TEXT = st.lists(st.sampled_from([*_TOKENS, "\ufeff", "\x00", "é😀"])).map("".join)


@given(text=_STREAM_TEXT, cuts=st.lists(st.integers(min_value=0, max_value=200)))
def test_splitting_the_text_never_changes_the_result(text: str, cuts: list[int]) -> None:
    whole = Recorder().feed(text).end()
    points = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in itertools.pairwise(points)]
    split = Recorder().feed(*pieces).end()
    assert (split.events, split.retries) == (whole.events, whole.retries)
    assert split.parser.last_event_id == whole.parser.last_event_id


# --- frame serializer (EB-18) ---------------------------------------------------------


def test_encode_frame_with_id_writes_id_event_data_lines() -> None:
    frame = encode_frame(event_type="t", data_json=b'{"a":"\xc3\xa9"}', event_id=7)
    assert frame == b'id: 7\nevent: t\ndata: {"a":"\xc3\xa9"}\n\n'


def test_encode_frame_synthetic_has_no_id_line() -> None:
    frame = encode_frame(event_type="replay_complete", data_json=b"{}")
    assert frame == b"event: replay_complete\ndata: {}\n\n"


@pytest.mark.parametrize("event_type", ["", "a\rb", "a\nb", "a\x00b", "\ud800", 1])
def test_encode_frame_refuses_event_type_that_breaks_framing(event_type: Any) -> None:
    with pytest.raises(FramingError):
        encode_frame(event_type=event_type, data_json=b"{}")


@pytest.mark.parametrize("data_json", [b'{"a":\n1}', b'"\r"', "{}"])
def test_encode_frame_refuses_multiline_or_non_bytes_data(data_json: Any) -> None:
    with pytest.raises(FramingError):
        encode_frame(event_type="t", data_json=data_json)


@pytest.mark.parametrize("event_id", [0, -1, MAX_EVENT_ID + 1, True, 1.0, "1"])
def test_encode_frame_refuses_event_id_outside_range(event_id: Any) -> None:
    with pytest.raises(FramingError):
        encode_frame(event_type="t", data_json=b"{}", event_id=event_id)


def test_encode_frame_accepts_largest_event_id() -> None:
    frame = encode_frame(event_type="t", data_json=b"1", event_id=MAX_EVENT_ID)
    assert frame.startswith(b"id: 9007199254740991\n")


def test_encode_retry_writes_retry_line_and_blank_line() -> None:
    assert encode_retry(DEFAULT_RETRY_MS) == b"retry: 3000\n\n"
    assert encode_retry(0) == b"retry: 0\n\n"


@pytest.mark.parametrize("retry_ms", [-1, True, 1.5, "3000", None])
def test_encode_retry_refuses_non_negative_int_violations(retry_ms: Any) -> None:
    with pytest.raises(FramingError):
        encode_retry(retry_ms)


def test_encode_comment_and_heartbeat_are_comment_frames() -> None:
    assert encode_comment("hello") == b": hello\n\n"
    assert encode_comment("heartbeat") == HEARTBEAT


@pytest.mark.parametrize("text", ["a\nb", "a\r", "\x00"])
def test_encode_comment_refuses_line_breaks_and_nul(text: str) -> None:
    with pytest.raises(FramingError):
        encode_comment(text)


def test_framing_error_is_a_value_error() -> None:
    assert issubclass(FramingError, ValueError)


# --- round trip: encode_frame -> SSEParser --------------------------------------------

_EVENT_TYPES = st.text(min_size=1).filter(lambda s: not {"\r", "\n", "\x00"} & set(s))
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=10,
)


@given(
    event_type=_EVENT_TYPES,
    data=_JSON,
    event_id=st.integers(min_value=1, max_value=MAX_EVENT_ID),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_encoded_frame_round_trips_through_parser_at_any_byte_split(
    event_type: str, data: object, event_id: int, cuts: list[int]
) -> None:
    data_json = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    raw = encode_retry(1234) + encode_frame(
        event_type=event_type, data_json=data_json, event_id=event_id
    )
    points = sorted({0, len(raw), *(c for c in cuts if c <= len(raw))})
    events: list[ServerSentEvent] = []
    parser = SSEParser(events.append)
    for a, b in itertools.pairwise(points):
        parser.feed_bytes(raw[a:b])
    assert [(e.type, json.loads(e.data), e.last_event_id) for e in events] == [
        (event_type, data, str(event_id))
    ]
    assert parser.retry_ms == 1234


# --- request headers (EB-13) ----------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("0", 0),
        ("007", 7),
        ("42", 42),
        (b"42", 42),
        ("9007199254740991", MAX_EVENT_ID),
        ("0" * 100 + "5", 5),
    ],
)
def test_parse_last_event_id_accepts_ascii_decimal_cursor(raw: str | bytes, expected: int) -> None:
    assert parse_last_event_id(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "",
        b"",
        " 1",
        "1 ",
        "+1",
        "-1",
        "1.0",
        "1e3",
        "0x10",
        "1,2",
        "١٢",
        "１",
        "²",
        "1\n",
        "1_000",
        "9007199254740992",
        "9" * 5000,
        b"1\xff",
    ],
)
def test_parse_last_event_id_treats_anything_else_as_absent(
    raw: str | bytes | None,
) -> None:
    assert parse_last_event_id(raw) is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("a", "a"), ("Ab9_-", "Ab9_-"), (b"e-1", "e-1"), ("x" * 64, "x" * 64)],
)
def test_parse_epoch_accepts_token(raw: str | bytes, expected: str) -> None:
    assert parse_epoch(raw) == expected


@pytest.mark.parametrize("raw", [None, "", "x" * 65, "a b", "a.b", "é", "a\n", b"\xe9", "a/b"])
def test_parse_epoch_rejects_anything_else(raw: str | bytes | None) -> None:
    assert parse_epoch(raw) is None


def test_sanitize_for_log_removes_control_characters() -> None:
    assert sanitize_for_log("1\r\n2\x003\x7f4\x855\t6\u20287") == "1234567"


def test_sanitize_for_log_decodes_bytes_as_utf8_and_shows_other_bytes_escaped() -> None:
    assert sanitize_for_log("١٢é".encode()) == "١٢é"  # not mojibake ("Ù¡Ù¢Ã©")
    assert sanitize_for_log(b"id\xff\n") == "id\\xff"


def test_sanitize_for_log_clips_with_ellipsis() -> None:
    assert sanitize_for_log("a" * 100) == "a" * 64 + "…"
    assert sanitize_for_log("abcdef", limit=3) == "abc…"
    assert sanitize_for_log("abc", limit=3) == "abc"


def test_sanitize_for_log_result_is_repr_safe() -> None:
    text = sanitize_for_log("\ud800x\u202e\x1b[31my\u00a0")
    assert text == "x[31my"
    assert repr(text) == f"'{text}'"


def test_sanitize_for_log_none_is_empty_and_negative_limit_raises() -> None:
    assert sanitize_for_log(None) == ""
    with pytest.raises(ValueError, match="limit"):
        sanitize_for_log("x", limit=-1)
