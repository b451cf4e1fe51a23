"""Parse a ``text/event-stream`` body incrementally (WHATWG HTML §9.2.6, SC-1 ... SC-8).

`SSEParser` parses a body split anywhere, exactly as the HTML Standard's "Interpreting an
event stream" and the client rules (``docs/protocol.md``, "The browser client") say; the
SSE route's tests, the Python test clients and the benchmarks share it.

Concurrency: nothing here does I/O or touches an event loop. A parser holds the state of
one stream and is not thread-safe: use one parser per connection, from one thread or task
at a time.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = ["SSEParser", "ServerSentEvent"]

# Only CR, LF and CRLF end a line (SC-3); str.splitlines() would also split on
# \v \f \x1c-\x1e \x85 \u2028 \u2029.
_LINE_ENDING: Final = re.compile(r"\r\n|\r|\n")
# [0-9], not \d or str.isdigit(): those accept non-ASCII digits (SC-5, EB-13).
_ASCII_DIGITS: Final = re.compile(r"[0-9]+")
_BOM: Final = "\ufeff"
# Clamp for absurd retry values: far beyond any timer, and small enough that int() never
# meets Python's limit on the length of a digit string.
_MAX_RETRY_MS: Final = 2**64 - 1
_MAX_RETRY_DIGITS: Final = len(str(_MAX_RETRY_MS))


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    """One dispatched event (HTML §9.2.6 "dispatch the event", SC-6).

    `type` is the ``event`` field, ``"message"`` when the block had none. `data` is
    the ``data`` lines joined with LF (one trailing LF removed; may be empty).
    `last_event_id` is the last event ID string in force when the event was
    dispatched: the most recent ``id`` field committed by a blank line, kept across
    events that carry none, ``""`` if none. Immutable.
    """

    type: str
    data: str
    last_event_id: str


class SSEParser:
    """Parse an event stream incrementally and call back for each event (HTML §9.2.6).

    Feed the body with `feed` (decoded text) or `feed_bytes` (raw bytes) in chunks
    split anywhere, then call `end` when the stream ends. Callbacks run synchronously,
    inside the `feed` / `feed_bytes` call that completes their line:

    - ``on_event(ServerSentEvent)`` for each event, as soon as its blank line arrives
      (SC-8);
    - ``on_retry(ms)`` for each valid ``retry`` field, when its line ends (SC-5);
    - ``on_comment(text)`` for each comment line, with the ``:`` and one following
      space removed (``": heartbeat"`` gives ``"heartbeat"``); comments never reach
      ``on_event`` (SC-4).

    ``last_event_id`` (keyword only) seeds the last event ID string and buffer, for a
    parser that continues a previous connection's cursor the way browsers carry it
    across reconnects; it must not contain U+0000 (``ValueError``).

    Guarantees: work and memory are linear in the input, however it is split (a
    pending line is never re-scanned); only CR, LF and CRLF end lines (SC-3). An
    exception raised by a callback propagates out of `feed`; the rest of that chunk is
    then dropped and the parser stays usable. Not thread-safe; not re-entrant (do not
    feed from a callback).
    """

    __slots__ = (
        "_after_cr",
        "_at_stream_start",
        "_data",
        "_decoder",
        "_ended",
        "_event_type",
        "_id_buffer",
        "_last_event_id",
        "_line_parts",
        "_on_comment",
        "_on_event",
        "_on_retry",
        "_retry_ms",
    )

    def __init__(
        self,
        on_event: Callable[[ServerSentEvent], None],
        on_retry: Callable[[int], None] | None = None,
        on_comment: Callable[[str], None] | None = None,
        *,
        last_event_id: str = "",
    ) -> None:
        if "\x00" in last_event_id:
            raise ValueError("last_event_id must not contain U+0000 (SC-5)")
        self._on_event = on_event
        self._on_retry = on_retry
        self._on_comment = on_comment
        # SC-1: one streaming decoder per connection. Plain "utf-8" keeps a BOM, so the
        # parser is the one place that drops it (SC-2).
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._at_stream_start = True
        self._after_cr = False
        self._line_parts: list[str] = []
        self._data: list[str] = []
        self._event_type = ""
        self._id_buffer = last_event_id
        self._last_event_id = last_event_id
        self._retry_ms: int | None = None
        self._ended = False

    @property
    def last_event_id(self) -> str:
        """The last event ID string now in force, ``""`` if none (SC-6, SC-9).

        Changes only when a blank line commits the ``id`` buffer, so the id of an
        unfinished block never shows here (SC-7). Send it as ``Last-Event-ID`` when
        non-empty.
        """
        return self._last_event_id

    @property
    def retry_ms(self) -> int | None:
        """The reconnection time in milliseconds from the last valid ``retry``, or None.

        Set as soon as a ``retry`` line of ASCII digits ends, whether or not its block
        is finished (SC-5); values above 2**64 - 1 are clamped to it.
        """
        return self._retry_ms

    def feed(self, text: str) -> None:
        """Parse the next chunk of decoded text; ``""`` is allowed and changes nothing.

        Drops one U+FEFF if it is the stream's first code point (SC-2), joins a CR that
        ends one chunk with an LF that starts the next into one line ending (SC-3), and
        processes every line completed by this chunk, dispatching events at once (SC-8).
        Raises RuntimeError after `end`; otherwise raises only what a callback raises.
        Use either `feed` or `feed_bytes` for a stream, not both.
        """
        if self._ended:
            raise RuntimeError("SSEParser.feed() called after end()")
        if not text:
            return
        if self._at_stream_start:
            self._at_stream_start = False
            if text[0] == _BOM:
                text = text[1:]
        start = 0
        if self._after_cr:
            self._after_cr = False
            if text.startswith("\n"):
                start = 1
        length = len(text)
        for match in _LINE_ENDING.finditer(text, start):
            line = text[start : match.start()]
            if self._line_parts:
                self._line_parts.append(line)
                line = "".join(self._line_parts)
                self._line_parts.clear()
            start = match.end()
            # A CR may be the first half of a CRLF split across chunks; remember it.
            self._after_cr = start == length and text[-1] == "\r"
            self._process_line(line)
        if start < length:
            self._line_parts.append(text[start:])

    def feed_bytes(self, data: bytes) -> None:
        """Decode the next chunk of raw bytes as UTF-8 and parse it like `feed`.

        One incremental decoder per parser: a character split across chunks comes out
        whole, invalid bytes become U+FFFD, the charset a server declares is ignored
        and a BOM is left for the parser to drop (SC-1, SC-2). Raises RuntimeError
        after `end`; otherwise raises only what a callback raises.
        """
        if self._ended:
            raise RuntimeError("SSEParser.feed_bytes() called after end()")
        self.feed(self._decoder.decode(data))

    def end(self) -> None:
        """Mark the end of the stream; idempotent, never raises, calls no callback.

        Discards the unfinished block (its data, type and uncommitted ``id``) and the
        unterminated last line, which is never processed, so a cut connection never
        shows half an event and `last_event_id` names the last event really received
        (SC-7).
        """
        if self._ended:
            return
        self._ended = True
        # Anything the decoder still holds belongs to the unterminated last line, which
        # is discarded; flushing only releases the decoder's state. The id buffer needs
        # no reset: it was never committed and no later feed is accepted.
        self._decoder.decode(b"", final=True)
        self._line_parts.clear()
        self._data.clear()

    def _process_line(self, line: str) -> None:
        if not line:
            self._dispatch()
            return
        colon = line.find(":")
        if colon == 0:
            if self._on_comment is not None:
                self._on_comment(_value_after(line, 0))
            return
        if colon < 0:
            name, value = line, ""
        else:
            name, value = line[:colon], _value_after(line, colon)
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event_type = value
        elif name == "id":
            if "\x00" not in value:
                self._id_buffer = value
        elif name == "retry":
            self._set_retry(value)

    def _set_retry(self, value: str) -> None:
        if _ASCII_DIGITS.fullmatch(value) is None:
            return
        significant = value.lstrip("0") or "0"
        if len(significant) > _MAX_RETRY_DIGITS:
            retry_ms = _MAX_RETRY_MS
        else:
            retry_ms = min(int(significant), _MAX_RETRY_MS)
        self._retry_ms = retry_ms
        if self._on_retry is not None:
            self._on_retry(retry_ms)

    def _dispatch(self) -> None:
        # The id buffer is committed but not reset: ids persist across events (SC-6).
        self._last_event_id = self._id_buffer
        if not self._data:
            self._event_type = ""
            return
        event = ServerSentEvent(
            type=self._event_type or "message",
            data="\n".join(self._data),
            last_event_id=self._last_event_id,
        )
        self._data.clear()
        self._event_type = ""
        self._on_event(event)


def _value_after(line: str, colon: int) -> str:
    """Return the value after the colon at `colon`, minus one leading space (SC-4)."""
    skip = 2 if line.startswith(" ", colon + 1) else 1
    return line[colon + skip :]
