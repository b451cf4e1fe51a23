"""``manage.py demo``: the whole demo in one command.

Creates the demo user and a session (or reuses the demo user's newest open demo session),
prints the URLs, tokens and a ``curl -N`` line, starts the development server (daphne via
``runserver``) and plays the demo agent into the session in a loop until Ctrl-C.

``--tls``: HTTP/2 instead (browsers speak it only over TLS). A local CA and a certificate
for localhost / 127.0.0.1 / ::1 are made once in ``var/tls/`` (``sessions.serving.devcert``,
kept for the next runs, so trusting the CA once is enough), and the demo is served by the
production entry point, ``python -m qwenweb.serve --certfile … --keyfile …`` (granian:
HTTP/2 by ALPN, HTTP/1.1 otherwise; DEBUG on, so Django still serves the static files).
It prints how to trust the CA.
"""

from __future__ import annotations

import _thread
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import BaseCommand, CommandError, call_command
from django.core.management.base import CommandParser
from django.utils import timezone

from sessions.auth import issue_current_token
from sessions.backends import check_can_start, rows
from sessions.backends.errors import BackendStartError
from sessions.conf import get_config
from sessions.models import AgentSession
from sessions.ops.parent_death import PARENT_PID_ENV
from sessions.serving.devcert import LocalCertificate, make_local_certificate
from sessions.serving.listen import CannotListen, another_port, check_can_listen, check_port

DEMO_USER = "demo"
DEMO_PASSWORD = "demo-password"  # noqa: S105 - a local demo account, printed to the user
DEMO_TITLE = "Demo agent session"
#: The demo's server drains its streams for this long on Ctrl-C (production: DRAIN_S, 10 s).
DEMO_DRAIN_S = "1"
#: How long the demo waits for its server to stop before killing its process group.
STOP_TIMEOUT_S = 30.0


class Command(BaseCommand):
    help = "Set up demo data, start the server and stream a demo agent session."

    #: The session this run created (None when it reused one): see :meth:`_drop_new_session`.
    _new_session: AgentSession | None = None

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--addr", default="127.0.0.1", help="bind address (127.0.0.1)")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--tokens-per-s", type=float, default=25.0)
        parser.add_argument(
            "--no-agent", action="store_true", help="start the server only; publish nothing"
        )
        parser.add_argument(
            "--tls",
            action="store_true",
            help="serve over TLS with HTTP/2 (granian), with a local certificate in var/tls/",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # SIGTERM stops the demo like Ctrl-C does, so the server it started is stopped too.
        signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
        _check_port_free(options["addr"], options["port"])
        call_command("migrate", verbosity=0, interactive=False)
        try:  # e.g. the durable log held by another demo: refused before making a session
            check_can_start()
        except BackendStartError as exc:
            raise CommandError(str(exc)) from None
        user = self._demo_user()
        session = self._demo_session(user)
        tls_note, server_argv = "", [
            sys.executable, "manage.py", "runserver", f"{options['addr']}:{options['port']}",
            "--noreload",
        ]  # fmt: skip
        scheme, curl = "http", "curl"
        if options["tls"]:
            scheme = "https"
            files = _local_certificate(Path(settings.BASE_DIR) / "var" / "tls")
            # This process's clients (the demo agent) trust the local CA.
            os.environ["SSL_CERT_FILE"] = str(files.ca)
            curl = f"curl --cacert {files.ca}"
            server_argv = [
                sys.executable, "-m", "qwenweb.serve", "-b", options["addr"],
                "-p", str(options["port"]), "--certfile", str(files.cert),
                "--keyfile", str(files.key),
            ]  # fmt: skip
            tls_note = f"""
HTTP/2 over TLS with a local certificate (valid for localhost, 127.0.0.1, ::1):
  trust its CA once: {files.ca}
    curl: add --cacert {files.ca}   (curl --http2 -sI shows HTTP/2)
    Chromium/Chrome: Settings > Privacy and security > Security > Manage certificates >
      Authorities > Import {files.ca.name}, "trust for websites"
    Firefox: Settings > Certificates > View Certificates > Authorities > Import
    Debian system-wide: cp {files.ca} /usr/local/share/ca-certificates/qwenweb-local.crt
      && update-ca-certificates
  (or accept the browser's warning once: the certificate is for this machine only)
"""
        base = f"{scheme}://{options['addr']}:{options['port']}"
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
  {curl} -N -H {bearer} {events}
Resume exactly after event 40 (replay, then `replay_complete`, then live):
  {curl} -N -H {bearer} -H 'Last-Event-ID: 40' {events}
  (with the epoch of that cursor too, from `curl -i`'s X-Event-Epoch header:
   add -H 'X-Event-Epoch: <epoch>'; another epoch answers state_resync_required)
Or with the terminal client (reconnects by itself with Last-Event-ID):
  {python} manage.py tail_session {session.id} --url {base} --token {read}
{tls_note}"""
        )
        # The server dies with this command, even with a `kill -9` of it (from this, the
        # main thread: the kernel watches the thread that starts it).
        env = {
            **os.environ,
            "QWENWEB_ACCESS_LOG_LEVEL": "WARNING",
            PARENT_PID_ENV: str(os.getpid()),
        }
        env.setdefault("QWENWEB_DRAIN_S", DEMO_DRAIN_S)
        # Its own process group: Ctrl-C reaches this command, which stops the server (and
        # granian's workers) in order; a server that does not stop is killed as a group.
        server = subprocess.Popen(  # noqa: S603 - our own interpreter and manage.py
            server_argv, cwd=settings.BASE_DIR, env=env, start_new_session=True
        )
        watcher = _ServerWatcher(server)
        try:
            try:
                self._wait_until_up(base, server)
            except CommandError:
                self._drop_new_session()  # never served: the next demo must not reuse it
                raise
            watcher.start()
            if options["no_agent"]:
                server.wait()
            else:
                self.stdout.write("demo agent: streaming (Ctrl-C stops everything)")
                call_command(
                    "demo_agent",
                    session.id,
                    url=base,
                    token=publish,
                    read_token=read,  # (turns count on in a session played again)
                    tokens_per_s=options["tokens_per_s"],
                    loop=True,
                )
        except KeyboardInterrupt:
            pass
        finally:
            # A second signal (make passes a group's SIGTERM on: it comes twice) must not
            # cut the stop short: _stop_server is bounded, and kills the group at its end.
            handlers = {
                n: signal.signal(n, signal.SIG_IGN) for n in (signal.SIGTERM, signal.SIGINT)
            }
            try:
                watcher.stopping = True
                _stop_server(server)
            finally:
                for signum, handler in handlers.items():
                    signal.signal(signum, handler)
        if watcher.exited or (options["no_agent"] and server.returncode):
            raise CommandError(f"the server exited with status {server.returncode}")

    def _demo_session(self, user: Any) -> AgentSession:
        """The demo user's newest open demo session that no running server holds (a
        second `make demo` continues it: with the durable backend, its history too), else
        a new one. A hold whose process is gone (a crash, `kill -9`) holds nothing, even
        before it lapses (:func:`~sessions.backends.rows.holder_alive`)."""
        candidates = AgentSession.objects.filter(
            owner=user, title=DEMO_TITLE, status=AgentSession.Status.OPEN
        ).order_by("-created_at")
        now = timezone.now()
        for session in candidates[:20]:
            held = session.held_until is not None and session.held_until > now
            if not held or not rows.holder_alive(session.held_by):
                self.stdout.write(f"reusing the demo session {session.id} (still open)")
                return session
        self._new_session = AgentSession.objects.create(title=DEMO_TITLE, owner=user)
        return self._new_session

    def _drop_new_session(self) -> None:
        """Delete the session :meth:`_demo_session` created for a server that never came
        up (another demo held the event log, say): otherwise it would be the newest open
        demo session, and the next demo would continue it instead of the one it served."""
        created = self._new_session
        if created is not None:
            AgentSession.objects.filter(pk=created.pk).delete()
            self._new_session = None

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


def _local_certificate(directory: Path) -> LocalCertificate:
    """The demo's certificate in ``directory``: made once, then reused while valid."""
    files = LocalCertificate(directory / "ca.pem", directory / "cert.pem", directory / "key.pem")
    if all(path.is_file() for path in (files.ca, files.cert, files.key)):
        from cryptography import x509

        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        if cert.not_valid_after_utc.timestamp() > time.time() + 24 * 3600:
            return files
    return make_local_certificate(directory)


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _check_port_free(addr: str, port: int) -> None:
    """Raise CommandError when ``--port`` is out of range or ``addr:port`` is taken
    (another demo, say): the demo would otherwise find that server answering and publish
    into it. The rule is :mod:`sessions.serving.listen`'s, shared with ``qwenweb.serve``."""
    try:
        check_port(port)
    except CannotListen as exc:
        raise CommandError(f"--port {port}: {exc}") from None
    try:
        check_can_listen(addr, port)
    except CannotListen as exc:
        raise CommandError(
            exc.in_use_message(
                other="another demo", retry=f'make demo ARGS="--port {another_port(port)}"'
            )
        ) from None


class _ServerWatcher(threading.Thread):
    """Interrupts the demo (as SIGTERM does) when its server exits on its own.

    By SIGTERM's handler, not SIGINT's: a demo started in the background of a script
    inherits SIGINT ignored, and ``interrupt_main`` then does nothing (the demo would go on
    publishing to a dead server until its retries ran out)."""

    def __init__(self, server: subprocess.Popen[bytes]) -> None:
        super().__init__(name="demo-server-watcher", daemon=True)
        self.server = server
        self.stopping = False
        self.exited = False

    def run(self) -> None:
        self.server.wait()
        if not self.stopping:
            self.exited = True
            _thread.interrupt_main(signal.SIGTERM)  # (its handler: _raise_keyboard_interrupt)


def _stop_server(server: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server (it drains, then stops); after ``STOP_TIMEOUT_S`` kill its whole
    process group, so no worker is left holding the port or the session."""
    if server.poll() is None:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(timeout=STOP_TIMEOUT_S)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(server.pid, signal.SIGKILL)  # any worker left behind
    server.wait()


def _python_command() -> str:
    """How to run this interpreter from the project folder (``.venv/bin/python``)."""
    executable = Path(sys.executable)
    try:
        return str(executable.relative_to(Path(settings.BASE_DIR)))
    except ValueError:
        return str(executable)
