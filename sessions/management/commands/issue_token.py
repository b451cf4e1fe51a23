"""``manage.py issue_token``: print a bearer token (``sessions.auth``)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import BaseCommand, CommandError
from django.core.management.base import CommandParser

from sessions.auth import ANY_SESSION, SCOPES, issue_current_token
from sessions.models import AgentSession


class Command(BaseCommand):
    help = (
        "Print a signed bearer token for one session (scopes read, publish) "
        "or, with --create, one that may create sessions."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("session_id", nargs="?", help="the session the token is for")
        parser.add_argument(
            "--scope",
            default="read",
            help="comma-separated scopes: read, publish (default: read)",
        )
        parser.add_argument(
            "--create", action="store_true", help="a token that may create sessions (POST /session)"
        )
        parser.add_argument("--subject", default="cli", help="who the token is for (a username)")

    def handle(self, *args: Any, **options: Any) -> None:
        scopes = {s.strip() for s in options["scope"].split(",") if s.strip()}
        if options["create"]:
            if options["session_id"]:
                raise CommandError("--create takes no session id")
            session_id, scopes = ANY_SESSION, {"create"}
        else:
            session_id = options["session_id"]
            if not session_id:
                raise CommandError("give a session id, or --create")
            if not AgentSession.objects.filter(pk=session_id).exists():
                raise CommandError(f"no session {session_id!r}")
            if not scopes or not scopes <= SCOPES - {"create"}:
                raise CommandError("--scope takes read and/or publish, comma-separated")
        # A subject that names a user: the token carries the user's id and versions, so
        # deactivating the user or `revoke_tokens --user` revokes it.
        user_id = (
            get_user_model()
            .objects.filter(username=options["subject"])
            .values_list("pk", flat=True)
            .first()
        )
        self.stdout.write(
            issue_current_token(session_id, scopes, options["subject"], user_id=user_id)
        )
