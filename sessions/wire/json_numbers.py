"""Long numbers in a JSON text: found at C speed, read exactly at a bounded cost.

orjson reads an integer beyond 64 bits as a float (and one of 309 digits or more not at
all). A text that may hold one (a run of :data:`LONG_DIGITS` digits anywhere in it) is
read again by the standard library's ``json`` with :class:`ExactIntegers` and
:func:`finite_float`, which keep integers exact and refuse numbers no float can hold.
Converting an integer of *d* digits costs about *d*² (CPython's ``int()`` of 4,300 digits,
its cap, about 80 µs, in one call that holds the interpreter's lock), so what one text may
spend on them is :data:`LONG_INTEGERS_BUDGET`.

Pure functions; no I/O, no Django.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = [
    "LONG_DIGITS",
    "LONG_INTEGERS_BUDGET",
    "ExactIntegers",
    "LongIntegersError",
    "finite_float",
    "has_long_digit_run",
]

LONG_DIGITS: Final = 19
"""Digits from which an integer may pass 64 bits (2**63 has 19)."""

LONG_INTEGERS_BUDGET: Final = 8 * 4300 * 4300
"""The sum of *d*² over a text's integers of at least :data:`LONG_DIGITS` digits: about
0.7 ms of conversions (eight integers at Python's 4,300-digit cap, or 400,000 of 20
digits). A text past it is refused before the rest is converted."""


class LongIntegersError(ValueError):
    """A text's long integers passed :data:`LONG_INTEGERS_BUDGET` (the message says so)."""


_DIGIT_MAP: Final = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_LONG_RUN: Final = b"0" * LONG_DIGITS


def has_long_digit_run(text: bytes) -> bool:
    """Whether ``text`` holds :data:`LONG_DIGITS` digits in a row (in strings too).

    Two C passes over the bytes (``translate``, then a substring search): about 1.3 ms
    for 2 MiB, whatever the text (a regular expression took 16-52 ms there). Never raises.
    """
    return text.translate(_DIGIT_MAP).find(_LONG_RUN) >= 0


class ExactIntegers:
    """A ``parse_int`` for :func:`json.loads`: the exact ``int`` of each integer, each of
    :data:`LONG_DIGITS` digits or more charged its digits squared.

    Raises :class:`LongIntegersError` once a text's charge passes
    :data:`LONG_INTEGERS_BUDGET`, and ``int()``'s own ValueError past Python's digit cap
    (``sys.get_int_max_str_digits()``). One instance per text.
    """

    __slots__ = ("spent",)

    def __init__(self) -> None:
        self.spent = 0

    def __call__(self, text: str) -> int:
        digits = len(text) - (text[0] == "-")
        if digits >= LONG_DIGITS:
            self.spent += digits * digits
            if self.spent > LONG_INTEGERS_BUDGET:
                raise LongIntegersError(
                    f"the body's integers of {LONG_DIGITS} digits or more are too long in all "
                    f"(the squares of their digit counts may add up to {LONG_INTEGERS_BUDGET})"
                )
        return int(text)


def finite_float(text: str) -> float:
    """A ``parse_float`` for :func:`json.loads`: ``float(text)``, or ValueError when no
    float holds it (``1e400`` would be infinity, which JSON cannot carry)."""
    value = float(text)
    if not math.isfinite(value):
        shown = text if len(text) <= 40 else f"{text[:37]}..."
        raise ValueError(f"the number {shown} is out of range")
    return value
