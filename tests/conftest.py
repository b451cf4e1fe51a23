"""Shared fixtures: a clean runtime registry per test, tokens, sessions."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sessions import dashboard, lifecycle, records, runtime

# The in-process tests run one event loop per test: the operator machinery (records
# writer, dashboard feed, shutdown hooks) must not start on those loops and write at their
# teardown. Tests of that machinery start what they need explicitly.
lifecycle.enabled = False


@pytest.fixture(autouse=True)
def _fresh_registry() -> Iterator[None]:
    """Each test starts with no bus loaded: buses belong to one event loop (EB-11).

    Also forgets the captured server loop and the operator records and feed in memory.
    """
    _forget_runtime_state()
    yield
    _forget_runtime_state()


def _forget_runtime_state() -> None:
    runtime.registry.clear()
    runtime._server_loop = None
    records.recorder.discard()
    dashboard.feed.stop()
