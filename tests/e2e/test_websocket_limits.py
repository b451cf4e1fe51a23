"""``GET /ws``: refusals, limits, origins, revocation and token refresh, against the
production entry point with tiny limits (docs/protocol.md, "The WebSocket transport").

Each refusal is a reply with its code on a socket that stays usable. Every wait bounded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.exceptions import InvalidStatus

from tests.support.manage import manage_output, owned_session
from tests.support.server import (
    RemoteSession,
    ServerProcess,
    serve_argv,
    server_env,
    started_server,
)
from tests.support.staff import StaffClient
from tests.support.wsclient import WsClient, ids, types

pytestmark = pytest.mark.e2e

WAIT_S = 30.0


@pytest.fixture(scope="module")
def server(
    staff_database: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    env = server_env(
        staff_database,
        QWENWEB_WS_MAX_SUBSCRIPTIONS="2",
        QWENWEB_WS_COMMAND_BURST="20",
        QWENWEB_WS_COMMAND_RATE_PER_S="0.01",
        QWENWEB_WS_MAX_MESSAGE_BYTES="1024",
        QWENWEB_WS_MAX_SOCKETS_PER_USER="2",
    )
    log = tmp_path_factory.mktemp("ws-limits") / "serve.log"
    with started_server(serve_argv, env, log) as server:
        yield server


def _ws(server: ServerProcess, **headers: str) -> WsClient:
    return WsClient(f"ws://127.0.0.1:{server.port}/ws", headers=headers)


async def _subscribed_owner(
    server: ServerProcess, database: Path
) -> tuple[WsClient, str, dict[str, str]]:
    """A new user's session (``owned_session``) and a socket subscribed to it with its read
    token (ref 1, answered): ``(client, session id, tokens)``."""
    _name, sid, tokens = owned_session(database)
    client = await _ws(server).connect()
    await client.subscribe(1, sid, tokens["read"])
    await client.reply(1)
    return client, sid, tokens


@pytest.mark.asyncio
async def test_bad_messages_are_refused_with_codes_and_the_socket_stays_usable(
    server: ServerProcess,
) -> None:
    session = RemoteSession.create(server.base_url)
    client = await _ws(server).connect()
    await client.send("not json")
    await client.send(b"\x00binary")
    await client.send({"op": "dance", "ref": 1})
    await client.send({"op": "subscribe", "ref": 2, "session": 5})
    await client.send({"op": "ping", "ref": "x" * 2000})
    await client.send({"op": "unsubscribe", "ref": 3, "session": session.id})
    await client.subscribe(4, "no-such-session", session.read_token)
    await client.subscribe(5, session.id, "forged")
    await client.subscribe(6, session.id, session.read_token, maxQueued=5)
    await client.subscribe(7, session.id)  # no token, no cookie
    await client.read_until(lambda c: len(c.replies) == 8, WAIT_S)
    codes = {ref: reply["error"]["code"] for ref, reply in client.replies.items()}
    assert codes == {
        None: "message_too_large",  # the last None-ref refusal wins; the others below
        1: "unknown_op",
        2: "invalid_request",
        3: "not_subscribed",
        4: "forbidden",  # a token never learns whether an id exists
        5: "unauthorized",
        6: "invalid_max_queued",
        7: "unauthorized",
    }
    nameless = [m["error"]["code"] for m in client.order if m.get("ref") is None]
    assert nameless == ["invalid_json", "invalid_json", "message_too_large"]
    await client.subscribe(8, session.id, session.read_token)
    assert (await client.reply(8))["ok"]
    await client.close()


@pytest.mark.asyncio
async def test_subscriptions_per_socket_and_duplicates_are_refused(server: ServerProcess) -> None:
    sessions = [RemoteSession.create(server.base_url) for _ in range(3)]
    client = await _ws(server).connect()
    for ref, session in enumerate(sessions):
        await client.subscribe(ref, session.id, session.read_token)
    await client.subscribe(9, sessions[0].id, sessions[0].read_token)
    await client.read_until(lambda c: len(c.replies) == 4, WAIT_S)
    assert client.replies[2]["error"] == {
        "code": "subscription_limit_exceeded",
        "error": "this socket carries the most subscriptions it may",
        "limit": 2,
    }
    assert client.replies[9]["error"]["code"] == "already_subscribed"
    await client.close()


@pytest.mark.asyncio
async def test_a_command_burst_past_the_bucket_is_rate_limited(server: ServerProcess) -> None:
    client = await _ws(server).connect()
    for ref in range(25):
        await client.send({"op": "ping", "ref": ref})
    await client.read_until(lambda c: len(c.other) + len(c.replies) >= 25, WAIT_S)
    refused = [reply for reply in client.replies.values() if not reply["ok"]]
    assert len([m for m in client.other if m.get("op") == "pong"]) == 20
    assert {reply["error"]["code"] for reply in refused} == {"rate_limited"}
    assert all(reply["error"]["retryAfterMs"] > 0 for reply in refused)
    await client.close()


@pytest.mark.asyncio
async def test_a_token_user_past_the_socket_limit_is_refused(
    server: ServerProcess, staff_database: Path
) -> None:
    _name, sid, tokens = owned_session(staff_database)
    clients = [await _ws(server).connect() for _ in range(3)]
    for client in clients:
        await client.subscribe(1, sid, tokens["read"])
        await client.reply(1)
    assert [client.replies[1]["ok"] for client in clients] == [True, True, False]
    assert clients[2].replies[1]["error"]["code"] == "socket_limit_exceeded"
    await clients[0].close()
    await clients[2].subscribe(2, sid, tokens["read"])
    assert (await clients[2].reply(2))["ok"]  # a closed socket frees its place
    for client in clients[1:]:
        await client.close()


@pytest.mark.asyncio
async def test_the_login_cookie_counts_only_from_the_sites_own_origin(
    server: ServerProcess,
) -> None:
    session = RemoteSession.create(server.base_url)
    staff = StaffClient(server.base_url).login()
    cookie = "; ".join(f"{c.name}={c.value}" for c in staff.jar)
    own = await _ws(server, Cookie=cookie, Origin=server.base_url).connect()
    foreign = await _ws(server, Cookie=cookie, Origin="https://evil.example").connect()
    none = await _ws(server, Cookie=cookie).connect()
    for client in (own, foreign, none):
        await client.subscribe(1, session.id)
        await client.reply(1)
    assert own.replies[1]["ok"]
    assert foreign.replies[1]["error"]["code"] == "unauthorized"
    assert none.replies[1]["error"]["code"] == "unauthorized"
    # On a socket the token travels in the subscribe, not in an Authorization header.
    assert "subscribe's token" in none.replies[1]["error"]["error"]
    for client in (own, foreign, none):
        await client.close()


@pytest.mark.asyncio
async def test_a_handshake_without_the_subprotocol_is_refused(server: ServerProcess) -> None:
    from websockets.asyncio.client import connect

    with pytest.raises(InvalidStatus) as refused:
        await connect(f"ws://127.0.0.1:{server.port}/ws", open_timeout=WAIT_S)
    assert refused.value.response.status_code == 403


@pytest.mark.asyncio
async def test_revoking_the_token_ends_the_subscription_like_an_sse_stream(
    server: ServerProcess, staff_database: Path
) -> None:
    client, sid, tokens = await _subscribed_owner(server, staff_database)
    manage_output(staff_database, "revoke_tokens", "--session", sid)
    await client.read_until(lambda c: "stream_error" in types(c.frames[sid]), WAIT_S)
    assert client.frames[sid][-1]["data"]["code"] == "token_revoked"
    await client.subscribe(2, sid, tokens["read"])
    assert (await client.reply(2))["error"]["code"] == "token_revoked"
    await client.close()


@pytest.mark.asyncio
async def test_refresh_swaps_the_token_without_a_gap(
    server: ServerProcess, staff_database: Path
) -> None:
    client, sid, tokens = await _subscribed_owner(server, staff_database)
    other = RemoteSession.create(server.base_url)
    await client.send({"op": "refresh", "ref": 2, "session": sid, "token": other.read_token})
    assert (await client.reply(2))["error"]["code"] == "forbidden"
    fresh = manage_output(staff_database, "shell", "-c", _fresh_token_code(sid)).split()[-1]
    await client.send({"op": "refresh", "ref": 3, "session": sid, "token": fresh})
    assert (await client.reply(3))["ok"]
    _publish(server, sid, tokens["publish"])
    await client.read_until(lambda c: ids(c.frames[sid]) == [1], WAIT_S)
    await client.close()


def _fresh_token_code(session_id: str) -> str:
    return (
        "from sessions.auth import issue_current_token; from sessions.models import "
        f"AgentSession; s = AgentSession.objects.get(pk={session_id!r}); "
        "print(issue_current_token(s.id, ['read'], s.owner.username, user_id=s.owner_id))"
    )


def _publish(server: ServerProcess, session_id: str, token: str) -> None:
    from tests.support.server import request_json

    status, body = request_json(
        "POST", f"{server.base_url}/session/{session_id}/events", {"type": "n"}, token=token
    )
    assert status == 200, body
