"""Publish bodies are parsed and validated off the event loop (issue 26, point 1).

A body of many tiny JSON values costs CPU in proportion to its values; while one is
validated, the loop must go on serving everyone else. A small body (a typical event) is
parsed on the loop, so it never waits for the body workers another publisher keeps busy.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from sessions.web import validation, views
from sessions.web.offload import BODY_WORKERS, INLINE_MAX_BYTES, INLINE_MAX_VALUES
from tests.integration.conftest import call
from tests.integration.conftest import publish as publish_event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.mark.parametrize(
    "data",
    [
        pytest.param([{}] * INLINE_MAX_VALUES, id="over-the-values"),
        pytest.param("x" * INLINE_MAX_BYTES, id="over-the-bytes"),  # (3 values)
    ],
)
async def test_other_requests_are_served_while_a_publish_body_is_validated(
    make_session: Any, monkeypatch: pytest.MonkeyPatch, data: Any
) -> None:
    sid = await make_session()
    entered, release = threading.Event(), threading.Event()
    original = validation.validate_publish_body

    def held(body: Any) -> dict[str, Any]:
        entered.set()
        release.wait(10)  # (bounded) what a long validation does to its thread
        return original(body)

    monkeypatch.setattr(views, "validate_publish_body", held)
    large = {"type": "a", "data": data}
    publishing = asyncio.create_task(publish_event(sid, large))
    try:
        async with asyncio.timeout(10):
            while not entered.is_set():
                await asyncio.sleep(0.01)
            response = await call("GET", "/capabilities")  # served meanwhile
        assert response.status == 200
        assert not publishing.done()
    finally:
        release.set()
    async with asyncio.timeout(10):
        assert (await publishing).status == 200


async def test_a_small_publish_is_answered_while_every_body_worker_is_busy(
    make_session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another publisher's large bodies hold every worker; a typical event into another
    # session is parsed on the loop and answered at once, not queued behind them.
    busy, healthy = await make_session(), await make_session()
    entered, release = threading.Semaphore(0), threading.Event()
    original = validation.validate_publish_body

    def held(body: Any) -> dict[str, Any]:
        if body["type"] == "large":
            entered.release()
            release.wait(10)  # (bounded) a long validation on a worker
        return original(body)

    monkeypatch.setattr(views, "validate_publish_body", held)
    large = {"type": "large", "data": [{}] * INLINE_MAX_VALUES}
    holding = [asyncio.create_task(publish_event(busy, large)) for _ in range(BODY_WORKERS)]
    try:
        async with asyncio.timeout(10):
            for _ in range(BODY_WORKERS):  # every worker is inside a validation
                while not entered.acquire(blocking=False):
                    await asyncio.sleep(0.01)
            response = await publish_event(healthy, {"type": "tick", "data": {"n": 1}})
        assert response.status == 200
        assert not any(task.done() for task in holding)
    finally:
        release.set()
    async with asyncio.timeout(10):
        assert [(await task).status for task in holding] == [200] * BODY_WORKERS
