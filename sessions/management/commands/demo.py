"""``manage.py demo``: the whole demo in one command.

Creates the demo user and a session (or reuses the demo user's newest open demo session),
prints the URLs, tokens and a ``curl -N`` line, starts the development server (daphne via
``runserver``) and plays the demo agent into the session in a loop until Ctrl-C.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import BaseCommand, CommandError, call_command
from django.core.management.base import CommandParser

from sessions.auth import issue_current_token
from sessions.conf import get_config
from sessions.models import AgentSession

DEMO_USER = "demo"
DEMO_PASSWORD = "demo-password"  # noqa: S105 - a local demo account, printed to the user
DEMO_TITLE = "Demo agent session"


class Command(BaseCommand):
    help = "Set up demo data, start the server and stream a demo agent session."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--addr", default="127.0.0.1", help="bind address (127.0.0.1)")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--tokens-per-s", type=float, default=25.0)
        parser.add_argument(
            "--no-agent", action="store_true", help="start the server only; publish nothing"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # SIGTERM stops the demo like Ctrl-C does, so the server it started is stopped too.
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        call_command("migrate", verbosity=0, interactive=False)
        user = self._demo_user()
        session = self._demo_session(user)
        base = f"http://{options['addr']}:{options['port']}"
        read = issue_current_token(session.id, ["read"], user.get_username(), user_id=user.pk)
        publish = issue_current_token(session.id, ["publish"], user.get_username(), user_id=user.pk)
        lifetime_min = get_config().token_lifetime_s // 60
        events = f"{base}/session/{session.id}/events"
        bearer = f"'Authorization: Bearer {read}'"
        python = _python_command()
        self.stdout.write(
            f"""
qwenweb demo
  dashboard    {base}/   (log in as {DEMO_USER!r}, password {DEMO_PASSWORD!r})
  session page {base}/sessions/{session.id}/
  admin        {base}/admin/
  session      {session.id}
  read token   {read}
  publish token {publish}
  (tokens expire in {lifetime_min} min; `{python} manage.py issue_token {session.id}`
   prints a new read token, add `--scope publish` for a publish token)

Watch the session live (Ctrl-C stops curl; `: heartbeat` lines are keep-alives):
  curl -N -H {bearer} {events}
Resume exactly after event 40 (replay, then `replay_complete`, then live):
  curl -N -H {bearer} -H 'Last-Event-ID: 40' {events}
Or with the terminal client (reconnects by itself with Last-Event-ID):
  {python} manage.py tail_session {session.id} --url {base} --token {read}
"""
        )
        server = subprocess.Popen(  # noqa: S603 - our own interpreter and manage.py
            [
                sys.executable,
                "manage.py",
                "runserver",
                f"{options['addr']}:{options['port']}",
                "--noreload",
            ],
            cwd=settings.BASE_DIR,
            env={**os.environ, "QWENWEB_ACCESS_LOG_LEVEL": "WARNING"},
        )
        try:
            self._wait_until_up(base, server)
            if options["no_agent"]:
                server.wait()
                return
            self.stdout.write("demo agent: streaming (Ctrl-C stops everything)")
            call_command(
                "demo_agent",
                session.id,
                url=base,
                token=publish,
                tokens_per_s=options["tokens_per_s"],
                loop=True,
            )
        except KeyboardInterrupt:
            pass
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()

    def _demo_session(self, user: Any) -> AgentSession:
        """The demo user's newest open demo session (a second `make demo` continues it,
        with its history), else a new one."""
        session = (
            AgentSession.objects.filter(
                owner=user, title=DEMO_TITLE, status=AgentSession.Status.OPEN
            )
            .order_by("-created_at")
            .first()
        )
        if session is not None:
            self.stdout.write(f"reusing the demo session {session.id} (still open)")
            return session
        return AgentSession.objects.create(title=DEMO_TITLE, owner=user)

    def _demo_user(self) -> Any:
        user_model = get_user_model()
        user, created = user_model.objects.get_or_create(
            username=DEMO_USER, defaults={"is_staff": True, "is_superuser": True}
        )
        if created:
            user.set_password(DEMO_PASSWORD)
            user.save()
        return user

    def _wait_until_up(self, base: str, server: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if server.poll() is not None:
                raise CommandError(f"the server exited with status {server.returncode}")
            try:
                with urllib.request.urlopen(f"{base}/capabilities", timeout=2) as response:  # noqa: S310
                    json.load(response)
                    return
            except (OSError, urllib.error.URLError, ValueError):
                time.sleep(0.2)
        raise CommandError(f"the server did not answer at {base} within 60 s")


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _python_command() -> str:
    """How to run this interpreter from the project folder (``.venv/bin/python``)."""
    executable = Path(sys.executable)
    try:
        return str(executable.relative_to(Path(settings.BASE_DIR)))
    except ValueError:
        return str(executable)
