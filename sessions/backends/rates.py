"""Bytes per second of each subscriber, sampled when operators look (never per frame).

The transport adds the size of each ``send`` to ``Subscription.bytes_sent`` (one integer
add per batch). :class:`ByteRates` turns that counter into a rate *between two samples*:
each time a subscriber's row is built (an operator's request, a process report every
``PROCESS_TTL_S / 4``), the rate is the bytes sent since the previous sample divided by
the time between them, once that sample is at least ``window_s`` old; a row built sooner
repeats the last rate, so callers asking often (several dashboards) never shrink the
window to noise. The first sample of a subscription gives its rate over its life so far
(``bytes_sent`` since ``since``). A subscriber that stopped reading therefore drops to 0
within one window, and one that is catching up shows its real throughput.

Samples are kept in a weak mapping keyed by the subscription: nothing to prune, nothing
kept for a subscriber that is gone. Everything runs on the server's event loop (EB-11);
nothing here awaits or raises.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from sessions.backends.errors import QuotaExceededError
from sessions.bus import Subscription

__all__ = ["RATE_WINDOW_S", "ByteRates", "TokenBucket", "ValuesQuota"]

RATE_WINDOW_S: Final = 1.0
"""Shortest time (seconds) between the two samples a rate is computed from."""


@dataclass(slots=True)
class _Sample:
    at_s: float  # the clock's seconds when taken
    bytes_sent: int
    rate: float  # bytes per second between the previous sample and this one


class ByteRates:
    """Per-subscription bytes per second between two samples (module docstring).

    Args:
        window_s: the shortest time between the two samples of a rate (seconds, > 0).
        clock: monotonic seconds (``time.monotonic``; tests pass their own).
        wall_clock: epoch seconds, to compare with ``Subscription.since`` for the first
            sample (``time.time``).
    """

    def __init__(
        self,
        window_s: float = RATE_WINDOW_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.window_s = window_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._samples: weakref.WeakKeyDictionary[Subscription, _Sample] = (
            weakref.WeakKeyDictionary()
        )

    def rate(self, subscription: Subscription) -> int:
        """Return ``subscription``'s bytes per second (rounded down, >= 0), sampling it.

        Never raises, never awaits; O(1).
        """
        now = self._clock()
        sent = subscription.bytes_sent
        sample = self._samples.get(subscription)
        if sample is None:
            life_s = self._wall_clock() - subscription.since
            rate = sent / life_s if life_s > 0 else 0.0
            self._samples[subscription] = _Sample(now, sent, rate)
        elif now - sample.at_s >= self.window_s:
            rate = max(0, sent - sample.bytes_sent) / (now - sample.at_s)
            sample.at_s, sample.bytes_sent, sample.rate = now, sent, rate
        else:
            rate = sample.rate
        return int(rate)


class TokenBucket:
    """A token bucket: ``rate_per_s`` tokens a second, holding at most ``burst`` (full at
    first), for the publish quotas (docs/protocol.md, "Quotas").

    Args:
        rate_per_s: tokens added per second (``> 0``).
        burst: the bucket's size, what may be spent at once (``> 0``).
        clock: monotonic seconds (tests pass their own).

    Never raises, never awaits; O(1).
    """

    __slots__ = ("_clock", "_stamp", "_tokens", "burst", "rate_per_s")

    def __init__(
        self, rate_per_s: float, burst: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._tokens = burst
        self._stamp = clock()

    def _refill(self) -> float:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate_per_s)
        self._stamp = now
        return self._tokens

    def wait_s(self, cost: float) -> float:
        """Seconds until ``cost`` tokens are there (0: now); takes nothing. A cost above
        ``burst`` counts as ``burst`` (one large request is never refused for good)."""
        missing = min(cost, self.burst) - self._refill()
        return 0.0 if missing <= 0 else missing / self.rate_per_s

    def take(self, cost: float) -> None:
        """Spend ``cost`` tokens (the balance may go below zero: a debt repaid first)."""
        self._refill()
        self._tokens -= cost


class ValuesQuota:
    """The JSON values a publisher may make the server parse: token buckets per session
    (``PUBLISH_VALUES_PER_S``) and per user (``PUBLISH_USER_VALUES_PER_S``), each holding
    ``burst_s`` seconds of its rate, in this process (docs/protocol.md, "Quotas").

    Charged before a body is parsed with ``sessions.web.offload.json_values_bound``, so
    the CPU a body costs is the publisher's. Each map keeps at most :attr:`max_keys`
    buckets (those full again are dropped first: a full bucket is what a new one would
    be). Never awaits; O(1) amortized.
    """

    max_keys: Final = 10_000

    def __init__(
        self,
        session_rate: float,
        user_rate: float,
        burst_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limits = (
            (session_rate, "PUBLISH_VALUES_PER_S", "session"),
            (user_rate, "PUBLISH_USER_VALUES_PER_S", "user"),
        )
        self.burst_s = burst_s
        self._clock = clock
        self._buckets: tuple[dict[str, TokenBucket], dict[str, TokenBucket]] = ({}, {})

    def charge(self, session_id: str, user: str, values: int) -> None:
        """Spend ``values`` from the buckets of ``session_id`` and of ``user`` (the
        publisher's user id, else its token's subject). One body above a burst passes
        when both buckets are full and leaves them in debt.

        Raises:
            QuotaExceededError: a bucket has not enough; nothing is spent.
        """
        picked = []
        for buckets, key, (rate, quota, per) in zip(
            self._buckets, (session_id, user), self._limits, strict=True
        ):
            bucket = buckets.get(key)
            if bucket is None:
                if len(buckets) >= self.max_keys:
                    _drop_full(buckets)
                bucket = TokenBucket(rate, rate * self.burst_s, clock=self._clock)
                buckets[key] = bucket
            wait_s = bucket.wait_s(values)
            if wait_s > 0:
                retry = max(1, int(wait_s + 0.999))
                raise QuotaExceededError(
                    quota,
                    rate,
                    retry,
                    f"publishing more JSON values than {quota} ({rate:g} values/s per {per}, "
                    f"bursts of {self.burst_s:g} s); retry in {retry} s",
                )
            picked.append(bucket)
        for bucket in picked:
            bucket.take(values)


def _drop_full(buckets: dict[str, TokenBucket]) -> None:
    """Drop the buckets that are full again; if none is, the older half (bounded)."""
    full = [key for key, bucket in buckets.items() if bucket.wait_s(bucket.burst) == 0]
    for key in full or list(buckets)[: len(buckets) // 2]:
        del buckets[key]
