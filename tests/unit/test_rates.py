"""Bytes per second of a subscriber between two samples (``sessions.backends.rates``)."""

from __future__ import annotations

import gc

from sessions.backends.rates import ByteRates
from sessions.bus import EventBus


class Clock:
    """A settable clock: ``clock.now`` seconds."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def rates_at(clock: Clock, wall: Clock) -> ByteRates:
    return ByteRates(1.0, clock=clock, wall_clock=wall)


def test_first_sample_is_the_rate_over_the_subscriptions_life():
    sub = EventBus(8).subscribe()
    wall = Clock(sub.since + 4.0)
    sub.bytes_sent = 4000
    assert rates_at(Clock(), wall).rate(sub) == 1000


def test_next_rate_is_bytes_between_two_samples_over_their_interval():
    sub = EventBus(8).subscribe()
    clock, wall = Clock(), Clock(sub.since + 10.0)
    rates = rates_at(clock, wall)
    sub.bytes_sent = 100_000
    rates.rate(sub)
    clock.now += 2.0
    sub.bytes_sent += 6000
    assert rates.rate(sub) == 3000


def test_a_reader_that_stopped_drops_to_zero_within_one_window():
    sub = EventBus(8).subscribe()
    clock, wall = Clock(), Clock(sub.since + 1.0)
    rates = rates_at(clock, wall)
    sub.bytes_sent = 50_000
    assert rates.rate(sub) == 50_000
    clock.now += 1.0
    assert rates.rate(sub) == 0


def test_samples_closer_than_the_window_repeat_the_last_rate():
    # Several dashboards asking often must not shrink the window to noise.
    sub = EventBus(8).subscribe()
    clock, wall = Clock(), Clock(sub.since + 1.0)
    rates = rates_at(clock, wall)
    sub.bytes_sent = 500
    rates.rate(sub)
    clock.now += 0.1
    sub.bytes_sent += 10_000
    assert rates.rate(sub) == 500
    clock.now += 0.9
    assert rates.rate(sub) == 10_000


def test_a_subscription_just_created_has_a_rate_of_zero_not_an_error():
    sub = EventBus(8).subscribe()
    assert rates_at(Clock(), Clock(sub.since)).rate(sub) == 0


def test_samples_of_a_subscription_that_is_gone_are_not_kept():
    rates = ByteRates()
    sub = EventBus(8).subscribe()
    rates.rate(sub)
    del sub
    gc.collect()
    assert len(rates._samples) == 0
