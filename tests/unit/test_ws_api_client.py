"""The terminal client over the WebSocket (sessions/ws_api_client.py) against a scripted peer.

The peer is a real `websockets` server on 127.0.0.1 that answers each connection from a
script, so the client's side of the protocol (docs/protocol.md, "The WebSocket transport")
is checked message by message; tests/e2e/test_cli_ws_e2e.py runs it against the real server.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from websockets.sync.server import Server, ServerConnection, serve

from sessions.wire import ServerSentEvent
from sessions.ws_api_client import WebSocketStreamClient, socket_url

Script = Callable[[ServerConnection, dict[str, Any]], None]


@pytest.fixture
def peer() -> Iterator[tuple[list[Script], list[dict[str, Any]], Server]]:
    """A server that runs the next script per connection; records each first message."""
    scripts: list[Script] = []
    seen: list[dict[str, Any]] = []

    def handler(connection: ServerConnection) -> None:
        first = json.loads(connection.recv(timeout=10))
        seen.append(first)
        scripts.pop(0)(connection, first)

    with serve(handler, "127.0.0.1", 0, subprotocols=["qwenweb.v1"]) as server:  # type: ignore[list-item]
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield scripts, seen, server
        server.shutdown()
        thread.join(timeout=10)


def reply(connection: ServerConnection, first: dict[str, Any], **body: Any) -> None:
    connection.send(json.dumps({"op": "reply", "ref": first["ref"], "session": "s1", **body}))


def frame(connection: ServerConnection, envelope: dict[str, Any]) -> None:
    # The envelope's bytes inside the message, as the server writes them.
    raw = json.dumps(envelope, separators=(",", ":"), ensure_ascii=False)
    connection.send('{"op":"frame","session":"s1","frame":' + raw + "}")


def make_client(
    server: Server, **kwargs: Any
) -> tuple[WebSocketStreamClient, list[ServerSentEvent]]:
    events: list[ServerSentEvent] = []
    host, port = server.socket.getsockname()[:2]
    client = WebSocketStreamClient(
        socket_url(f"http://{host}:{port}"), "tok", session_id="s1", on_event=events.append,
        read_timeout_s=10, **kwargs,
    )  # fmt: skip
    client.retry_ms = 0
    return client, events


def test_socket_url_maps_http_to_ws():
    assert socket_url("https://example.org:8443/x") == "wss://example.org:8443/ws"
    with pytest.raises(ValueError, match="not an http"):
        socket_url("ftp://example.org")


def test_a_terminal_frame_resubscribes_with_cursor_and_epoch_and_session_closed_ends(peer):
    scripts, seen, server = peer

    def first(connection: ServerConnection, message: dict[str, Any]) -> None:
        reply(connection, message, ok=True, epoch="E1", lastEventId=2)
        frame(connection, {"id": 2, "v": 1, "type": "note", "data": {"text": "é"}})
        frame(connection, {"v": 1, "type": "client_evicted", "data": {"reason": "queue_overflow"}})

    def second(connection: ServerConnection, message: dict[str, Any]) -> None:
        reply(connection, message, ok=False, error={"code": "session_closed", "error": "closed"})

    scripts.extend([first, second])
    client, events = make_client(server, last_event_id="1")
    assert client.run() == 0
    assert [(m.get("lastEventId"), m.get("epoch"), m["token"]) for m in seen] == [
        (1, None, "tok"),
        (2, "E1", "tok"),
    ]
    assert events[0] == ServerSentEvent(
        "note", '{"id":2,"v":1,"type":"note","data":{"text":"é"}}', "2"
    )
    assert [e.type for e in events] == ["note", "client_evicted"]
    assert events[1].last_event_id == "2"


def test_unauthorized_takes_a_fresh_token_at_once_and_a_second_stops_with_2(peer):
    scripts, seen, server = peer

    def refuse(connection: ServerConnection, message: dict[str, Any]) -> None:
        reply(connection, message, ok=False, error={"code": "unauthorized", "error": "bad token"})

    scripts.extend([refuse, refuse])
    statuses: list[str] = []
    client, _ = make_client(server, refresh_token=lambda: "fresh", on_status=statuses.append)
    assert client.run() == 2
    assert [m["token"] for m in seen] == ["tok", "fresh"]
    # The socket's own words, not an HTTP status the WebSocket never answered.
    assert statuses[-1] == "subscribe refused: unauthorized: bad token", statuses


def test_not_found_stops_with_1(peer):
    scripts, _, server = peer
    scripts.append(
        lambda c, m: reply(c, m, ok=False, error={"code": "not_found", "error": "unknown session"})
    )
    client, _ = make_client(server)
    assert client.run() == 1


def test_a_changed_token_file_is_handed_over_in_band(peer):
    scripts, _, server = peer
    refreshed: list[dict[str, Any]] = []

    def stream(connection: ServerConnection, message: dict[str, Any]) -> None:
        reply(connection, message, ok=True, epoch="E1", lastEventId=0)
        connection.send(json.dumps({"op": "ping"}))
        refresh = json.loads(connection.recv(timeout=10))
        refreshed.append(refresh)
        connection.send(
            json.dumps({"op": "reply", "ref": refresh["ref"], "ok": True, "session": "s1"})
        )
        frame(connection, {"id": 1, "v": 1, "type": "note"})

    scripts.append(stream)
    client, events = make_client(server, refresh_token=lambda: "tok2", max_events=1)
    client.refresh_check_s = 0
    assert client.run() == 0
    assert refreshed[0]["op"] == "refresh"
    assert refreshed[0]["token"] == "tok2"
    assert client.token == "tok2"
    assert [e.type for e in events] == ["note"]
