"""Granian for end-to-end tests: one place that says how the production server is started.

Until ``python -m qwenweb.serve`` serves with granian (issue 12, item 1), the tests start
granian directly with the options the production entry point is to use (ASGI interface,
uvloop); :func:`granian_argv` is the one line to switch to ``qwenweb.serve`` then.
:func:`make_tls` makes a certificate for the run (trustme: a CA of its own, a leaf for the
server's address, the key in PKCS#8 as granian requires) for HTTP/2 by ALPN over TLS.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import trustme
from cryptography.hazmat.primitives import serialization

APPLICATION = "qwenweb.asgi:application"


@dataclass(frozen=True)
class TLSFiles:
    """PEM files: the server's certificate chain and key, and the CA a client trusts."""

    cert: Path
    key: Path
    ca: Path


def make_tls(directory: Path, *hosts: str) -> TLSFiles:
    """Write a fresh CA and a certificate for ``hosts`` (default 127.0.0.1) to ``directory``."""
    ca = trustme.CA()
    leaf = ca.issue_cert(*(hosts or ("127.0.0.1",)))
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
    files = TLSFiles(directory / "cert.pem", directory / "key.pem", directory / "ca.pem")
    files.cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    ca.cert_pem.write_to_path(str(files.ca))
    return files


def granian_argv(
    port: int, host: str = "127.0.0.1", tls: TLSFiles | None = None, extra: Sequence[str] = ()
) -> list[str]:
    """The command line of the production server on ``host``:``port`` (TLS: HTTP/2 by ALPN).

    Granian with the ASGI interface and uvloop, as ``python -m qwenweb.serve`` is to start
    it; ``extra`` adds granian options.
    """
    argv = [
        sys.executable, "-m", "granian", "--interface", "asgi", "--loop", "uvloop",
        "--host", host, "--port", str(port), "--log-level", "warning",
    ]  # fmt: skip
    if tls is not None:
        argv += ["--ssl-certificate", str(tls.cert), "--ssl-keyfile", str(tls.key)]
    return [*argv, *extra, APPLICATION]
