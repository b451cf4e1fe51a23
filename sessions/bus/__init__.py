"""The session event bus: pure asyncio, imports nothing from Django or Redis (EB-1 ... EB-11).

Modules: ``limits`` (every constant), ``frame`` (the envelope: docs/protocol.md, "Frames"),
``queue`` (one subscriber's bounded queue, EB-3 ... EB-8), ``ring`` (the replay ring and
the process budget), ``replay`` (EB-7), ``eventbus``
(the bus, its concurrency model and overflow policy) and ``registry``.
"""

from sessions.bus.eventbus import BusStats, EventBus, SubscriberLimitExceededError
from sessions.bus.frame import (
    Frame,
    disconnect_frame,
    encode_envelope,
    envelope_fields,
    is_valid_epoch,
    synthetic_frame,
)
from sessions.bus.limits import (
    DEFAULT_MAX_QUEUED,
    DEFAULT_MAX_QUEUED_BYTES,
    DEFAULT_MAX_SUBSCRIBERS,
    DEFAULT_OVERFLOW_GRACE_S,
    DEFAULT_RING_MAX_BYTES,
    DEFAULT_RING_SIZE,
    EVENT_SCHEMA_VERSION,
    GRACE_BYTES_RATIO,
    MAX_EVENT_RING_SIZE,
    MAX_QUEUED_MAX,
    MAX_QUEUED_MIN,
    MAX_SAFE_INTEGER,
    WARN_RESET_RATIO,
    WARN_THRESHOLD_RATIO,
)
from sessions.bus.queue import Subscription, SubscriptionStats
from sessions.bus.registry import Registry
from sessions.bus.ring import Ring, RingBudget, held_bytes

__all__ = [
    "DEFAULT_MAX_QUEUED",
    "DEFAULT_MAX_QUEUED_BYTES",
    "DEFAULT_MAX_SUBSCRIBERS",
    "DEFAULT_OVERFLOW_GRACE_S",
    "DEFAULT_RING_MAX_BYTES",
    "DEFAULT_RING_SIZE",
    "EVENT_SCHEMA_VERSION",
    "GRACE_BYTES_RATIO",
    "MAX_EVENT_RING_SIZE",
    "MAX_QUEUED_MAX",
    "MAX_QUEUED_MIN",
    "MAX_SAFE_INTEGER",
    "WARN_RESET_RATIO",
    "WARN_THRESHOLD_RATIO",
    "BusStats",
    "EventBus",
    "Frame",
    "Registry",
    "Ring",
    "RingBudget",
    "SubscriberLimitExceededError",
    "Subscription",
    "SubscriptionStats",
    "disconnect_frame",
    "encode_envelope",
    "envelope_fields",
    "held_bytes",
    "is_valid_epoch",
    "synthetic_frame",
]
