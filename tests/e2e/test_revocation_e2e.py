"""Revocation against a real server process (docs/protocol.md, "Revocation").

The server (daphne, memory backend) and the management commands are separate processes
sharing one SQLite file: nothing tells the server of a revocation made by a command, so
what ends its streams is its own check of the versions (the per-request check, the sweep
of open streams). Every wait is bounded.
"""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import pytest

from tests.support.manage import manage, manage_output, manage_process, owned_session
from tests.support.server import ServerProcess, open_stream, request_json

pytestmark = pytest.mark.e2e

WITHIN_S = 2.0


@pytest.mark.asyncio
async def test_deactivating_the_owner_revokes_tokens_and_ends_the_open_stream(
    daphne_server: ServerProcess, e2e_database: Path
) -> None:
    name, sid, tokens = owned_session(e2e_database)
    events_url = f"{daphne_server.base_url}/session/{sid}/events"
    assert request_json("POST", events_url, {"type": "a"}, token=tokens["publish"])[0] == 200
    stream = await open_stream(daphne_server.port, f"/session/{sid}/events", tokens["read"])
    assert stream.status == 200
    code = (
        "from django.contrib.auth.models import User; "
        f"u = User.objects.get(username={name!r}); u.is_active = False; u.save()"
    )
    manage_output(e2e_database, "shell", "-c", code)
    deactivated_at = time.monotonic()
    try:
        await stream.read_until(lambda evs: any(e.type == "stream_error" for e in evs), WITHIN_S)
    finally:
        stream.close()
    ended_after_s = time.monotonic() - deactivated_at
    error = json.loads(next(e.data for e in stream.events if e.type == "stream_error"))
    assert error["data"]["code"] == "token_revoked"
    status, body = request_json("POST", events_url, {"type": "b"}, token=tokens["publish"])
    assert (status, body["code"]) == (401, "token_revoked")
    assert ended_after_s < WITHIN_S
    assert time.monotonic() - deactivated_at < WITHIN_S + 1  # the publish answered at once


@pytest.mark.asyncio
async def test_a_closed_sessions_stream_answers_204_to_a_token_issued_before_the_close(
    daphne_server: ServerProcess, e2e_database: Path
) -> None:
    _, sid, tokens = owned_session(e2e_database)
    close_url = f"{daphne_server.base_url}/session/{sid}/close"
    assert request_json("POST", close_url, None, token=tokens["publish"])[0] == 200
    manage_output(e2e_database, "revoke_tokens", "--session", sid)
    stream = await open_stream(daphne_server.port, f"/session/{sid}/events", tokens["read"])
    try:
        await stream.read_to_end()
    finally:
        stream.close()
    assert (stream.status, bytes(stream.body)) == (204, b"")


def test_tail_session_rereads_its_token_file_when_the_token_is_revoked(
    daphne_server: ServerProcess, e2e_database: Path, tmp_path: Path
) -> None:
    name, sid, tokens = owned_session(e2e_database)
    events_url = f"{daphne_server.base_url}/session/{sid}/events"
    token_file = tmp_path / "read-token"
    token_file.write_text(tokens["read"])
    with manage_process(
        e2e_database, "tail_session", sid, "--url", daphne_server.base_url,
        "--token-file", str(token_file), "--last-event-id", "0",
    ) as tail:  # fmt: skip
        assert tail.stdout is not None
        assert "replay_complete" in tail.stdout.readline()
        manage_output(e2e_database, "revoke_tokens", "--user", name)
        fresh = manage_output(
            e2e_database, "issue_token", sid, "--scope", "read", "--subject", name
        )
        token_file.write_text(fresh.strip())
        assert "token_revoked" in tail.stdout.readline()  # the old token's stream ended
        old_publish = request_json("POST", events_url, {"type": "x"}, token=tokens["publish"])
        assert old_publish[0] == 401
        publish = manage_output(
            e2e_database, "issue_token", sid, "--scope", "publish", "--subject", name
        ).strip()
        assert request_json("POST", events_url, {"type": "after"}, token=publish)[0] == 200
        # Resumed with the fresh token: the resume's replay_complete comes before "after"
        # or after it (replayed), whichever of the reconnect and the publish came first.
        line = tail.stdout.readline()
        if "replay_complete" in line:
            line = tail.stdout.readline()
        assert "after" in line
        close_url = f"{daphne_server.base_url}/session/{sid}/close"
        assert request_json("POST", close_url, None, token=publish)[0] == 200
        out, err = tail.communicate(timeout=30)
    assert tail.returncode == 0, err
    assert "session_closed" in out
    assert "retrying with a fresh token" in err


@pytest.mark.asyncio
async def test_revoke_tokens_reaches_the_streams_of_every_redis_process(tmp_path: Path) -> None:
    # The command process has no server loop: it relays the revocation on the Redis control
    # channel, and each server process ends its own streams on hearing it.
    from tests.support.server import migrate, redis_cluster

    database = tmp_path / "db.sqlite3"
    migrate(database)
    streams = []
    with redis_cluster(database, tmp_path) as cluster:
        servers = [cluster("a"), cluster("b")]
        try:
            _, sid, tokens = owned_session(database)
            for server in servers:
                stream = await open_stream(server.port, f"/session/{sid}/events", tokens["read"])
                assert stream.status == 200
                streams.append(stream)
            env = {"QWENWEB_BACKEND": "redis", "QWENWEB_REDIS_URL": cluster.redis_url,
                   "QWENWEB_REDIS_KEY_PREFIX": cluster.prefix}  # fmt: skip
            manage(database, "revoke_tokens", "--session", sid, check=True, env=env)
            for stream in streams:
                await stream.read_until(
                    lambda evs: any(e.type == "stream_error" for e in evs), WITHIN_S
                )
                error = json.loads(next(e.data for e in stream.events if e.type == "stream_error"))
                assert error["data"]["code"] == "token_revoked"
        finally:
            for stream in streams:
                stream.close()
    relayed = [s.log().count("streams_ended reason=token_revoked count=") for s in servers]
    assert sum(relayed) >= 1, [s.log()[-2000:] for s in servers]  # the message, not only the sweep


@pytest.mark.asyncio
async def test_demoting_a_staff_user_ends_their_stream_on_another_users_session(
    daphne_server: ServerProcess, e2e_database: Path
) -> None:
    _, sid, _ = owned_session(e2e_database)
    name = f"staff-{secrets.token_hex(4)}"
    login = (  # a login session for a staff user, as the login page would make it
        "from importlib import import_module; from django.conf import settings; "
        "from django.contrib import auth; from django.contrib.auth.models import User; "
        f"u = User.objects.create_user({name!r}, is_staff=True); "
        "s = import_module(settings.SESSION_ENGINE).SessionStore(); "
        "s[auth.SESSION_KEY] = str(u.pk); "
        "s[auth.BACKEND_SESSION_KEY] = 'django.contrib.auth.backends.ModelBackend'; "
        "s[auth.HASH_SESSION_KEY] = u.get_session_auth_hash(); s.save(); "
        "print(settings.SESSION_COOKIE_NAME + '=' + s.session_key)"
    )
    cookie = manage_output(e2e_database, "shell", "-c", login).strip().splitlines()[-1]
    stream = await open_stream(
        daphne_server.port, f"/session/{sid}/events", None, [("Cookie", cookie)]
    )
    assert stream.status == 200
    demote = (
        "from django.contrib.auth.models import User; "
        f"u = User.objects.get(username={name!r}); u.is_staff = False; u.save()"
    )
    manage_output(e2e_database, "shell", "-c", demote)
    demoted_at = time.monotonic()
    try:
        await stream.read_until(lambda evs: any(e.type == "stream_error" for e in evs), WITHIN_S)
    finally:
        stream.close()
    ended_after_s = time.monotonic() - demoted_at
    error = json.loads(next(e.data for e in stream.events if e.type == "stream_error"))
    print(f"stream ended {ended_after_s:.2f} s after the demotion")
    assert error["data"]["code"] == "token_revoked"
    assert ended_after_s < WITHIN_S
