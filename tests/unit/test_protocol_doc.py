"""docs/protocol.md stays the complete, self-contained protocol document.

Pure Python (no Django, no conftest fixtures): it reads the repository's files as text.
Every rule id cited anywhere must be defined in the rule index, every frame type and
error code the server emits must be documented, and nothing may point outside the
repository.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = ROOT / "docs" / "protocol.md"
SESSIONS = ROOT / "sessions"

CITING_PLACES = (
    "sessions",
    "qwenweb",
    "static",
    "templates",
    "tests",
    "bench",
    "docs",
    "README.md",
)
SKIPPED_DIRS = frozenset({".venv", "node_modules", "__pycache__", ".git"})
BINARY_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".gif", ".ico", ".webp", ".pyc", ".sqlite3"})

RULE_ID = re.compile(r"\b(?:EB|SC)-\d+\b")
INDEX_ROW = re.compile(r"^\|\s*((?:EB|SC)-\d+)\b", re.MULTILINE)
SYNTHETIC_CALL = re.compile(r"\bsynthetic_frame\(\s*[\"']([^\"']+)[\"']")
DISCONNECT_CALL = re.compile(r"\bdisconnect_frame\(")
CODE_PAIR = re.compile(r"[\"']code[\"']\s*:\s*[\"']([^\"']+)[\"']")
# ApiError(400, "invalid_event", ...), _Reject(...), error_response(...): status then code.
ERROR_CALL = re.compile(
    r"\b(?:ApiError|_Reject|error_response)\(\s*[1-5]\d\d\s*,\s*[\"']([a-z][a-z0-9_]*)[\"']"
)
SERVER_PUBLISHED_TYPES = frozenset({"session_closed", "history_truncated"})


def _protocol() -> str:
    return PROTOCOL.read_text(encoding="utf-8")


def _citing_files() -> list[Path]:
    files: list[Path] = []
    for place in CITING_PLACES:
        path = ROOT / place
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        for candidate in candidates:
            if (
                candidate.is_file()
                and candidate.resolve() != PROTOCOL.resolve()
                and candidate.suffix not in BINARY_SUFFIXES
                and not SKIPPED_DIRS.intersection(candidate.relative_to(ROOT).parts)
            ):
                files.append(candidate)
    return files


def _session_sources() -> dict[Path, str]:
    return {
        path: path.read_text(encoding="utf-8")
        for path in sorted(SESSIONS.rglob("*.py"))
        if not SKIPPED_DIRS.intersection(path.relative_to(ROOT).parts)
    }


def _is_documented(name: str, doc: str) -> bool:
    """``name`` appears as a code span, or as a word of a heading."""
    if f"`{name}`" in doc:
        return True
    heading = re.compile(rf"^#+ .*(?<![\w-]){re.escape(name)}(?![\w-])", re.MULTILINE)
    return heading.search(doc) is not None


def test_every_cited_rule_id_is_defined_in_the_rule_index() -> None:
    defined = set(INDEX_ROW.findall(_protocol()))
    cited: dict[str, set[str]] = {}
    for path in _citing_files():
        text = path.read_text(encoding="utf-8", errors="ignore")
        for rule in RULE_ID.findall(text):
            cited.setdefault(rule, set()).add(str(path.relative_to(ROOT)))
    assert cited, "no rule id found in the tree: the scan itself is broken"
    missing = {rule: sorted(where)[:3] for rule, where in cited.items() if rule not in defined}
    assert not missing, f"rule ids cited but not defined in the rule index: {missing}"


def test_every_frame_type_the_server_emits_is_documented() -> None:
    emitted: dict[str, set[str]] = {name: {"(server-published)"} for name in SERVER_PUBLISHED_TYPES}
    for path, text in _session_sources().items():
        where = str(path.relative_to(ROOT))
        for name in SYNTHETIC_CALL.findall(text):
            emitted.setdefault(name, set()).add(where)
        if DISCONNECT_CALL.search(text):
            emitted.setdefault("stream_error", set()).add(where)
    assert "replay_complete" in emitted, "no synthetic_frame call found: the scan is broken"
    doc = _protocol()
    missing = {
        name: sorted(where) for name, where in emitted.items() if not _is_documented(name, doc)
    }
    assert not missing, f"frame types emitted but not documented in docs/protocol.md: {missing}"


def test_every_code_literal_in_the_server_is_documented() -> None:
    codes: dict[str, set[str]] = {}
    for path, text in _session_sources().items():
        for code in CODE_PAIR.findall(text):
            codes.setdefault(code, set()).add(str(path.relative_to(ROOT)))
    assert "subscriber_limit_exceeded" in codes, 'no "code" literal found: the scan is broken'
    doc = _protocol()
    missing = {code: sorted(where) for code, where in codes.items() if f"`{code}`" not in doc}
    assert not missing, f"codes emitted but not documented in docs/protocol.md: {missing}"


def test_every_http_error_code_in_the_server_is_in_the_error_table() -> None:
    codes: dict[str, set[str]] = {}
    for path, text in _session_sources().items():
        for code in ERROR_CALL.findall(text):
            codes.setdefault(code, set()).add(str(path.relative_to(ROOT)))
    assert "unauthorized" in codes, "no error call found: the scan is broken"
    table_codes = set(re.findall(r"^\| \d{3} \| `([a-z0-9_]+)` \|", _protocol(), re.MULTILINE))
    missing = {code: sorted(where) for code, where in codes.items() if code not in table_codes}
    assert not missing, f"error codes missing from the table in 'Errors and limits': {missing}"


def test_protocol_doc_points_nowhere_outside_the_repository() -> None:
    doc = _protocol()
    offending = [
        line.strip()
        for line in doc.splitlines()
        if "../" in line or "shared/spec" in line or "/work/" in line
    ]
    link_targets = re.findall(r"\]\(([^)\s]+)\)", doc)
    offending += [
        target
        for target in link_targets
        if not target.startswith("#") and (":" in target or target.startswith("/"))
    ]
    assert not offending, f"docs/protocol.md points outside the repository: {offending}"
