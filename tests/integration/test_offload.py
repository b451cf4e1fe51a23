"""Publish bodies are parsed and validated off the event loop (issue 26, point 1).

A body of many tiny JSON values costs CPU in proportion to its values; while one is
validated, the loop must go on serving everyone else.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from sessions.web import validation, views
from tests.integration.conftest import call
from tests.integration.conftest import publish as publish_event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def test_other_requests_are_served_while_a_publish_body_is_validated(
    make_session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = await make_session()
    entered, release = threading.Event(), threading.Event()
    original = validation.validate_publish_body

    def held(body: Any) -> dict[str, Any]:
        entered.set()
        release.wait(10)  # (bounded) what a long validation does to its thread
        return original(body)

    monkeypatch.setattr(views, "validate_publish_body", held)
    publishing = asyncio.create_task(publish_event(sid, {"type": "a", "data": [{}] * 10}))
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
