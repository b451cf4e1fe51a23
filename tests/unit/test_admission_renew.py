"""``Subscribed.renew`` (a token refresh, e.g. the WebSocket's ``refresh``): the expiry timer
follows the new token, and an ended subscription gets none."""

from __future__ import annotations

import asyncio
import time
import uuid

from sessions.auth import Principal, TokenClaims
from sessions.backends.base import LiveSession
from sessions.bus import EventBus
from sessions.hooks import ConnectionInfo
from sessions.transport.admission import Subscribed


def _principal(expires_in_s: float) -> Principal:
    claims = TokenClaims("s-1", frozenset({"read"}), "svc", expires_at=time.time() + expires_in_s)
    return Principal(claims, None, False, "svc")


def _subscribed() -> Subscribed:
    bus = EventBus(16)
    live = LiveSession("s-1", "t", None, bus, 0, "2026-12-03T00:00:00Z")
    info = ConnectionInfo(uuid.uuid4(), "s-1", "token", None, "svc", "", "", "", 16, None)
    return Subscribed(live, bus.subscribe(max_queued=16), _principal(60), info, None)


def test_a_refresh_arms_the_expiry_of_the_new_token() -> None:
    async def main() -> None:
        admitted = _subscribed()
        admitted.renew(_principal(120))
        assert admitted.expiry is not None
        admitted.release()
        assert admitted.expiry is None

    asyncio.run(main())


def test_a_refresh_after_the_subscription_ended_arms_nothing() -> None:
    # The WebSocket's refresh awaits the token check; the subscription may end meanwhile
    # (evicted, the session closed, released). A timer armed then would hold it until the
    # token's expiry and end it a second time.
    async def main() -> None:
        admitted = _subscribed()
        admitted.release()
        admitted.renew(_principal(120))
        assert admitted.expiry is None
        assert admitted.principal.claims is not None
        assert admitted.principal.claims.expires_at is not None
        assert admitted.principal.claims.expires_at < time.time() + 90  # the old one kept

    asyncio.run(main())
