"""Read the SSE route's request headers strictly; never raise (EB-13, EB-10).

``Last-Event-ID`` becomes a cursor or None, ``X-Event-Epoch`` an epoch token or None, and
any untrusted value is made safe for a one-line log. Pure functions, linear in the input.
The epoch rule is :func:`sessions.bus.is_valid_epoch` and the largest cursor is
:data:`sessions.wire.framing.MAX_EVENT_ID` (= ``sessions.bus.limits.MAX_SAFE_INTEGER``), so
each is defined once.
"""

from __future__ import annotations

import re
from typing import Final

from sessions.bus import is_valid_epoch
from sessions.wire.framing import MAX_EVENT_ID

__all__ = ["parse_epoch", "parse_last_event_id", "sanitize_for_log"]

# [0-9], not \d or str.isdigit(): those accept non-ASCII digits (EB-13).
_ASCII_DIGITS: Final = re.compile(r"[0-9]+")
_MAX_EVENT_ID_DIGITS: Final = len(str(MAX_EVENT_ID))


def parse_last_event_id(raw: str | bytes | None) -> int | None:
    """Parse a ``Last-Event-ID`` header value strictly into a cursor (EB-13).

    Accepts only ASCII decimal digits (leading zeros allowed) with a value
    <= MAX_EVENT_ID and returns that int (``"0"`` is the valid cursor 0). Returns None
    for anything else: None, empty, spaces, sign, fraction, exponent, hex, ``"1,2"``,
    too large, non-ASCII digits, a trailing newline. Bytes are decoded as latin-1, so
    any non-ASCII byte is rejected. Never raises; linear in the input length.
    """
    text = _header_text(raw)
    if text is None or _ASCII_DIGITS.fullmatch(text) is None:
        return None
    significant = text.lstrip("0") or "0"
    if len(significant) > _MAX_EVENT_ID_DIGITS:
        return None
    value = int(significant)
    return value if value <= MAX_EVENT_ID else None


def parse_epoch(raw: str | bytes | None) -> str | None:
    """Parse an ``X-Event-Epoch`` header value (EB-13, EB-10).

    Returns the value as a str when it is 1 to 64 characters of ``[A-Za-z0-9_-]``, else
    None (also for None). Bytes are decoded as latin-1. Never raises.
    """
    text = _header_text(raw)
    return text if is_valid_epoch(text) else None


def sanitize_for_log(raw: str | bytes | None, limit: int = 64) -> str:
    """Make an untrusted header value safe to put in a one-line log message (EB-13).

    Bytes (a raw header value) are decoded as UTF-8, what browsers send, so an operator
    reads ``é`` and not ``Ã©``; a byte that is not UTF-8 shows as ``\\xNN``. None gives
    ``""``. Every character that is not
    printable is removed: control characters (category Cc: CR, LF, NUL, DEL, C1), and
    also format characters, line/paragraph separators, non-space blanks, surrogates,
    private-use and unassigned code points, so the result is one line and ``repr``
    shows it unescaped.
    The result is then clipped to `limit` characters, with "…" appended when clipped
    (at most ``limit + 1`` characters). Raises ValueError if `limit` is negative.
    """
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    text = raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else raw
    if text is None:
        return ""
    if not text.isprintable():
        text = "".join(ch for ch in text if ch.isprintable())
    if len(text) > limit:
        return text[:limit] + "…"
    return text


def _header_text(raw: str | bytes | None) -> str | None:
    if isinstance(raw, bytes):
        return raw.decode("latin-1")
    if isinstance(raw, str):
        return raw
    return None
