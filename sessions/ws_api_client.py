"""Read a session's stream over the WebSocket transport (``GET /ws``, ``qwenweb.v1``).

:class:`WebSocketStreamClient` is :class:`sessions.api_client.EventStreamClient` with the
SSE request replaced by one socket and one ``subscribe`` message; the loop, the backoff
(SC-11), the token renewal (SC-10) and the exit statuses are the SSE client's, so
``manage.py tail_session --transport ws`` prints the same lines and resumes the same way
(docs/protocol.md, "The WebSocket transport"):

* the cursor and its epoch go in the ``subscribe`` message; the reply's ``epoch`` is the
  one the cursor belongs to (there is no ``X-Event-Epoch`` header);
* each ``frame`` becomes the :class:`~sessions.wire.ServerSentEvent` the SSE parser would
  have given: ``data`` is the envelope's JSON text exactly as the server sent it;
* a terminal frame (``client_evicted``, ``stream_error``, ``session_closed``) ends the
  connection, as it ends an SSE response; the client comes back after the reconnection
  time with its cursor (a ``retryAfterMs`` in the frame becomes that time, as ``retry:``
  does); a ``session_closed`` reply is the SSE stream's 204;
* with ``refresh_token``, a token that changed (checked every ``refresh_check_s``) is
  handed over in band with ``refresh``: the subscription carries on without a gap.

Uses the ``websockets`` package's synchronous client; no Django import.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.sync.client import ClientConnection, connect
from websockets.typing import Subprotocol

from sessions.api_client import EventStreamClient, StreamEnd, _RetryNow
from sessions.wire import ServerSentEvent

__all__ = ["SUBPROTOCOL", "WebSocketStreamClient", "socket_url"]

SUBPROTOCOL: Final = "qwenweb.v1"
_MAX_MESSAGE_BYTES: Final = 32 * 1024 * 1024
_TERMINAL: Final = ("client_evicted", "stream_error", "session_closed")
_UNAUTHORIZED: Final = ("unauthorized", "token_revoked")
_STOP: Final = ("forbidden", "not_found", "already_subscribed")


def socket_url(base_url: str) -> str:
    """``http://host:port`` → ``ws://host:port/ws`` (``https`` → ``wss``).

    Raises:
        ValueError: ``base_url`` is not an http(s) or ws(s) URL.
    """
    parts = urlsplit(base_url)
    schemes = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}
    if parts.scheme not in schemes or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {base_url!r}")
    return urlunsplit((schemes[parts.scheme], parts.netloc, "/ws", "", ""))


class _SocketFailed(OSError):
    """Raised when the handshake fails or the socket ends: retried with backoff like SSE."""


def _error_of(reply: dict[str, Any]) -> dict[str, Any]:
    """The ``error`` object of a refused reply ({} when it has none)."""
    error = reply.get("error")
    return error if isinstance(error, dict) else {}


def _frame_text(raw: str, frame: Any) -> str:
    """The envelope's JSON text as the server wrote it inside the message, else re-encoded."""
    start = raw.find('"frame":')
    if start >= 0:
        try:
            value, end = json.JSONDecoder().raw_decode(raw, start + len('"frame":'))
        except ValueError:
            value, end = None, 0
        if value == frame:
            return raw[start + len('"frame":') : end]
    return json.dumps(frame, separators=(",", ":"), ensure_ascii=False)


@dataclass
class WebSocketStreamClient(EventStreamClient):
    """Follow one session over ``GET /ws``; the interface and exit statuses of the SSE client.

    ``url`` is the socket's (``ws://host:port/ws``, see :func:`socket_url`), ``session_id``
    the session. ``read_timeout_s`` bounds the wait for any message (the server pings an
    idle socket every ``HEARTBEAT_INTERVAL_S``); the websockets library's own pings find a
    half-open peer.
    """

    session_id: str = ""
    refresh_check_s: float = 30.0

    def _connect_once(self) -> None:
        opened_before = self.opened
        try:
            with connect(
                self.url,
                subprotocols=[Subprotocol(SUBPROTOCOL)],
                proxy=None,
                open_timeout=self.read_timeout_s,
                max_size=_MAX_MESSAGE_BYTES,
            ) as socket:
                self._follow(socket)
        except InvalidHandshake as exc:
            raise _SocketFailed(f"handshake refused: {exc}") from None
        except ConnectionClosed as exc:
            if self.opened == opened_before:
                raise _SocketFailed(f"socket closed ({exc})") from None
            # After a subscription opened, a close is the end of a stream, as a body's end is.
            self.on_status(f"socket closed ({exc})")
        except TimeoutError:
            self.on_status("no data (not even a ping) for too long")

    def _subscribe_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"op": "subscribe", "ref": 1, "session": self.session_id}
        message["token"] = self.token
        if self.last_event_id.isdigit():
            message["lastEventId"] = int(self.last_event_id)
            if self.epoch:
                message["epoch"] = self.epoch
        return message

    def _follow(self, socket: ClientConnection) -> None:
        socket.send(json.dumps(self._subscribe_message()))
        self._last_ref = 1  # the subscribe's
        refreshing: dict[int, str] = {}  # ref of a refresh sent → its token
        next_check = time.monotonic() + self.refresh_check_s
        while True:
            raw = socket.recv(timeout=self.read_timeout_s)
            text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
            try:
                message = json.loads(text)
            except ValueError:
                continue  # the server sends JSON only; nothing to act on
            op = message.get("op") if isinstance(message, dict) else None
            if op == "reply" and message.get("ref") == 1:
                self._on_subscribe_reply(message)
            elif op == "reply" and message.get("ref") in refreshing:
                self._on_refresh_reply(message, refreshing.pop(message["ref"]))
            elif (
                op == "frame"
                and message.get("session") == self.session_id
                and self._on_frame(text, message.get("frame"))
            ):
                return  # a terminal frame: the subscription is gone
            if self.refresh_token is not None and time.monotonic() >= next_check:
                next_check = time.monotonic() + self.refresh_check_s
                self._refresh(socket, refreshing)

    def _refresh(self, socket: ClientConnection, refreshing: dict[int, str]) -> None:
        """Hand a changed token over in band (``refresh``); the reply is matched by ref."""
        token = self._changed_token()
        if token is None or token in refreshing.values():
            return
        self._last_ref += 1
        ref = self._last_ref
        refreshing[ref] = token
        message = {"op": "refresh", "ref": ref, "session": self.session_id, "token": token}
        socket.send(json.dumps(message))

    def _on_subscribe_reply(self, reply: dict[str, Any]) -> None:
        if reply.get("ok") is True:
            self.opened += 1
            self.epoch = reply.get("epoch") if isinstance(reply.get("epoch"), str) else self.epoch
            self.on_status(f"connected (cursor {self.last_event_id or '-'}, epoch {self.epoch})")
            return
        error = _error_of(reply)
        code = str(error.get("code", ""))
        if code == "session_closed":
            raise StreamEnd("session ended (session_closed)", 0)
        if code in _UNAUTHORIZED:
            if self._renew_token(code):
                raise _RetryNow
            raise StreamEnd(f"subscribe refused: {code}: {error.get('error', '')}", 2)
        if code in _STOP or code.startswith("invalid_"):
            raise StreamEnd(f"refused: {code}: {error.get('error', '')}", 1)
        retry_after = error.get("retryAfterMs")
        if isinstance(retry_after, int) and retry_after >= 0:
            self.retry_ms = retry_after
        raise _SocketFailed(f"subscribe refused: {code or 'no code'}")

    def _on_frame(self, text: str, frame: Any) -> bool:
        """Dispatch one frame as the SSE client would; True when it ends the subscription."""
        if not isinstance(frame, dict):
            return False
        frame_id = frame.get("id")
        if isinstance(frame_id, int) and not isinstance(frame_id, bool):
            self.last_event_id = str(frame_id)
        raw_type = frame.get("type")
        event_type = raw_type if isinstance(raw_type, str) else "message"
        data = frame.get("data")
        retry_after = data.get("retryAfterMs") if isinstance(data, dict) else None
        if event_type == "stream_error" and isinstance(retry_after, int) and retry_after >= 0:
            self.retry_ms = retry_after  # the twin of the `retry:` line SSE sends with it
        self._dispatch(ServerSentEvent(event_type, _frame_text(text, frame), self.last_event_id))
        if event_type == "session_closed":
            self.on_status("session_closed: the server ended this subscription")
        return event_type in _TERMINAL

    def _changed_token(self) -> str | None:
        """A token from ``refresh_token`` that differs from the current one, else None."""
        assert self.refresh_token is not None
        try:
            token = self.refresh_token().strip()
        except OSError as exc:
            self.on_status(f"could not read the token: {exc}")
            return None
        if not token or token == self.token or token in self._rejected:
            return None
        return token

    def _on_refresh_reply(self, reply: dict[str, Any], token: str) -> None:
        if reply.get("ok") is True:
            self.token = token
            self.on_status("token refreshed in band")
        else:
            self._rejected.add(token)
            error = _error_of(reply)
            self.on_status(f"refresh refused: {error.get('code', '')}")
