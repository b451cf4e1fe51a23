"""``manage.py revoke_tokens --user U | --session S``: every older token answers 401.

Bumps the token version of the user (a username, or ``#<id>``) or of the session; open
streams carrying an older token end with ``stream_error`` (code ``token_revoked``) within
about a second in every server process (docs/protocol.md, "Revocation").
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import BaseCommand, CommandError
from django.core.management.base import CommandParser

from sessions.models import normalize_session_id
from sessions.token_revocation import revoke_session_tokens, revoke_user_tokens


class Command(BaseCommand):
    help = (
        "Revoke every token issued so far to a user (--user NAME or --user '#ID') or for a "
        "session (--session ID): they answer 401 token_revoked, open streams end."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--user", help="a username, or #<user id>")
        target.add_argument("--session", help="a session id")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["session"]:
            session_id = normalize_session_id(options["session"])
            version = revoke_session_tokens(session_id) if session_id else None
            if version is None:
                raise CommandError(f"no session {options['session']!r}")
            self.stdout.write(f"revoked the tokens of session {session_id} (version {version})")
            return
        raw = options["user"]
        users = get_user_model().objects
        if raw.startswith("#") and raw[1:].isdigit():
            user = users.filter(pk=int(raw[1:])).first()
        else:
            user = users.filter(username=raw).first()
        if user is None:
            raise CommandError(f"no user {raw!r}")
        version = revoke_user_tokens(user.pk)
        self.stdout.write(
            f"revoked the tokens of user {user.get_username()} (#{user.pk}, version {version})"
        )
