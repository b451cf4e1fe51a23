"""The memory backend's key store and the key rules (docs/protocol.md, "Idempotent publish")."""

from __future__ import annotations

import pytest

from sessions.backends.idempotency import (
    IdempotencyKey,
    IdempotencyKeyReusedError,
    IdempotencyStore,
    Remembered,
    is_valid_key,
    request_digest,
)
from sessions.backends.redis_scripts import parse_remembered


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _key(name: str, body: bytes = b"{}") -> IdempotencyKey:
    return IdempotencyKey(name, request_digest("events", body))


def test_a_remembered_key_answers_its_first_result() -> None:
    store = IdempotencyStore(10, 60)
    store.remember(_key("k"), 7, "E")
    assert store.recall(_key("k")) == Remembered(7, "E", _key("k").digest)


def test_an_unknown_key_recalls_nothing() -> None:
    assert IdempotencyStore(10, 60).recall(_key("k")) is None


def test_the_key_with_another_body_is_refused() -> None:
    store = IdempotencyStore(10, 60)
    store.remember(_key("k", b'{"type":"a"}'), 1, "E")
    with pytest.raises(IdempotencyKeyReusedError):
        store.recall(_key("k", b'{"type":"b"}'))


def test_a_key_is_forgotten_once_its_time_to_live_has_passed() -> None:
    clock = Clock()
    store = IdempotencyStore(10, 60, clock=clock)
    store.remember(_key("k"), 1, "E")
    clock.now += 59.9
    assert store.recall(_key("k")) is not None
    clock.now += 0.1
    assert store.recall(_key("k")) is None
    assert len(store) == 0


def test_the_oldest_key_is_dropped_beyond_max_keys() -> None:
    store = IdempotencyStore(2, 60)
    for n, name in enumerate(("a", "b", "c"), start=1):
        store.remember(_key(name), n, "E")
    assert store.recall(_key("a")) is None
    assert [store.recall(_key(name)).id for name in ("b", "c")] == [2, 3]  # type: ignore[union-attr]


def test_close_and_publish_with_one_key_are_different_requests() -> None:
    assert request_digest("close", b"") != request_digest("events", b"")


def test_a_body_counts_by_its_json_value_not_its_bytes() -> None:
    # A retry that re-serialized the same event (another key order, other spacing) is the
    # same request; another value, an int for a float, or a non-JSON body is not.
    first = request_digest("events", b'{"type": "note", "data": {"a": 1, "b": [1, 2]}}')
    same = request_digest("events", b'{"data":{"b":[1,2],"a":1},"type":"note"}\n')
    assert first == same
    for other in (
        b'{"type": "note", "data": {"a": 1, "b": [2, 1]}}',
        b'{"type": "note", "data": {"a": 1.0, "b": [1, 2]}}',
        b'{"type": "note", "data": {"a": 1, "b": [1, 2]}',
    ):
        assert request_digest("events", other) != first, other
    assert request_digest("events", b"[1,") != request_digest("events", b"[1, ")


@pytest.mark.parametrize(
    ("raw", "valid"),
    [("a", True), ("~" * 128, True), ("550e8400-e29b-41d4-a716-446655440000", True),
     ("", False), ("x" * 129, False), ("caf\u00e9", False), ("a\tb", False), ("a\x7f", False)],
)  # fmt: skip
def test_keys_are_1_to_128_printable_ascii_characters(raw: str, valid: bool) -> None:
    assert is_valid_key(raw) is valid


def test_a_redis_entry_reads_back_as_the_first_result() -> None:
    assert parse_remembered("42 q3J9xV0b abc") == Remembered(42, "q3J9xV0b", "abc")
    assert parse_remembered("garbage") is None
