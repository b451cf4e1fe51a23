"""Operator log lines (sessions.ops.logs): quoted key=value, JSON, the short bad-Host line."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

from sessions.ops.logs import DisallowedHostFilter, JsonFormatter, KeyValueFormatter, quote_value

FAKE = "2026-12-01 00:00:00,000 CRITICAL FAKE1 x=1"


def record(msg: str, *args: object, name: str = "qwenweb.stream") -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)


def test_a_value_with_spaces_cannot_fake_fields():
    line = KeyValueFormatter("%(message)s").format(record("rejected session=%s code=%s", FAKE, "x"))
    assert line == 'rejected session="2026-12-01 00:00:00,000 CRITICAL FAKE1 x=1" code=x'


def test_quotes_and_backslashes_are_escaped():
    assert quote_value('a"b\\c') == '"a\\"b\\\\c"'
    assert quote_value("plain") == "plain"
    assert quote_value("") == '""'


def test_numbers_and_fragments_after_the_values_are_left_as_written():
    line = KeyValueFormatter("%(message)s").format(
        record("closed duration_s=%.3f frames=%d%s", 1.23456, 7, " value='9'")
    )
    assert line == "closed duration_s=1.235 frames=7 value='9'"


def test_json_lines_carry_each_field_with_its_own_type():
    line = json.loads(JsonFormatter().format(record("closed session=%s frames=%d", FAKE, 7)))
    assert line["event"] == "closed"
    assert line["session"] == FAKE
    assert line["frames"] == 7
    assert line["level"] == "WARNING"
    assert line["logger"] == "qwenweb.stream"


def test_disallowed_host_becomes_one_short_line_without_traceback():
    host = "h" * 8192
    request = SimpleNamespace(META={"HTTP_HOST": host, "REMOTE_ADDR": "10.0.0.1"}, path="/x")
    try:
        raise ValueError(f"Invalid HTTP_HOST header: {host!r}")
    except ValueError as exc:
        entry = logging.LogRecord(
            "django.security.DisallowedHost", logging.ERROR, __file__, 1, str(exc), None,
            (type(exc), exc, exc.__traceback__),
        )  # fmt: skip
    entry.request = request
    assert DisallowedHostFilter().filter(entry)
    line = KeyValueFormatter("%(levelname)s %(name)s %(message)s").format(entry)
    assert "\n" not in line
    assert len(line) < 250
    assert "host_bytes=8192" in line
    assert "client=10.0.0.1" in line
