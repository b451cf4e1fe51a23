"""Production entry point: daphne with flow control (``sessions.transport.flow_control``).

Usage: ``python -m qwenweb.serve -b 0.0.0.0 -p 8000 [any other daphne option]``. The
application is always ``qwenweb.asgi:application``; every option of the ``daphne``
command works (``--help`` lists them).
"""

from __future__ import annotations

import os
import sys

from daphne.cli import CommandLineInterface

from sessions.transport.flow_control import FlowControlServer

APPLICATION = "qwenweb.asgi:application"


class QwenwebCommandLine(CommandLineInterface):  # type: ignore[misc]  # daphne ships no types
    """Daphne's command line with :class:`FlowControlServer` (EB-21)."""

    server_class = FlowControlServer


def check_configuration() -> None:
    """Run Django's system checks (``qwenweb.E001`` for bad ``QWENWEB`` settings included)
    before serving, as ``runserver`` does: bad values stop start-up with their message
    (exit status 1) instead of turning every request into a 500."""
    import django
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    django.setup()
    try:
        call_command("check", fail_level="ERROR")
    except SystemCheckError as exc:
        sys.stderr.write(f"{exc}\n")
        raise SystemExit(1) from None


def clean_metrics_directory() -> None:
    """With ``PROMETHEUS_MULTIPROC_DIR`` set, remove the metric files of processes that no
    longer run (a previous run's workers), so their counts do not live on forever."""
    from sessions.ops.metrics import multiprocess_dir, remove_files_of_dead_processes

    directory = multiprocess_dir()
    if directory is not None:
        remove_files_of_dead_processes(directory)


def main(argv: list[str] | None = None) -> None:
    """Run the server with daphne's options from ``argv`` (default ``sys.argv[1:]``).

    Raises ``SystemExit(1)`` when a system check fails (:func:`check_configuration`).
    """
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "qwenweb.settings")
    args = list(sys.argv[1:] if argv is None else argv)
    if not any(arg in ("-h", "--help") for arg in args):
        check_configuration()
        clean_metrics_directory()
        args.append(APPLICATION)
    QwenwebCommandLine().run(args)


if __name__ == "__main__":
    main()
