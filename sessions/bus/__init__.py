"""The session event bus: pure asyncio, imports nothing from Django (EB-1 ... EB-11)."""

from sessions.bus.eventbus import (
    DEFAULT_MAX_QUEUED,
    DEFAULT_MAX_QUEUED_BYTES,
    DEFAULT_MAX_SUBSCRIBERS,
    DEFAULT_RING_SIZE,
    EVENT_SCHEMA_VERSION,
    MAX_EVENT_RING_SIZE,
    MAX_SAFE_INTEGER,
    WARN_RESET_RATIO,
    WARN_THRESHOLD_RATIO,
    BusStats,
    EventBus,
    Frame,
    SubscriberLimitExceededError,
    Subscription,
    SubscriptionStats,
    is_valid_epoch,
    synthetic_frame,
)
from sessions.bus.registry import Registry

__all__ = [
    "DEFAULT_MAX_QUEUED",
    "DEFAULT_MAX_QUEUED_BYTES",
    "DEFAULT_MAX_SUBSCRIBERS",
    "DEFAULT_RING_SIZE",
    "EVENT_SCHEMA_VERSION",
    "MAX_EVENT_RING_SIZE",
    "MAX_SAFE_INTEGER",
    "WARN_RESET_RATIO",
    "WARN_THRESHOLD_RATIO",
    "BusStats",
    "EventBus",
    "Frame",
    "Registry",
    "SubscriberLimitExceededError",
    "Subscription",
    "SubscriptionStats",
    "is_valid_epoch",
    "synthetic_frame",
]
