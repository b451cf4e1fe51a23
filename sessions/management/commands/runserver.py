"""``runserver`` (daphne's, so it serves ASGI) plus ``--event-ring-size N``.

The option overrides ``RING_SIZE`` for that run (docs/protocol.md, "Errors and limits").
With ``QWENWEB_PARENT_PID`` in its environment (``manage.py demo`` sets it) the server dies
with that process (:mod:`sessions.ops.parent_death`).
"""

from __future__ import annotations

import os
from typing import Any

from daphne.management.commands.runserver import Command as DaphneRunserverCommand
from django.core.management import CommandError
from django.core.management.base import CommandParser

from sessions.backends import check_can_start
from sessions.backends.errors import BackendStartError
from sessions.bus import MAX_EVENT_RING_SIZE
from sessions.conf import ENV_OVERRIDES, get_config
from sessions.ops.parent_death import die_with_parent_from_environment
from sessions.transport.flow_control import FlowControlServer


class Command(DaphneRunserverCommand):  # type: ignore[misc]  # daphne ships no types
    # Daphne with flow control, so a client that stops reading is warned and evicted (EB-21).
    server_cls = FlowControlServer
    help = (
        "Start the development server (daphne with flow control, ASGI). "
        "--event-ring-size N sets the events kept per session for replay."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--event-ring-size",
            type=int,
            default=None,
            metavar="N",
            help=f"events kept per session for Last-Event-ID replay, 1 ... {MAX_EVENT_RING_SIZE}",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:  # started by `manage.py demo` (with --noreload): die with it
            die_with_parent_from_environment()
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        ring_size = options.get("event_ring_size")
        if ring_size is not None:
            if not 1 <= ring_size <= MAX_EVENT_RING_SIZE:
                raise CommandError(
                    f"--event-ring-size must be in [1, {MAX_EVENT_RING_SIZE:_}]; got {ring_size}"
                )
            # Through the environment, so the autoreloader's child process gets it too.
            os.environ[ENV_OVERRIDES["RING_SIZE"]] = str(ring_size)
            get_config.cache_clear()
        try:  # e.g. a durable log another process holds, or another deployment's: one line
            check_can_start()
        except BackendStartError as exc:
            raise CommandError(str(exc)) from None
        super().handle(*args, **options)
