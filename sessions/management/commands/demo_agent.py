"""``manage.py demo_agent <session_id>``: play the demo agent into a session over HTTP."""

from __future__ import annotations

import time
import uuid
from typing import Any

from django.core.management import BaseCommand, CommandError
from django.core.management.base import CommandParser

from sessions.api_client import ApiCallError, Publisher, newest_events
from sessions.scripted_agent import agent_turns, last_turn


class Command(BaseCommand):
    help = (
        "Stream a scripted agent (a real document as agent_message_chunk events, tool calls, "
        "turn_complete) into a session through the HTTP publish API."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("session_id")
        parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server")
        parser.add_argument("--token", required=True, help="a token with the publish scope")
        parser.add_argument(
            "--tokens-per-s", type=float, default=25.0, help="pace of message chunks (default 25)"
        )
        parser.add_argument(
            "--read-token",
            help="a token with the read scope: the first turn is then numbered after the "
            "session's newest turn_complete (a session played again counts on)",
        )
        parser.add_argument("--loop", action="store_true", help="replay the script until stopped")
        parser.add_argument("--pause-s", type=float, default=3.0, help="pause between runs")

    def handle(self, *args: Any, **options: Any) -> None:
        rate = options["tokens_per_s"]
        if not rate > 0:
            raise CommandError("--tokens-per-s must be positive")
        publisher = Publisher(options["url"], options["session_id"], options["token"])
        turn = self._first_turn(options)
        try:
            while True:
                count = last_id = 0
                run = uuid.uuid4().hex[:8]  # each run's own tool call ids
                for event_type, data, tokens in agent_turns(run, turn):
                    time.sleep(tokens / rate)
                    last_id = publisher.publish(event_type, data)
                    count += 1
                    turn += event_type == "turn_complete"
                self.stdout.write(f"demo agent: published {count} events (last id {last_id})")
                if not options["loop"]:
                    return
                time.sleep(options["pause_s"])
        except ApiCallError as exc:
            raise CommandError(f"publish failed: {exc}") from None
        except OSError as exc:
            raise CommandError(f"server unreachable at {options['url']}: {exc}") from None
        except KeyboardInterrupt:
            self.stdout.write("demo agent: stopped")
        finally:
            publisher.close()

    def _first_turn(self, options: dict[str, Any]) -> int:
        """1, or one more than the session's newest ``turn_complete`` (``--read-token``)."""
        if not options["read_token"]:
            return 1
        try:
            history = newest_events(options["url"], options["session_id"], options["read_token"])
            return last_turn(history) + 1
        except (ApiCallError, OSError, ValueError) as exc:
            self.stderr.write(f"demo agent: the session's turns are unknown ({exc}); from 1")
            return 1
