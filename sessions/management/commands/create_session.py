"""``manage.py create_session``: create a session and print its id and tokens as JSON."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import BaseCommand, CommandError
from django.core.management.base import CommandParser

from sessions.auth import issue_current_token
from sessions.bus import MAX_EVENT_RING_SIZE
from sessions.models import AgentSession


class Command(BaseCommand):
    help = "Create a session; print {id, tokens: {read, publish}} as JSON."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--title", default="")
        parser.add_argument("--owner", help="username of the owner")
        parser.add_argument("--ring-size", type=int, default=None)
        parser.add_argument(
            "--no-stream-compression",
            action="store_true",
            help="never gzip this session's streams (docs/protocol.md, Compression)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        owner = None
        if options["owner"]:
            owner = get_user_model().objects.filter(username=options["owner"]).first()
            if owner is None:
                raise CommandError(f"no user {options['owner']!r}")
        ring_size = options["ring_size"]
        if ring_size is not None and not 1 <= ring_size <= MAX_EVENT_RING_SIZE:
            raise CommandError(f"--ring-size must be in [1, {MAX_EVENT_RING_SIZE:_}]")
        row = AgentSession.objects.create(
            title=options["title"],
            owner=owner,
            ring_size=ring_size,
            stream_compression=not options["no_stream_compression"],
        )
        subject = owner.get_username() if owner else "cli"
        owner_id = owner.pk if owner else None
        self.stdout.write(
            json.dumps(
                {
                    "id": row.id,
                    "tokens": {
                        "read": issue_current_token(row.id, ["read"], subject, user_id=owner_id),
                        "publish": issue_current_token(
                            row.id, ["publish"], subject, user_id=owner_id
                        ),
                    },
                }
            )
        )
