"""A pytest plugin: leaked resources fail the test that leaked them.

``filterwarnings = error`` turns a ``ResourceWarning`` (an unclosed socket, a Redis
connection) into a failure, but pytest collects garbage only at the end of the session:
a resource left in a reference cycle (a thread that died holding it, a kept traceback)
would warn in whichever later test the collector ran in. Collecting when each test's
function-scoped fixtures are torn down, before pytest looks for unraisable exceptions,
puts the failure on the test that leaked (a module-scoped server's on the module's last).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _collect_leaks() -> Iterator[None]:
    """Autouse in a plugin: set up before the test's other fixtures, torn down after them."""
    yield
    gc.collect()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move what importing and collecting built (Django, the test modules) to the permanent
    generation: the per-test collection then walks only what tests made since."""
    del session
    gc.collect()
    gc.freeze()
