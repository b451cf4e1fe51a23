"""``manage.py tail_session <session_id>``: print a session's frames as they arrive."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management import BaseCommand, CommandError
from django.core.management.base import CommandParser

from sessions.api_client import EventStreamClient
from sessions.bus import is_valid_epoch
from sessions.wire import ServerSentEvent
from sessions.ws_api_client import WebSocketStreamClient, socket_url


class Command(BaseCommand):
    help = (
        "Follow a session's event stream in the terminal; reconnects with Last-Event-ID "
        "after the server's retry delay and stops when the session ends (204). "
        "--transport ws follows it over the WebSocket (GET /ws) with the same output."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("session_id")
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server")
        token = parser.add_mutually_exclusive_group(required=True)
        token.add_argument("--token", help="a token with the read scope")
        token.add_argument(
            "--token-file",
            help="a file holding a read token; re-read on 401 and after a stream_error "
            "token_revoked / token_expired, waiting up to 10 s for it to hold a new token "
            "(refresh it from elsewhere to keep following)",
        )
        parser.add_argument("--last-event-id", default="", help="resume after this id")
        parser.add_argument(
            "--epoch",
            default="",
            help="the epoch --last-event-id came from (printed at `connected`): another "
            "epoch then starts with state_resync_required instead of a silent gap (EB-7); "
            "write --epoch=VALUE, as an epoch may start with -",
        )
        parser.add_argument(
            "--transport",
            choices=("sse", "ws"),
            default="sse",
            help="sse: GET /session/<id>/events; ws: one subscription over GET /ws "
            "(token refreshed in band when --token-file changes)",
        )
        parser.add_argument("--max-events", type=int, default=None, help="stop after N events")
        parser.add_argument(
            "--max-connections", type=int, default=None, help="stop after N connections"
        )

    def handle(self, *args: Any, **options: Any) -> None:

        def show(event: ServerSentEvent) -> None:
            # Real events carry their id first in the envelope; synthetic frames have none.
            marker = f"{event.last_event_id:>6}" if event.data.startswith('{"id":') else "     -"
            self.stdout.write(f"{marker} {event.type} {event.data}")
            self.stdout.flush()

        def status(line: str) -> None:
            self.stderr.write(f"# {line}")

        token_file = options["token_file"]

        def read_token_file() -> str:
            with open(token_file, encoding="utf-8") as handle:
                return handle.read().strip()

        if options["epoch"] and not is_valid_epoch(options["epoch"]):
            raise CommandError("--epoch must be 1 to 64 of A-Z, a-z, 0-9, '_' and '-'")
        if options["epoch"] and not options["last_event_id"]:
            raise CommandError("--epoch needs --last-event-id (the cursor it belongs to)")
        try:
            token = options["token"] or read_token_file()
        except OSError as exc:
            raise CommandError(f"cannot read --token-file: {exc}") from None
        common: dict[str, Any] = {
            "refresh_token": read_token_file if token_file else None,
            "on_event": show,
            "on_status": status,
            "last_event_id": options["last_event_id"],
            "max_events": options["max_events"],
            "max_connections": options["max_connections"],
        }
        client: EventStreamClient
        if options["transport"] == "ws":
            try:
                url = socket_url(options["url"])
            except ValueError as exc:
                raise CommandError(str(exc)) from None
            client = WebSocketStreamClient(url, token, session_id=options["session_id"], **common)
        else:
            url = f"{options['url'].rstrip('/')}/session/{options['session_id']}/events"
            client = EventStreamClient(url, token, **common)
        client.epoch = options["epoch"] or None
        try:
            code = client.run()
        except KeyboardInterrupt:
            code = 0
        if code:
            raise CommandError("stream stopped", returncode=code)
        sys.stdout.flush()
