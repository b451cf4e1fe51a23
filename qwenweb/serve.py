"""Production entry point: daphne with flow control (``qwenweb.flow_control``).

Usage: ``python -m qwenweb.serve -b 0.0.0.0 -p 8000 [any other daphne option]``. The
application is always ``qwenweb.asgi:application``; every option of the ``daphne``
command works (``--help`` lists them).
"""

from __future__ import annotations

import os
import sys

from daphne.cli import CommandLineInterface

from qwenweb.flow_control import FlowControlServer

APPLICATION = "qwenweb.asgi:application"


class QwenwebCommandLine(CommandLineInterface):  # type: ignore[misc]  # daphne ships no types
    """Daphne's command line with :class:`FlowControlServer` (EB-21)."""

    server_class = FlowControlServer


def main(argv: list[str] | None = None) -> None:
    """Run the server with daphne's options from ``argv`` (default ``sys.argv[1:]``)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "qwenweb.settings")
    args = list(sys.argv[1:] if argv is None else argv)
    if not any(arg in ("-h", "--help") for arg in args):
        args.append(APPLICATION)
    QwenwebCommandLine().run(args)


if __name__ == "__main__":
    main()
