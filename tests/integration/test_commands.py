"""Management commands that need only the database: tokens and sessions."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from sessions.auth import verify_token
from sessions.management.commands.demo import Command as DemoCommand
from sessions.models import AgentSession

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
