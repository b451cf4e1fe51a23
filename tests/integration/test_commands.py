"""Management commands that need only the database: tokens and sessions."""

from __future__ import annotations

import datetime
import io
import json
import signal
import socket
import subprocess
import sys
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from sessions.auth import verify_token
from sessions.management.commands import demo as demo_module
from sessions.management.commands.demo import Command as DemoCommand
from sessions.models import AgentSession
from tests.support.server import free_port

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip()


def test_create_session_prints_id_and_working_tokens() -> None:
    created = json.loads(run("create_session", "--title", "t"))
    assert AgentSession.objects.get(pk=created["id"]).title == "t"
    assert verify_token(created["tokens"]["read"]).grants(created["id"], "read")
    assert verify_token(created["tokens"]["publish"]).grants(created["id"], "publish")
    assert AgentSession.objects.get(pk=created["id"]).stream_compression
    plain = json.loads(run("create_session", "--no-stream-compression"))
    assert not AgentSession.objects.get(pk=plain["id"]).stream_compression


def test_issue_token_scopes_one_session() -> None:
    # EB-12: tokens are scoped to one session and to read or publish.
    session_id = json.loads(run("create_session"))["id"]
    claims = verify_token(run("issue_token", session_id, "--scope", "read,publish"))
    assert claims.grants(session_id, "read")
    assert claims.grants(session_id, "publish")
    assert not claims.grants("another", "read")


def test_issue_token_create_grants_session_creation() -> None:
    claims = verify_token(run("issue_token", "--create"))
    assert claims.scopes == {"create"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("issue_token",), "give a session id"),
        (("issue_token", "00000000-0000-4000-8000-000000000000"), "no session"),
        (("issue_token", "--create", "x"), "takes no session id"),
        (("create_session", "--ring-size", "0"), "--ring-size must be in"),
        (("create_session", "--owner", "nobody"), "no user"),
    ],
)
def test_bad_arguments_give_a_clear_error(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        run(*args)


def test_issue_token_refuses_unknown_scope() -> None:
    session_id = json.loads(run("create_session"))["id"]
    with pytest.raises(CommandError, match="--scope takes read and/or publish"):
        run("issue_token", session_id, "--scope", "admin")


def test_demo_reuses_its_open_demo_session_and_starts_a_new_one_once_it_is_closed() -> None:
    command = DemoCommand(stdout=io.StringIO())
    user = command._demo_user()
    first = command._demo_session(user)
    assert command._demo_session(user).id == first.id  # `make demo` run twice: one session
    AgentSession.objects.filter(pk=first.id).update(status=AgentSession.Status.CLOSED)
    assert command._demo_session(user).id != first.id
    assert AgentSession.objects.filter(owner=user).count() == 2


def test_demo_does_not_reuse_a_session_a_running_server_holds() -> None:
    # A second demo (another port, same database) would get 503 session_held_elsewhere.
    command = DemoCommand(stdout=io.StringIO())
    user = command._demo_user()
    first = command._demo_session(user)
    held_until = timezone.now() + datetime.timedelta(seconds=30)
    AgentSession.objects.filter(pk=first.id).update(held_by="h:1:t", held_until=held_until)
    second = command._demo_session(user)
    assert second.id != first.id
    expired = timezone.now() - datetime.timedelta(seconds=1)
    AgentSession.objects.filter(pk=first.id).update(held_until=expired)
    assert command._demo_session(user).id in (first.id, second.id)  # newest free one


def test_demo_continues_the_session_a_crashed_server_still_holds() -> None:
    # After kill -9 the dead server's hold lasts SESSION_HOLD_TTL_S: it holds nothing.
    command = DemoCommand(stdout=io.StringIO())
    user = command._demo_user()
    first = command._demo_session(user)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)  # reaped: its pid names no process
    held_until = timezone.now() + datetime.timedelta(seconds=30)
    holder = f"{socket.gethostname()}:{dead.pid}:t"
    AgentSession.objects.filter(pk=first.id).update(held_by=holder, held_until=held_until)
    assert command._demo_session(user).id == first.id


def test_demo_refuses_a_port_that_is_taken() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"127.0.0.1:{port} is already in use"):
            run("demo", "--port", str(port), "--no-agent")


@pytest.mark.parametrize("port", ["0", "99999"])
def test_demo_refuses_a_port_out_of_range(port: str) -> None:
    # The rule of python -m qwenweb.serve (sessions.serving.listen), not an OverflowError.
    with pytest.raises(CommandError, match=f"^--port {port}: must be 1 to 65535"):
        run("demo", "--port", port, "--no-agent")


@pytest.mark.parametrize("sigint", ["handled", "ignored"])
def test_demo_stops_with_an_error_when_its_server_exits(
    monkeypatch: pytest.MonkeyPatch, sigint: str
) -> None:
    # A server that dies after coming up: the demo must not go on publishing into nothing.
    # "ignored": a demo started in the background of a script inherits SIGINT ignored.
    script = "import sys, time; time.sleep(0.5); sys.exit(3)"
    monkeypatch.setattr(demo_module.Command, "_wait_until_up", lambda self, base, server: None)
    real_popen = subprocess.Popen

    def dying_server(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        return real_popen([sys.executable, "-c", script], **kwargs)

    monkeypatch.setattr(subprocess, "Popen", dying_server)  # the demo command's server
    previous = signal.signal(
        signal.SIGINT, signal.SIG_IGN if sigint == "ignored" else signal.default_int_handler
    )
    try:
        with pytest.raises(CommandError, match="the server exited with status 3"):
            run("demo", "--port", str(free_port()), "--tokens-per-s", "5")
    finally:
        signal.signal(signal.SIGINT, previous)


def test_serve_shares_the_ring_budget_among_its_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    from qwenweb.serve import share_ring_budget
    from sessions.conf import get_config

    monkeypatch.setenv("QWENWEB_MAX_RING_BYTES_TOTAL", str(400 * 2**20))
    get_config.cache_clear()
    try:
        assert share_ring_budget(1) == 400 * 2**20
        assert share_ring_budget(4) == 100 * 2**20
        assert get_config().max_ring_bytes_total == 100 * 2**20  # what the workers read
    finally:
        monkeypatch.undo()
        get_config.cache_clear()
