"""Operator log lines: quoted ``key=value`` text or one JSON object per line (``LOG_FORMAT``).

Every ``qwenweb.*`` message is written as ``"event key=%s key=%d ..."`` with its values
as arguments. :class:`KeyValueFormatter` quotes a value that holds a space, ``=``, a
quote or a backslash (``path="/a b"``; ``"`` and ``\\`` escaped), so no value can fake
another field or another line. :class:`JsonFormatter` (``LOG_FORMAT=json``) writes the
same record as one JSON object: ``ts``, ``level``, ``logger``, ``event`` (the message's
first word), one member per ``key=%x`` of the message with the argument's own value
(numbers stay numbers), and ``message``, the quoted text line. ``qwenweb.settings``
attaches them to the console handler.

:class:`DisallowedHostFilter` turns Django's ``DisallowedHost`` report (the whole Host
header twice and a traceback: some 34 KB for an 8 KB header) into one short line,
``disallowed_host host="<first 80 chars>…" host_bytes=8192 path=/...``.

Nothing here imports Django: ``logging.config`` loads it before the apps.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from typing import Any, Final

import orjson

__all__ = ["DisallowedHostFilter", "JsonFormatter", "KeyValueFormatter", "quote_value"]

# One %-conversion: optional mapping key, flags, width, precision, length, the type.
_SPEC: Final = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?([a-zA-Z%])")
_KEY_BEFORE: Final = re.compile(r"(?:^|[\s,(])([A-Za-z_][A-Za-z0-9_.]*)=$")
_NEEDS_QUOTES: Final = re.compile(r'[\s="\\]|^$')
_FIRST_WORD: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
HOST_LOG_CHARS: Final = 80
"""Characters of a refused Host header that the log line keeps."""


def quote_value(text: str) -> str:
    """Return ``text`` as a ``key=value`` value: unchanged, or in double quotes (escaped)
    when it is empty or holds whitespace, ``=``, ``"`` or ``\\``. Never raises."""
    if not _NEEDS_QUOTES.search(text):
        return text
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = escaped.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return f'"{escaped}"'


def _fields(record: logging.LogRecord) -> tuple[str, dict[str, Any]] | None:
    """``(quoted message, {key: raw value})`` of a ``%``-style record, or None when its
    message is not a format string with positional arguments (left to logging)."""
    msg, args = record.msg, record.args
    if not isinstance(msg, str) or not isinstance(args, tuple):
        return None
    out: list[str] = []
    fields: dict[str, Any] = {}
    position = 0
    index = 0
    for match in _SPEC.finditer(msg):
        literal = msg[position : match.start()]
        out.append(literal)
        position = match.end()
        kind = match.group(1)
        if kind == "%":
            out.append("%")
            continue
        if index >= len(args) or "*" in match.group(0) or match.group(0).startswith("%("):
            return None
        arg = args[index]
        index += 1
        key_match = _KEY_BEFORE.search("".join(out)[-64:])
        if kind in "sr":
            text = arg if isinstance(arg, str) else (str(arg) if kind == "s" else repr(arg))
            out.append(quote_value(text) if key_match else text)
        else:
            try:
                text = match.group(0) % (arg,)
            except (TypeError, ValueError):
                return None
            out.append(text)
        if key_match:
            fields[key_match.group(1)] = (
                arg if isinstance(arg, int | float | bool | type(None)) else text
            )
    if index != len(args):
        return None
    out.append(msg[position:])
    return "".join(out), fields


class KeyValueFormatter(logging.Formatter):
    """``logging.Formatter`` whose ``key=%s`` values are quoted (:func:`quote_value`)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        parsed = _fields(record) if record.name.startswith("qwenweb") else None
        if parsed is not None:
            record.message = parsed[0]
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per record (module docstring); a traceback goes into ``exc``."""

    def format(self, record: logging.LogRecord) -> str:
        parsed = _fields(record)
        message = parsed[0] if parsed is not None else record.getMessage()
        fields = parsed[1] if parsed is not None else {}
        first = _FIRST_WORD.match(message)
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "event": first.group(0) if first else "",
        }
        for key, value in fields.items():
            line.setdefault(key, value)
        line["message"] = message
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class DisallowedHostFilter(logging.Filter):
    """Rewrite Django's ``DisallowedHost`` record as one short line without a traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "request", None)
        meta = getattr(request, "META", {}) or {}
        host = str(meta.get("HTTP_HOST", ""))
        shown = "".join(ch for ch in host[:HOST_LOG_CHARS] if ch.isprintable())
        if len(host) > HOST_LOG_CHARS:
            shown += "…"
        path = "".join(ch for ch in str(getattr(request, "path", ""))[:120] if ch.isprintable())
        record.msg = "disallowed_host status=400 host=%s host_bytes=%d path=%s client=%s"
        size = len(host.encode("utf-8", "replace"))
        record.args = (shown, size, path, meta.get("REMOTE_ADDR", "-"))
        record.name = "qwenweb.security"
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = None
        record.exc_text = None
        record.stack_info = None
        return True
