"""A WebSocket client of the ``qwenweb.v1`` protocol for end-to-end tests (``websockets``).

It speaks the protocol from outside, as any client would: JSON text messages, nothing
imported from the server's transport. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

SUBPROTOCOL = "qwenweb.v1"


@dataclass
class WsClient:
    """One socket; ``frames[session]`` collects the envelopes of ``frame`` messages in
    order, ``replies[ref]`` the replies, ``other`` everything else (pong, ping)."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    frames: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    replies: dict[Any, dict[str, Any]] = field(default_factory=dict)
    other: list[dict[str, Any]] = field(default_factory=list)
    order: list[dict[str, Any]] = field(default_factory=list)
    closed_code: int | None = None

    async def connect(self, timeout_s: float = 10.0, **options: Any) -> WsClient:
        self.connection: ClientConnection = await asyncio.wait_for(
            connect(
                self.url,
                subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
                additional_headers=self.headers,
                max_size=None,
                **options,
            ),
            timeout_s,
        )
        return self

    async def send(self, message: Any) -> None:
        await self.connection.send(
            message if isinstance(message, str | bytes) else json.dumps(message)
        )

    async def subscribe(
        self, ref: Any, session: str, token: str | None = None, **fields: Any
    ) -> None:
        message = {"op": "subscribe", "ref": ref, "session": session, **fields}
        if token is not None:
            message["token"] = token
        await self.send(message)

    async def read_one(self, timeout_s: float = 10.0) -> dict[str, Any] | None:
        """Read one message and file it; None once the socket closed."""
        try:
            raw = await asyncio.wait_for(self.connection.recv(), timeout_s)
        except Exception as exc:  # ConnectionClosed
            if type(exc).__name__.startswith("ConnectionClosed"):
                self.closed_code = self.connection.close_code
                return None
            raise
        message = json.loads(raw)
        self.order.append(message)
        if message.get("op") == "frame":
            self.frames[message["session"]].append(message["frame"])
        elif message.get("op") == "reply":
            self.replies[message.get("ref")] = message
        else:
            self.other.append(message)
        return message

    async def read_until(self, predicate: Any, timeout_s: float = 10.0) -> None:
        """Read until ``predicate(self)`` holds; raises TimeoutError past ``timeout_s`` and
        AssertionError if the socket closes first."""
        async with asyncio.timeout(timeout_s):
            while not predicate(self):
                if await self.read_one(timeout_s) is None:
                    assert predicate(self), f"socket closed ({self.closed_code}) first"
                    return

    async def reply(self, ref: Any, timeout_s: float = 10.0) -> dict[str, Any]:
        await self.read_until(lambda client: ref in client.replies, timeout_s)
        return self.replies[ref]

    async def close(self) -> None:
        await self.connection.close()


def types(frames: list[dict[str, Any]]) -> list[str]:
    return [frame["type"] for frame in frames]


def ids(frames: list[dict[str, Any]]) -> list[int]:
    return [frame["id"] for frame in frames if "id" in frame]
