"""Long numbers in JSON texts (sessions.wire.json_numbers): found, read exactly, bounded."""

from __future__ import annotations

import json

import pytest

from sessions.wire.json_numbers import (
    LONG_DIGITS,
    ExactIntegers,
    LongIntegersError,
    finite_float,
    has_long_digit_run,
)


@pytest.mark.parametrize(
    ("text", "found"),
    [
        (b"9" * LONG_DIGITS, True),
        (b"9" * (LONG_DIGITS - 1), False),
        (b"[" + b"12345678901234567 " * 1000 + b"]", False),  # runs of 17: a regex's worst
        (b'{"a":"x' + b"0" * LONG_DIGITS + b'"}', True),  # in a string too
        (b"-" + b"1" * 25, True),
        (b"1.000000000000000000001", True),  # a long fraction (harmless, read exactly)
        (b"", False),
    ],
)
def test_has_long_digit_run(text: bytes, found: bool) -> None:
    assert has_long_digit_run(text) is found


def test_exact_integers_keep_their_value_and_charge_only_long_ones() -> None:
    parse = ExactIntegers()
    text = f"[1, -{2**70}, {10**400 + 7}]"
    assert json.loads(text, parse_int=parse) == [1, -(2**70), 10**400 + 7]
    assert parse.spent == len(str(2**70)) ** 2 + 401**2


def test_exact_integers_refuse_past_the_budget_before_converting_more() -> None:
    parse = ExactIntegers()
    text = "[" + ",".join(["7" * 4300] * 9) + "]"  # 9 x 4300^2 > 8 x 4300^2
    with pytest.raises(LongIntegersError, match="too long in all"):
        json.loads(text, parse_int=parse)
    assert parse.spent == 9 * 4300**2


@pytest.mark.parametrize("text", ["1e400", "-1e999", "123456789012345678901e300"])
def test_finite_float_refuses_what_no_float_holds(text: str) -> None:
    with pytest.raises(ValueError, match="out of range"):
        finite_float(text)


def test_finite_float_reads_others() -> None:
    assert finite_float("1.5e300") == 1.5e300
    assert finite_float("-0.0") == 0.0
