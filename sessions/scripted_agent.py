"""The demo agent: a scripted agent turn played into a session through the HTTP API.

The text is a real document found in installed packages: Django's own README (its
package metadata) and the Zen of Python (the stdlib ``this`` module). Events are shaped
like the Agent Client Protocol's ``session/update`` notifications:
``{"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": ...}}``,
``tool_call`` / ``tool_call_update``, then a ``turn_complete`` event.
"""

from __future__ import annotations

import codecs
import contextlib
import importlib
import importlib.metadata
import io
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

__all__ = ["agent_turns", "document_text", "last_turn", "split_tokens"]


def document_text() -> list[tuple[str, str]]:
    """Return ``[(title, text), ...]``: the documents the demo agent streams."""
    with contextlib.redirect_stdout(io.StringIO()):  # `import this` prints the Zen
        this = importlib.import_module("this")
    zen = codecs.decode(this.s, "rot13")
    metadata: Any = importlib.metadata.metadata("Django")
    django_readme = metadata.get_payload() or ""  # the README is the metadata body
    return [("Django's README", str(django_readme).strip()), ("The Zen of Python", zen.strip())]


def split_tokens(text: str) -> list[str]:
    """Split ``text`` into LLM-sized pieces: words with their following whitespace."""
    return re.findall(r"\S+\s*|\s+", text)


def agent_turns(run: str = "1", first_turn: int = 1) -> Iterator[tuple[str, dict[str, Any], int]]:
    """Yield ``(type, data, tokens)`` for one scripted run; ``tokens`` paces the sender.

    A turn per document: the user's prompt, a tool call that "reads" the document,
    the agent's answer streamed chunk by chunk, then ``turn_complete`` with the turn's
    number (``first_turn``, ``first_turn + 1``, ...). Tool call ids are
    ``call_<run>_<turn>``: give each run of a session its own ``run`` (a session's tool
    call ids are unique in it, and the page shows one card per id), and ``first_turn``
    one more than the session's last turn so that a session played twice counts on.
    """
    for turn, (title, text) in enumerate(document_text(), start=first_turn):
        call_id = f"call_{run}_{turn}"
        yield (
            "session_update",
            {
                "sessionUpdate": "user_message_chunk",
                "content": {"type": "text", "text": f"Please read me {title}."},
            },
            0,
        )
        yield (
            "session_update",
            {
                "sessionUpdate": "tool_call",
                "toolCallId": call_id,
                "title": f"Reading {title}",
                "kind": "read",
                "status": "in_progress",
            },
            5,
        )
        yield (
            "session_update",
            {
                "sessionUpdate": "tool_call_update",
                "toolCallId": call_id,
                "status": "completed",
                "content": [
                    {
                        "type": "content",
                        "content": {"type": "text", "text": f"{len(text)} characters"},
                    }
                ],
            },
            20,
        )
        for token in split_tokens(text):
            yield (
                "session_update",
                {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": token},
                },
                1,
            )
        yield ("turn_complete", {"stopReason": "end_turn", "turn": turn}, 10)


def last_turn(envelopes: Iterable[Mapping[str, Any]]) -> int:
    """The number of the newest ``turn_complete`` among ``envelopes`` (newest first; each
    ``{"type": ..., "data": ...}``), 0 when none says one. Never raises."""
    for envelope in envelopes:
        if envelope.get("type") == "turn_complete":
            data = envelope.get("data")
            number = data.get("turn") if isinstance(data, Mapping) else None
            if isinstance(number, int) and not isinstance(number, bool) and number > 0:
                return number
    return 0
