"""``sessions.hooks.Hooks``: every announcement reaches every listener, a failing one aside."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from sessions.hooks import Hooks, Listener

ANNOUNCEMENTS: list[tuple[str, tuple[Any, ...]]] = [
    ("session_closed", ("s", 3)),
    ("loop_attached", (object(),)),  # a stand-in: the hooks only hand it over
    ("activity_received", ([{"kind": "x"}],)),
    ("event_published", ("s",)),
    ("request_rejected", (400, "bad_request")),
]


class Recording(Listener):
    def __init__(self) -> None:
        self.heard: list[tuple[str, tuple[Any, ...]]] = []

    def session_closed(self, *args: Any) -> None:
        self.heard.append(("session_closed", args))

    def loop_attached(self, *args: Any) -> None:
        self.heard.append(("loop_attached", args))

    def activity_received(self, *args: Any) -> None:
        self.heard.append(("activity_received", args))

    def event_published(self, *args: Any) -> None:
        self.heard.append(("event_published", args))

    def request_rejected(self, *args: Any) -> None:
        self.heard.append(("request_rejected", args))


class Failing(Recording):
    def __init__(self) -> None:
        super().__init__()
        self.heard = _Raising()


class _Raising(list[tuple[str, tuple[Any, ...]]]):
    def append(self, item: tuple[str, tuple[Any, ...]]) -> None:
        raise RuntimeError(item[0])


@pytest.mark.parametrize(("hook", "args"), ANNOUNCEMENTS, ids=[h for h, _ in ANNOUNCEMENTS])
def test_a_failing_listener_is_logged_and_the_next_one_still_hears(
    hook: str, args: tuple[Any, ...], caplog: pytest.LogCaptureFixture
) -> None:
    hooks, recording = Hooks(), Recording()
    hooks.connect(Failing())
    hooks.connect(recording)
    with caplog.at_level(logging.ERROR, logger="qwenweb.hooks"):
        getattr(hooks, hook)(*args)
    assert recording.heard == [(hook, args)]
    assert [r.getMessage().split(" listener=")[0] for r in caplog.records] == [
        f"listener_failed hook={hook}"
    ]


def test_event_published_asks_only_the_listeners_that_override_it() -> None:
    class Quiet(Listener):
        def __getattribute__(self, name: str) -> Any:
            assert name != "event_published", "asked a listener that does not override it"
            return super().__getattribute__(name)

    hooks, recording = Hooks(), Recording()
    hooks.connect(Quiet())
    hooks.connect(recording)
    hooks.event_published("s")
    assert recording.heard == [("event_published", ("s",))]
