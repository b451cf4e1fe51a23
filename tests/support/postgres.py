"""Check that the PostgreSQL of ``make test-postgres`` answers, before the tests run.

``python -m tests.support.postgres postgres://user@host:5432/name`` connects to the
server's ``postgres`` database (where pytest-django creates and drops ``test_<name>``),
waiting at most ``CONNECT_TIMEOUT_S``. Exit status 0 when it answers; otherwise 1 with one
line naming the URL and the reason, so CI fails clearly instead of erroring every test.
"""

from __future__ import annotations

import sys
from typing import Final
from urllib.parse import urlsplit

import psycopg

CONNECT_TIMEOUT_S: Final = 5


def main(argv: list[str]) -> int:
    """Return 0 if the server of ``argv[0]`` (a ``postgres://`` URL) answers, else 1."""
    if len(argv) != 1:
        print("usage: python -m tests.support.postgres postgres://user@host:port/name")
        return 2
    url = argv[0]
    try:
        psycopg.connect(url, dbname="postgres", connect_timeout=CONNECT_TIMEOUT_S).close()
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split())
        print(f"PostgreSQL is not reachable at {_redacted(url)}: {reason}", file=sys.stderr)
        return 1
    return 0


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)).geturl()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
