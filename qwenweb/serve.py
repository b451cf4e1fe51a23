"""Production entry point: ``python -m qwenweb.serve``, granian by default.

Usage::

    python -m qwenweb.serve -b 127.0.0.1 -p 8000 [--certfile C --keyfile K]
        [--workers N] [--proxy-headers] [--server granian|daphne] [daphne options]

- ``--server granian`` (default): granian's ASGI server on uvloop, options built by
  :func:`qwenweb.granian_server.granian_options` (HTTP/2 by ALPN with ``--certfile`` and
  ``--keyfile``; static files from ``STATIC_ROOT`` when DEBUG is off; the request header
  deadline ``REQUEST_HEADER_TIMEOUT_S``; limits for long-lived streams).
- ``--server daphne``: today's daphne with flow control
  (:class:`sessions.transport.flow_control.FlowControlServer`), HTTP/1.1 only; every other
  option is passed to daphne. It serves no static file when DEBUG is off (it says so).

Bad input exits with status 2 and one line saying what is wrong, before any server
starts: an unknown ``--server`` (the choices are listed), a ``-b`` that is not an IP
address, a ``-p`` outside 1 … 65535, an address and port that cannot be bound (in use:
which ``address:port``, and how to choose another; :mod:`sessions.serving.listen`, the rule
``manage.py demo`` uses too), a certificate or key that is missing or unreadable (the file
is named), only one of the two, a certificate or key that ``ssl`` cannot load (not PEM,
encrypted, or a key of another certificate: :func:`check_tls`), ``--workers`` above 1 with
a backend that holds sessions in one process, with DEBUG off a ``STATIC_ROOT`` without
``collectstatic``'s manifest. A failing system check exits 1 (:func:`check_configuration`).

Started with ``QWENWEB_PARENT_PID`` in its environment (``manage.py demo`` does so), the
process dies with that parent (:mod:`sessions.ops.parent_death`); granian's workers always
die with the main process.

Before serving, the file-descriptor limit (``RLIMIT_NOFILE``) is raised to its hard limit
(:func:`raise_fd_limit`): every open stream holds a descriptor.
"""

from __future__ import annotations

import argparse
import os
import resource
import ssl
import sys
from pathlib import Path
from typing import Final, NoReturn

from qwenweb.granian_server import APPLICATION, StaticMount
from sessions.ops.parent_death import die_with_parent_from_environment
from sessions.serving.listen import (
    CannotListen,
    another_port,
    check_address,
    check_can_listen,
    check_port,
)

SERVERS: Final = ("granian", "daphne")
"""The ``--server`` choices; the first is the default."""

SERVER_HELP: Final = (
    f"one of {', '.join(SERVERS)} (default {SERVERS[0]}). daphne reads a whole request "
    "body into memory before the application can refuse it (413): behind daphne, cap "
    "request bodies in front of it (nginx client_max_body_size)"
)


def setup_django() -> None:
    """``django.setup()``; settings Django refuses to load (``ImproperlyConfigured``: e.g.
    ``DJANGO_DEBUG=0`` without ``DJANGO_SECRET_KEY``) exit 2 with that one line."""
    import django
    from django.core.exceptions import ImproperlyConfigured

    try:
        django.setup()
    except ImproperlyConfigured as exc:
        _fail(str(exc))


def check_configuration() -> None:
    """Run Django's system checks (``qwenweb.E001`` for bad ``QWENWEB`` settings included)
    before serving, as ``runserver`` does: bad values stop start-up with their message
    (exit status 1) instead of turning every request into a 500. Settings Django refuses
    to load (``ImproperlyConfigured``) exit 2 with one line."""
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError
    from django.db import connections

    setup_django()
    try:
        call_command("check", fail_level="ERROR")
    except SystemCheckError as exc:
        sys.stderr.write(f"{exc}\n")
        raise SystemExit(1) from None
    finally:
        connections.close_all()  # the workers are forked from this process


def check_backend() -> None:
    """Let the configured backend refuse to start (``Backend.check_can_start``: e.g. the
    durable event log is locked, unreadable or another deployment's): one line naming
    the file, exit status 2, before any server starts."""
    from sessions.backends import check_can_start
    from sessions.backends.errors import BackendStartError

    try:
        check_can_start()
    except BackendStartError as exc:
        _fail(str(exc))


def clean_metrics_directory() -> None:
    """With ``PROMETHEUS_MULTIPROC_DIR`` set, remove the metric files of processes that no
    longer run (a previous run's workers), so their counts do not live on forever; the
    workers of this run then share the directory (docs/operators.md, "The metrics")."""
    from sessions.ops.metrics import multiprocess_dir, remove_files_of_dead_processes

    directory = multiprocess_dir()
    if directory is not None:
        remove_files_of_dead_processes(directory)


def raise_fd_limit() -> int:
    """Raise this process's ``RLIMIT_NOFILE`` soft limit to its hard limit where allowed.

    Returns the soft limit in force afterwards (descriptors). Never raises: a limit that
    cannot be raised is kept (and returned).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if target == resource.RLIM_INFINITY:
        try:
            target = int(Path("/proc/sys/fs/nr_open").read_text())
        except (OSError, ValueError):
            return soft
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError):
            pass
    return soft


def _fail(message: str) -> NoReturn:
    sys.stderr.write(f"qwenweb.serve: error: {message}\n")
    raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m qwenweb.serve",
        description="Serve qwenweb (granian by default; --server daphne for daphne).",
        epilog="With --server daphne, any other daphne option is passed on.",
    )
    parser.add_argument("-b", "--bind", default="127.0.0.1", help="address (127.0.0.1)")
    parser.add_argument("-p", "--port", type=int, default=8000, help="port (8000)")
    parser.add_argument("--certfile", type=Path, help="TLS certificate chain (PEM)")
    parser.add_argument("--keyfile", type=Path, help="TLS private key (PEM, PKCS#8)")
    parser.add_argument(
        "--workers", type=int, default=1, metavar="N", help="worker processes (Redis backend)"
    )
    parser.add_argument(
        "--proxy-headers",
        action="store_true",
        help="trust X-Forwarded-For/-Proto from 127.0.0.1 (behind nginx)",
    )
    # Checked by hand (not argparse's `choices`), so the message and status are ours.
    parser.add_argument("--server", default=SERVERS[0], help=SERVER_HELP)
    return parser


def _readable(option: str, path: Path | None) -> Path | None:
    if path is None:
        return None
    try:
        with path.open("rb") as handle:
            handle.read(1)
    except OSError as exc:
        _fail(f"{option} {path}: cannot read it ({exc.strerror or exc})")
    return path


def _check_listen_options(bind: str, port: int) -> None:
    """``-b`` an IP address, ``-p`` 1 … 65535 (:mod:`sessions.serving.listen`), or exit 2."""
    try:
        check_address(bind)
    except CannotListen as exc:
        _fail(f"-b {bind}: {exc}")
    try:
        check_port(port)
    except CannotListen as exc:
        _fail(f"-p {port}: {exc}")


def _check_can_listen(bind: str, port: int) -> None:
    """Exit 2 when ``bind:port`` cannot be bound now: called just before the server
    starts (a port taken in between still fails in the server: see
    :func:`sessions.serving.listen.check_can_listen`)."""
    try:
        check_can_listen(bind, port)
    except CannotListen as exc:
        if exc.in_use:
            message = exc.in_use_message(other="another server", retry=f"-p {another_port(port)}")
            _fail(f"-p {port}: {message}")
        _fail(f"-b {bind} -p {port}: {exc}")


class _EncryptedKey(Exception):
    """Raised by :func:`_no_password`: the key asks for a passphrase."""


def _no_password() -> bytes:
    # Without a callback OpenSSL would ask on the terminal (or fail with EINVAL).
    raise _EncryptedKey


def check_tls(certfile: Path, keyfile: Path) -> None:
    """Load the certificate chain and key with :mod:`ssl` as granian does first, so a bad
    file is one line (exit 2) naming the option instead of ``ssl.SSLError: PEM lib``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certfile, keyfile, password=_no_password)
    except _EncryptedKey:
        _fail(f"--keyfile {keyfile}: the key is encrypted; give it without a passphrase")
    except ssl.SSLError as exc:
        try:  # Which file? The certificates alone, without the key:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cafile=certfile)
        except ssl.SSLError:
            _fail(f"--certfile {certfile}: no PEM certificate in it")
        if exc.reason == "KEY_VALUES_MISMATCH":
            _fail(f"--keyfile {keyfile}: not the key of the certificate in --certfile {certfile}")
        _fail(f"--keyfile {keyfile}: no PEM private key in it")
    except OSError as exc:  # read a moment ago (_readable): gone or changed since
        _fail(f"--certfile {certfile}, --keyfile {keyfile}: cannot load them ({exc})")


def _check_workers(workers: int) -> None:
    if workers < 1:
        _fail(f"--workers must be at least 1; got {workers}")
    if workers == 1:
        return
    from sessions.backends import resolve_backend
    from sessions.conf import get_config

    backend = get_config().backend
    if not resolve_backend(backend).supports_multiple_processes:
        _fail(
            f"--workers {workers} needs a backend shared by several processes "
            f"(QWENWEB_BACKEND=redis); the {backend!r} backend holds each session in one "
            "process, so each worker would hand out its own ids for the same session"
        )


def share_ring_budget(workers: int) -> int:
    """Give each of ``workers`` worker processes its share of ``MAX_RING_BYTES_TOTAL``
    (the budget of the whole server, at least 1 MiB each) and return it.

    Sets ``QWENWEB_MAX_RING_BYTES_TOTAL`` in this process's environment, which the workers
    inherit, so ``--workers N`` no longer multiplies the budget by N
    (docs/protocol.md, "Ring limits"). Nothing changes for one worker.
    """
    from sessions.conf import ENV_OVERRIDES, get_config

    config = get_config()
    if workers <= 1:
        return config.max_ring_bytes_total
    share = max(1024 * 1024, config.max_ring_bytes_total // workers)
    os.environ[ENV_OVERRIDES["MAX_RING_BYTES_TOTAL"]] = str(share)
    get_config.cache_clear()
    return share


def static_mount() -> StaticMount | None:
    """Where granian serves the static files from: ``STATIC_ROOT`` at ``STATIC_URL``,
    with DEBUG off only (with DEBUG on, Django serves them from the app folders).

    Exits 2 when DEBUG is off and ``collectstatic`` has not filled ``STATIC_ROOT``.
    """
    from django.conf import settings

    if settings.DEBUG or "://" in settings.STATIC_URL:
        return None
    root = Path(settings.STATIC_ROOT)
    if not (root / "staticfiles.json").is_file():
        _fail(
            f"STATIC_ROOT {root} has no staticfiles.json: run "
            "`python manage.py collectstatic --noinput` with the same settings first"
        )
    return StaticMount("/" + settings.STATIC_URL.strip("/"), root)


def main(argv: list[str] | None = None) -> None:
    """Serve with the options of ``argv`` (default ``sys.argv[1:]``) until stopped.

    Raises ``SystemExit(2)`` for bad options (module docstring) and ``SystemExit(1)``
    when a system check fails.
    """
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "qwenweb.settings")
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if any(arg in ("-h", "--help") for arg in args):
        parser.print_help()
        return
    options, rest = parser.parse_known_args(args)
    try:  # started by `manage.py demo`: die with it (granian's workers die with us)
        die_with_parent_from_environment()
    except ValueError as exc:
        _fail(str(exc))
    if options.server not in SERVERS:
        _fail(f"unknown --server {options.server!r}; choose one of: {', '.join(SERVERS)}")
    _check_listen_options(options.bind, options.port)
    certfile = _readable("--certfile", options.certfile)
    keyfile = _readable("--keyfile", options.keyfile)
    if (certfile is None) != (keyfile is None):
        _fail("--certfile and --keyfile go together: give both or neither")
    if options.server == "daphne":
        _serve_daphne(options, rest)
        return
    if rest:
        _fail(f"unknown option(s) for granian: {' '.join(rest)} (daphne's need --server daphne)")
    if certfile is not None and keyfile is not None:
        check_tls(certfile, keyfile)
    setup_django()
    # Before the system checks: they load the URLconf, whose `static()` calls fail
    # without collectstatic's manifest (DEBUG off) with a traceback instead of this line.
    static = static_mount()
    check_configuration()
    check_backend()
    clean_metrics_directory()
    _check_workers(options.workers)
    share_ring_budget(options.workers)
    from qwenweb.granian_server import granian_options, serve
    from sessions.conf import get_config

    _check_can_listen(options.bind, options.port)
    serve(
        granian_options(
            bind=options.bind,
            port=options.port,
            workers=options.workers,
            config=get_config(),
            fd_limit=raise_fd_limit(),
            certfile=certfile,
            keyfile=keyfile,
            static=static,
            proxy_headers=options.proxy_headers,
        )
    )


def _serve_daphne(options: argparse.Namespace, rest: list[str]) -> None:
    """Today's daphne with flow control (HTTP/1.1; TLS through daphne's endpoints)."""
    from daphne.cli import CommandLineInterface

    from sessions.transport.flow_control import FlowControlServer

    class QwenwebCommandLine(CommandLineInterface):  # type: ignore[misc]  # no types
        """Daphne's command line with :class:`FlowControlServer` (EB-21)."""

        server_class = FlowControlServer

    if options.workers != 1:
        _fail("--workers is for granian; run one daphne process per port instead")
    if options.certfile is not None:
        _fail("--certfile/--keyfile are for granian; daphne here speaks plain HTTP/1.1")
    check_configuration()
    check_backend()
    clean_metrics_directory()
    from django.conf import settings

    if not settings.DEBUG:
        sys.stderr.write(
            "qwenweb.serve: daphne serves no static file with DEBUG off: serve STATIC_ROOT "
            "from a front web server (docs/deployment.md), or use --server granian\n"
        )
    raise_fd_limit()
    _check_can_listen(options.bind, options.port)
    argv = ["-b", options.bind, "-p", str(options.port), *rest]
    if options.proxy_headers:
        argv.append("--proxy-headers")
    QwenwebCommandLine().run([*argv, APPLICATION])


if __name__ == "__main__":
    main()
