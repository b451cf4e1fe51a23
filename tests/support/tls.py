"""The tests' TLS: one local CA and server certificate per test run (``sessions.serving.devcert``).

Every ``https://`` URL a test talks to is one of its own servers, started with
:func:`certificate`'s files; :func:`client_context` trusts exactly that CA (and offers
``h2`` and/or ``http/1.1`` by ALPN).
"""

from __future__ import annotations

import functools
import ssl
import tempfile
from collections.abc import Sequence
from pathlib import Path

from sessions.serving.devcert import LocalCertificate, make_local_certificate


@functools.cache
def certificate() -> LocalCertificate:
    """The run's certificate files (made on first use, in a temporary directory)."""
    directory = Path(tempfile.mkdtemp(prefix="qwenweb-tls-"))
    return make_local_certificate(directory)


def client_context(alpn: Sequence[str] = ("http/1.1",)) -> ssl.SSLContext:
    """A client context trusting only :func:`certificate`'s CA, offering ``alpn``."""
    context = ssl.create_default_context(cafile=str(certificate().ca))
    context.set_alpn_protocols(list(alpn))
    return context


def tls_argv() -> list[str]:
    """``--certfile C --keyfile K`` for ``python -m qwenweb.serve``."""
    files = certificate()
    return ["--certfile", str(files.cert), "--keyfile", str(files.key)]
