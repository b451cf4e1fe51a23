"""Idempotent publish: what an ``Idempotency-Key`` is, and the memory backend's key store.

A publisher sends one key per logical publish (``POST /session/<id>/events`` or
``/close``) and the same key on every retry of it. The first request publishes and the
backend remembers ``key -> (id, epoch, digest)``; a repeat within ``IDEMPOTENCY_TTL_S``
answers that first result and publishes nothing, and a repeat whose request differs
(another ``digest``) is refused (:class:`IdempotencyKeyReusedError`, a 422). At most
``IDEMPOTENCY_MAX_KEYS`` keys are kept per session, the oldest dropped first
(docs/protocol.md, "Idempotent publish"), and at most ``IDEMPOTENCY_MAX_KEYS_TOTAL`` in
the process (:class:`KeyBudget`: past it, a store that remembers a key drops its own
oldest, so one publisher's keys never push out another's); keys expire as new ones are
written and, process-wide, at most once a second when the budget is full.

Where the keys live is the backend's business: the memory backend keeps an
:class:`IdempotencyStore` with each live session (lost when the process restarts); the
Redis backend checks and stores the key inside its publish script, atomically with the
id it assigns (:mod:`sessions.backends.redis_scripts`).

Concurrency: a store belongs to the server's event loop like the bus it sits beside
(EB-11); nothing here awaits. No Django, no Redis.
"""

from __future__ import annotations

import hashlib
import logging
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import orjson

from sessions.wire.json_numbers import has_long_digit_run

__all__ = [
    "MAX_KEY_LENGTH",
    "IdempotencyKey",
    "IdempotencyKeyReusedError",
    "IdempotencyStore",
    "KeyBudget",
    "Remembered",
    "is_valid_key",
    "request_digest",
]

logger = logging.getLogger("qwenweb.idempotency")

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
    A body that is not JSON (refused later with 400 anyway) counts byte for byte, and so
    does one with a run of 19 digits (:func:`~sessions.wire.json_numbers.has_long_digit_run`):
    orjson reads integers beyond 64 bits as floats, so two of them would count as one.
    """
    if has_long_digit_run(body):
        return _digest(kind, b"\xfe" + body)  # (0xFE: no JSON text, nor 0xFF's, starts so)
    try:
        canonical = orjson.dumps(orjson.loads(body), option=orjson.OPT_SORT_KEYS) if body else b""
    except orjson.JSONDecodeError:
        canonical = b"\xff" + body  # (no JSON text starts with 0xFF: never a JSON body's)
    return _digest(kind, canonical)


def _digest(kind: str, canonical: bytes) -> str:
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


class KeyBudget:
    """The idempotency keys of every store of a process together (memory backend).

    Args:
        max_keys: the most keys all stores may hold together (``IDEMPOTENCY_MAX_KEYS_TOTAL``).
        clock: monotonic seconds (tests pass their own).

    ``count`` is kept by the stores (each insert and drop). When it passes ``max_keys``,
    :meth:`sweep` expires every store's old keys (at most once a second); a store still
    over budget after that drops its own oldest keys (one ``idempotency_budget_full`` log
    line per second at most). Never awaits.
    """

    __slots__ = ("_clock", "_logged_at", "_stores", "_swept_at", "count", "max_keys")

    def __init__(self, max_keys: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_keys = max_keys
        self.count = 0
        self._clock = clock
        self._stores: weakref.WeakSet[IdempotencyStore] = weakref.WeakSet()
        self._swept_at = self._logged_at = float("-inf")

    def over(self) -> bool:
        """Whether the stores hold more keys than ``max_keys``."""
        return self.count > self.max_keys

    def sweep(self, now: float) -> None:
        """Expire the old keys of every store, unless done less than a second ago."""
        if now - self._swept_at < 1.0:
            return
        self._swept_at = now
        for store in list(self._stores):
            store.expire()

    def log_full(self, now: float) -> None:
        if now - self._logged_at >= 1.0:
            self._logged_at = now
            logger.warning(
                "idempotency_budget_full keys=%d limit=%d (IDEMPOTENCY_MAX_KEYS_TOTAL): a "
                "session's oldest keys are dropped first",
                self.count,
                self.max_keys,
            )


class IdempotencyStore:
    """The keys of one session's publishes: bounded in count and in time (memory backend).

    Args:
        max_keys: at most this many keys are kept; remembering one more drops the oldest.
        ttl_s: a key is forgotten this many seconds after its first request.
        clock: monotonic seconds (tests pass their own).
        budget: the process's :class:`KeyBudget` these keys count in (None: none).

    Keys are kept in first-request order; every operation is O(1) amortized (expired keys
    are dropped from the old end as they are met, on reads and writes). Never awaits.
    """

    __slots__ = ("__weakref__", "_budget", "_clock", "_entries", "max_keys", "ttl_s")

    def __init__(
        self,
        max_keys: int,
        ttl_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        budget: KeyBudget | None = None,
    ) -> None:
        if max_keys < 1 or ttl_s <= 0:
            raise ValueError(f"max_keys must be >= 1 and ttl_s > 0; got {max_keys}, {ttl_s}")
        self.max_keys = max_keys
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, Remembered]] = OrderedDict()
        self._budget = budget
        if budget is not None:
            budget._stores.add(self)

    def __del__(self) -> None:
        # A store dropped with its session (closed, unloaded) gives its keys back.
        if self._budget is not None:
            self._budget.count -= len(self._entries)

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
        """Keep ``key -> (event_id, epoch, digest)``; drop expired keys, and the oldest
        beyond ``max_keys`` or while the process's budget is passed (the new key stays)."""
        now = self._clock()
        self._expire(now)
        entries = self._entries
        if idempotency.key not in entries:
            self._count(1)
        entries[idempotency.key] = (now, Remembered(event_id, epoch, idempotency.digest))
        entries.move_to_end(idempotency.key)
        while len(entries) > self.max_keys:
            self._drop_oldest()
        budget = self._budget
        if budget is not None and budget.over():
            budget.sweep(now)
            if budget.over():
                budget.log_full(now)
            while budget.over() and len(entries) > 1:
                self._drop_oldest()

    def expire(self) -> None:
        """Drop the keys older than ``ttl_s``."""
        self._expire(self._clock())

    def clear(self) -> None:
        """Forget every key (idempotent)."""
        self._count(-len(self._entries))
        self._entries = OrderedDict()

    def _count(self, delta: int) -> None:
        if self._budget is not None:
            self._budget.count += delta

    def _drop_oldest(self) -> None:
        self._entries.popitem(last=False)
        self._count(-1)

    def _expire(self, now: float) -> None:
        entries = self._entries
        if not entries:
            return
        while entries:
            first_at = next(iter(entries.values()))[0]
            if now - first_at < self.ttl_s:
                return
            self._drop_oldest()
        self._entries = OrderedDict()  # emptied: a dict keeps its table's size, a new one is small
