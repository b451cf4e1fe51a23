"""Shared fixtures: a clean runtime registry per test, tokens, sessions."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sessions import runtime


@pytest.fixture(autouse=True)
def _fresh_registry() -> Iterator[None]:
    """Each test starts with no bus loaded: buses belong to one event loop (EB-11)."""
    runtime.registry.clear()
    yield
    runtime.registry.clear()
