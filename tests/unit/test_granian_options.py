"""``qwenweb.granian_server.granian_options``: which HTTP versions granian offers."""

from __future__ import annotations

from pathlib import Path

from granian.constants import HTTPModes

from qwenweb.granian_server import granian_options
from sessions.conf import get_config


def _options(certfile: Path | None = None, keyfile: Path | None = None) -> dict[str, object]:
    return granian_options(
        bind="127.0.0.1",
        port=8000,
        workers=1,
        config=get_config(),
        fd_limit=1024,
        certfile=certfile,
        keyfile=keyfile,
    )


def test_clear_text_is_http1_only() -> None:
    # Detecting an HTTP/2 preface on clear-text connections costs ~12 KiB per idle stream
    # (issue 23); browsers speak HTTP/2 over TLS only.
    assert _options()["http"] == HTTPModes.http1


def test_tls_offers_http2_by_alpn() -> None:
    options = _options(certfile=Path("cert.pem"), keyfile=Path("key.pem"))
    assert options["http"] == HTTPModes.auto
