"""The WebSocket transport's messages (subprotocol ``qwenweb.v1``): parse and build them.

docs/protocol.md, "The WebSocket transport". Client commands are JSON objects with an
``op`` (``subscribe``, ``unsubscribe``, ``refresh``, ``ping``); the server answers
``reply``, ``pong``, ``frame`` and its own ``ping``. :func:`parse_command` turns one
client message into a :class:`Command` or raises :class:`CommandError` with the code of
the refusal; :class:`WsFramer` turns frames into ``frame`` messages whose ``frame`` is
the envelope exactly as the SSE ``data:`` line carries it (the same bytes, not
re-serialized). Nothing here awaits or touches Django's database.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

import orjson
from asgiref.typing import ASGISendEvent as Message

from sessions.bus import DEFAULT_MAX_QUEUED, Frame
from sessions.errors import ApiError
from sessions.transport.admission import max_queued_or_error
from sessions.wire import FrameEncoder

__all__ = [
    "OPS",
    "PING",
    "SUBPROTOCOL",
    "Command",
    "CommandError",
    "WsFramer",
    "error_reply",
    "parse_command",
    "pong",
    "reply",
]

SUBPROTOCOL: Final = "qwenweb.v1"
OPS: Final = ("subscribe", "unsubscribe", "refresh", "ping")
MAX_REF_LENGTH: Final = 64
PING: Final = '{"op":"ping"}'
"""What the server writes after ``HEARTBEAT_INTERVAL_S`` of silence on a socket."""

Ref = int | str | None


class CommandError(Exception):
    """Raised by :func:`parse_command`: the message is refused with ``code``.

    ``ref`` and ``session`` are what could be read of the message (echoed in the reply);
    ``extra`` goes into the reply's ``error`` object (``field``, ``limit``).
    """

    def __init__(
        self, code: str, message: str, *, ref: Ref = None, session: str | None = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.code, self.message, self.ref, self.session, self.extra = (
            code,
            message,
            ref,
            session,
            extra,
        )


@dataclass(frozen=True, slots=True)
class Command:
    """One client command, checked for shape (not for rights: that is admission's).

    ``last_event_id`` / ``epoch``: as text, exactly as the SSE headers would carry them
    (a JSON integer becomes its decimal digits; any other JSON value its JSON text, which
    the cursor's strict rule then treats as absent, EB-13). ``max_queued``: the cap or
    the 400 to answer in its place in the checks' order (EB-14).
    """

    op: str
    ref: Ref
    session: str | None = None
    token: str | None = None
    last_event_id: str | None = None
    epoch: str | None = None
    max_queued: int | ApiError = DEFAULT_MAX_QUEUED


def parse_command(message: str | bytes | None, max_bytes: int) -> Command:
    """Parse one client message (the ``text`` or ``bytes`` of ``websocket.receive``).

    Raises:
        CommandError: ``message_too_large`` (over ``max_bytes`` UTF-8 bytes, with
            ``limit``), ``invalid_json`` (binary, not JSON), ``invalid_request`` (not an
            object, a field of the wrong type: ``field``), ``unknown_op``.
    """
    if not isinstance(message, str):
        size = len(message or b"")
        if size > max_bytes:
            raise CommandError("message_too_large", "message too large", limit=max_bytes)
        raise CommandError("invalid_json", "binary messages are not accepted; send JSON text")
    if len(message) > max_bytes or len(message.encode("utf-8", "surrogatepass")) > max_bytes:
        raise CommandError("message_too_large", "message too large", limit=max_bytes)
    try:
        body = orjson.loads(message)
    except orjson.JSONDecodeError:
        raise CommandError("invalid_json", "the message is not JSON") from None
    if not isinstance(body, dict):
        raise CommandError("invalid_request", "the message must be a JSON object")
    ref = body.get("ref")
    if not _is_ref(ref):
        raise CommandError(
            "invalid_request",
            f"ref must be an integer or a string of at most {MAX_REF_LENGTH} characters",
            field="ref",
        )
    op = body.get("op")
    if op not in OPS:
        raise CommandError(
            "unknown_op", f"unknown op; one of {', '.join(OPS)}", ref=ref, field="op"
        )
    if op == "ping":
        return Command("ping", ref)
    session = body.get("session")
    if not isinstance(session, str):
        raise CommandError("invalid_request", "session must be a string", ref=ref, field="session")
    token = body.get("token")
    if token is not None and not isinstance(token, str):
        raise CommandError(
            "invalid_request", "token must be a string", ref=ref, session=session, field="token"
        )
    if op == "refresh" and token is None:
        raise CommandError(
            "invalid_request", "refresh needs a token", ref=ref, session=session, field="token"
        )
    if op != "subscribe":
        return Command(op, ref, session, token)
    return Command(
        op,
        ref,
        session,
        token,
        last_event_id=_as_text(body.get("lastEventId")),
        epoch=_as_text(body.get("epoch")),
        max_queued=_max_queued(body.get("maxQueued")),
    )


def reply(ref: Ref, session: str | None = None, **fields: Any) -> str:
    """``{"op": "reply", "ref", "ok": true, "session"?, **fields}`` as text."""
    body: dict[str, Any] = {"op": "reply", "ref": ref, "ok": True}
    if session is not None:
        body["session"] = session
    body.update(fields)
    return orjson.dumps(body).decode()


def error_reply(ref: Ref, session: str | None, code: str, message: str, **extra: Any) -> str:
    """``{"op": "reply", "ref", "ok": false, "session"?, "error": {"code", "error", …}}``."""
    body: dict[str, Any] = {"op": "reply", "ref": ref, "ok": False}
    if session is not None:
        body["session"] = session
    body["error"] = {"code": code, "error": message, **extra}
    return orjson.dumps(body, default=str).decode()


def pong(ref: Ref) -> str:
    """``{"op": "pong", "ref"}`` as text."""
    return orjson.dumps({"op": "pong", "ref": ref}).decode()


class WsFramer:
    """Frames of one subscription as ``frame`` messages (the pump's :class:`Framer`).

    ``encode`` returns ``(message bytes, envelope JSON)``: the message is
    ``{"op":"frame","session":<id>,"frame":<envelope>}`` built around the very bytes of
    the SSE ``data:`` line. One text message per frame; no heartbeat of its own (the
    socket's writer pings for the whole socket).
    """

    __slots__ = ("_prefix", "encoder")

    def __init__(self, encoder: FrameEncoder, session_id: str) -> None:
        self.encoder = encoder
        self._prefix = b'{"op":"frame","session":' + orjson.dumps(session_id) + b',"frame":'

    def encode(self, frame: Frame) -> tuple[bytes, bytes]:
        """``(the message's UTF-8 bytes, the envelope's JSON)``."""
        if frame.id is None:
            payload = self.encoder.synthetic(frame)[1]
        elif frame.json is not None:
            payload = frame.json
        else:  # unserializable data (EB-2): the SSE event's data line, with _meta.dataError
            block = self.encoder.event(frame)
            payload = next(line[6:] for line in block.split(b"\n") if line.startswith(b"data: "))
        return self._prefix + payload + b"}", payload

    def messages(self, wires: list[bytes]) -> Sequence[Message]:
        """One ``websocket.send`` text message per frame, in order."""
        # Without a "bytes" key: some servers read its presence, not its value.
        return [_text_message(wire) for wire in wires]

    def heartbeat(self) -> tuple[Message, int] | None:
        """None: the socket's writer sends ``ping`` for the whole socket."""
        return None


def _text_message(wire: bytes) -> Message:
    return cast("Message", {"type": "websocket.send", "text": wire.decode()})


def _is_ref(ref: object) -> bool:
    if ref is None or (isinstance(ref, int) and not isinstance(ref, bool)):
        return True
    return isinstance(ref, str) and len(ref) <= MAX_REF_LENGTH


def _as_text(value: object) -> str | None:
    """A cursor or epoch as the header would carry it (None: absent)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value) if value >= 0 else orjson.dumps(value).decode()
    return orjson.dumps(value, default=str).decode()[:200]


def _max_queued(value: object) -> int | ApiError:
    """EB-14 for a JSON value: an integer (or decimal string) in ``[16, 2048]``."""
    if value is None:
        return DEFAULT_MAX_QUEUED
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return max_queued_or_error([str(value)])
    if isinstance(value, str):
        return max_queued_or_error([value])
    return max_queued_or_error([orjson.dumps(value, default=str).decode()[:50]])
