"""Idempotent publish: what an ``Idempotency-Key`` is, and the memory backend's key store.

A publisher sends one key per logical publish (``POST /session/<id>/events`` or
``/close``) and the same key on every retry of it. The first request publishes and the
backend remembers ``key -> (id, epoch, digest)``; a repeat within ``IDEMPOTENCY_TTL_S``
answers that first result and publishes nothing, and a repeat whose request differs
(another ``digest``) is refused (:class:`IdempotencyKeyReusedError`, a 422). At most
``IDEMPOTENCY_MAX_KEYS`` keys are kept per session, the oldest dropped first
(docs/protocol.md, "Idempotent publish").

Where the keys live is the backend's business: the memory backend keeps an
:class:`IdempotencyStore` with each live session (lost when the process restarts); the
Redis backend checks and stores the key inside its publish script, atomically with the
id it assigns (:mod:`sessions.backends.redis_scripts`).

Concurrency: a store belongs to the server's event loop like the bus it sits beside
(EB-11); nothing here awaits. No Django, no Redis.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import orjson

__all__ = [
    "MAX_KEY_LENGTH",
    "IdempotencyKey",
    "IdempotencyKeyReusedError",
    "IdempotencyStore",
    "Remembered",
    "is_valid_key",
    "request_digest",
]

MAX_KEY_LENGTH: Final = 128
"""The longest ``Idempotency-Key`` accepted (characters, printable ASCII)."""


def is_valid_key(raw: str) -> bool:
    """Whether ``raw`` is an acceptable key: 1 … 128 printable ASCII characters (space to
    ``~``). Never raises."""
    return 1 <= len(raw) <= MAX_KEY_LENGTH and all(" " <= ch <= "~" for ch in raw)


def request_digest(kind: str, body: bytes) -> str:
    """Return the digest that tells two requests with one key apart (hex SHA-256, 64 chars).

    ``kind`` is the endpoint (``"events"`` or ``"close"``), so a key reused across the two
    is a different request; ``body`` the request body as received (``/close`` ignores its
    body: pass ``b""``). A body that is JSON counts by its value, not its bytes: a retry
    that serialized the same object with its keys in another order or other whitespace
    is the same request (RFC 8259 objects are unordered); ``1`` and ``1.0`` stay apart.
    A body that is not JSON (refused later with 400 anyway) counts byte for byte.
    """
    try:
        canonical = orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS) if body else b""
    except orjson.JSONDecodeError:
        canonical = b"\xff" + body  # (no JSON text starts with 0xFF: never a JSON body's)
    return hashlib.sha256(kind.encode() + b"\0" + canonical).hexdigest()


@dataclass(frozen=True, slots=True)
class IdempotencyKey:
    """A publish request's key and the digest of the request it was first sent with."""

    key: str
    digest: str


@dataclass(frozen=True, slots=True)
class Remembered:
    """What a key's first request published: its event ``id``, ``epoch`` and ``digest``."""

    id: int
    epoch: str
    digest: str


class IdempotencyKeyReusedError(Exception):
    """Raised when a key comes back with another request than its first (a 422)."""


class IdempotencyStore:
    """The keys of one session's publishes: bounded in count and in time (memory backend).

    Args:
        max_keys: at most this many keys are kept; remembering one more drops the oldest.
        ttl_s: a key is forgotten this many seconds after its first request.
        clock: monotonic seconds (tests pass their own).

    Keys are kept in first-request order; every operation is O(1) amortized (expired keys
    are dropped from the old end as they are met). Never awaits.
    """

    __slots__ = ("_clock", "_entries", "max_keys", "ttl_s")

    def __init__(
        self, max_keys: int, ttl_s: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if max_keys < 1 or ttl_s <= 0:
            raise ValueError(f"max_keys must be >= 1 and ttl_s > 0; got {max_keys}, {ttl_s}")
        self.max_keys = max_keys
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, Remembered]] = OrderedDict()

    def __len__(self) -> int:
        self._expire(self._clock())
        return len(self._entries)

    def recall(self, idempotency: IdempotencyKey) -> Remembered | None:
        """Return what the key's first request published, or None if the key is new
        (never seen, forgotten after ``ttl_s``, or dropped as the oldest).

        Raises:
            IdempotencyKeyReusedError: the key is known with another digest.
        """
        self._expire(self._clock())
        found = self._entries.get(idempotency.key)
        if found is None:
            return None
        remembered = found[1]
        if remembered.digest != idempotency.digest:
            raise IdempotencyKeyReusedError(idempotency.key)
        return remembered

    def remember(self, idempotency: IdempotencyKey, event_id: int, epoch: str) -> None:
        """Keep ``key -> (event_id, epoch, digest)``; drop the oldest keys beyond ``max_keys``."""
        now = self._clock()
        self._entries[idempotency.key] = (now, Remembered(event_id, epoch, idempotency.digest))
        self._entries.move_to_end(idempotency.key)
        while len(self._entries) > self.max_keys:
            self._entries.popitem(last=False)

    def _expire(self, now: float) -> None:
        entries = self._entries
        while entries:
            first_at = next(iter(entries.values()))[0]
            if now - first_at < self.ttl_s:
                return
            entries.popitem(last=False)
