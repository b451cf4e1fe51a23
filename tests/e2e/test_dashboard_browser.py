"""The operator dashboard and the admin in a real headless Chromium.

Playwright's sync API drives Debian's ``/usr/bin/chromium`` (never ``playwright install``)
against ``python -m qwenweb.serve`` in another process, driven over HTTP and raw sockets.
Each browser session runs in a worker thread of its own, so it neither needs nor disturbs
an event loop of the test process (the session page's browser tests keep one Playwright
alive for the whole run). Every wait is bounded (``expect(..., timeout=...)``).

With ``QWENWEB_SCREENSHOT_DIR=docs`` the tests save ``dashboard.png``,
``admin-sessions.png`` and ``admin-session-evictions.png`` there.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from sessions.api_client import Publisher
from tests.support.server import (
    RemoteSession,
    ServerProcess,
    free_port,
    migrate,
    open_stream,
    server_env,
    wait_for,
)
from tests.support.staff import PASSWORD, USERNAME, StaffClient, create_staff_user

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

CHROMIUM = Path(os.environ.get("QWENWEB_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WAIT_MS = 10_000
SCREENSHOT_DIR = os.environ.get("QWENWEB_SCREENSHOT_DIR", "")
WARMUP_S = float(os.environ.get("QWENWEB_SCREENSHOT_WARMUP_S", "0")) if SCREENSHOT_DIR else 0.0
"""Seconds of traffic before the dashboard screenshot, so its plots have history."""
T = TypeVar("T")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """``python -m qwenweb.serve`` on a database with the staff user ``operator``."""
    database = tmp_path_factory.mktemp("dashboard") / "db.sqlite3"
    migrate(database)
    create_staff_user(database)
    port = free_port()
    argv = [sys.executable, "-m", "qwenweb.serve", "-b", "127.0.0.1", "-p", str(port)]
    env = server_env(database, QWENWEB_RECORDS_FLUSH_INTERVAL_S="0.2")
    log = tmp_path_factory.mktemp("logs") / "serve.log"
    server = ServerProcess(argv, port, env, log).start()
    yield server
    server.stop()


def in_browser(scenario: Callable[[Page], T], timeout_s: float = 90) -> T:
    """Run ``scenario(page)`` with a fresh headless Chromium page, in a worker thread."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (or set QWENWEB_CHROMIUM)")

    def run() -> T:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            try:
                context = browser.new_context(viewport={"width": 1440, "height": 900})
                page = context.new_page()
                page.set_default_timeout(WAIT_MS)
                errors: list[str] = []
                page.on("pageerror", lambda error: errors.append(str(error)))
                result = scenario(page)
                assert not errors, f"errors in the page: {errors}"
                return result
            finally:
                browser.close()

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="chromium") as pool:
        return pool.submit(run).result(timeout=timeout_s)


def run_async(coroutine: Coroutine[Any, Any, T], timeout_s: float = 60) -> T:
    """``asyncio.run(coroutine)`` in a thread of its own (a Playwright thread has a loop)."""
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="asyncio") as pool:
        return pool.submit(asyncio.run, coroutine).result(timeout=timeout_s)


def log_in(page: Page, base_url: str, next_path: str) -> None:
    """Log in through the admin's form, as a person would, and land on ``next_path``."""
    page.goto(f"{base_url}/admin/login/?next={next_path}")
    page.fill("#id_username", USERNAME)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{base_url}{next_path}")


def screenshot(page: Page, name: str) -> None:
    if SCREENSHOT_DIR:
        Path(SCREENSHOT_DIR).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(SCREENSHOT_DIR) / f"{name}.png"), full_page=True)


class RawStream:
    """A blocking-socket SSE subscriber: it sends the request, then reads nothing (or, with
    ``reading``, drains the socket in a thread of its own until closed)."""

    def __init__(
        self, port: int, session: RemoteSession, client_id: str, *, reading: bool = False
    ) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        request = (
            f"GET {session.events_path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {session.read_token}\r\nX-Client-Id: {client_id}\r\n"
            "Accept: text/event-stream\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        assert self.sock.recv(12).startswith(b"HTTP/1.1 200")
        if reading:
            threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        with contextlib.suppress(OSError):  # closed by close()
            while self.sock.recv(65536):
                pass

    def close(self) -> None:
        with contextlib.suppress(OSError):  # already gone
            self.sock.shutdown(socket.SHUT_RDWR)  # also wakes a draining thread's recv
        self.sock.close()


def subscribers_cell(page: Page, session_id: str) -> Any:
    return page.locator(f'#sessions tr[data-session-id="{session_id}"] [data-field="subscribers"]')


# -- the dashboard -------------------------------------------------------------------------------


@pytest.mark.timeout(120 + WARMUP_S)
def test_dashboard_subscriber_count_follows_streams_without_a_reload(server: ServerProcess):
    watched = RemoteSession.create(server.base_url, title="watched session")
    RemoteSession.create(server.base_url, title="idle session")
    busy = _busy_session(server) if SCREENSHOT_DIR else None

    def scenario(page: Page) -> None:
        navigations: list[str] = []
        page.on("framenavigated", lambda frame: navigations.append(frame.url))
        log_in(page, server.base_url, "/")
        expect(page.locator("#feed-state")).to_have_attribute("data-state", "live")
        cell = subscribers_cell(page, watched.id)
        expect(cell).to_have_text("0")
        page.evaluate("window.__sameDocument = true")
        first = RawStream(server.port, watched, "tab-1")
        expect(cell).to_have_text("1")
        second = RawStream(server.port, watched, "tab-2")
        expect(cell).to_have_text("2")
        expect(page.locator("#activity-list li[data-kind=subscriber_joined]")).to_have_count(2)
        first.close()
        expect(cell).to_have_text("1")
        second.close()
        expect(cell).to_have_text("0")
        expect(page.locator("#activity-list li[data-kind=subscriber_left]")).to_have_count(2)
        assert page.evaluate("window.__sameDocument") is True  # never reloaded
        assert len(navigations) == 1 + 1, navigations  # the login form, then the dashboard
        if busy is not None:
            busy(WARMUP_S, page, lambda: screenshot(page, "dashboard"))

    in_browser(scenario, timeout_s=90 + WARMUP_S)


def _busy_session(server: ServerProcess) -> Callable[[float, Page, Callable[[], None]], None]:
    """For the screenshot: a session with a steady publisher, readers, and an eviction;
    ``capture()`` is called while they are all connected."""
    session = RemoteSession.create(server.base_url, title="demo agent (busy)")

    def run(warmup_s: float, page: Page, capture: Callable[[], None]) -> None:
        stop = threading.Event()
        publisher = threading.Thread(target=_publish_steadily, args=(session, stop), daemon=True)
        publisher.start()
        readers = [RawStream(server.port, session, f"reader-{n}", reading=True) for n in range(3)]
        try:
            deadline = time.monotonic() + warmup_s
            while time.monotonic() < deadline:  # the plots fill with real samples
                page.wait_for_timeout(1000)
            run_async(_evict_one(server, session))
            page.wait_for_timeout(1500)  # two more samples after the eviction, for the plots
            capture()
        finally:
            stop.set()
            publisher.join(10)
            for reader in readers:
                reader.close()

    return run


def _publish_steadily(session: RemoteSession, stop: threading.Event) -> None:
    publisher = Publisher(session.base_url, session.id, session.publish_token)
    try:
        n = 0
        while not stop.wait(0.02 + 0.03 * (n % 40 > 30)):
            publisher.publish("session_update", {"n": n, "text": "token " * (1 + n % 7)})
            n += 1
    finally:
        publisher.close()


async def _evict_one(server: ServerProcess, session: RemoteSession) -> list[Any]:
    """Provoke one eviction: a raw-socket reader that stops reading, 64 KiB events."""
    slow = await open_stream(
        server.port, session.events_path + "?maxQueued=16", session.read_token,
        [("X-Client-Id", "stalled-tab")],
    )  # fmt: skip
    attached = session.load()["subscriberCount"]
    publisher = Publisher(session.base_url, session.id, session.publish_token)
    try:
        for n in range(1000):
            publisher.publish("big", {"n": n, "payload": "x" * 65536})
            if n % 10 == 9 and session.load()["subscriberCount"] < attached:
                break  # the stalled reader was evicted (EB-5)
        return await slow.read_to_end(timeout_s=30)
    finally:
        publisher.close()
        slow.close()


# -- the admin -------------------------------------------------------------------------------------


def test_admin_shows_the_eviction_with_the_payload_the_client_received(server: ServerProcess):
    session = RemoteSession.create(server.base_url, title="evicted reader", ringSize=20)
    events = run_async(_evict_one(server, session))
    assert events[-1].type == "client_evicted"
    received = events[-1].data
    reason = json.loads(received)["data"]["reason"]
    staff = StaffClient(server.base_url).login()

    def recorded() -> bool:  # records are written every 0.2 s (the server's setting here)
        body = staff.get_json(f"/ops/sessions/{session.id}/records")
        return any(i["kind"] == "client_evicted" for i in body["incidents"])

    assert wait_for(recorded, timeout_s=10)

    def scenario(page: Page) -> None:
        changelist = "/admin/agent_sessions/agentsession/"
        log_in(page, server.base_url, changelist)
        screenshot(page, "admin-sessions")
        page.goto(f"{server.base_url}{changelist}?evictions=yes")
        row = page.locator("#result_list tbody tr", has_text="evicted reader")
        expect(row).to_have_count(1)
        expect(row.locator("td.field-source")).to_have_text("live")
        expect(row.locator("td.field-evicted")).to_have_text("1")
        page.goto(f"{server.base_url}/admin/agent_sessions/agentsession/{session.id}/change/")
        payload = page.locator(".qw-payload", has_text='"type":"client_evicted"')
        expect(payload).to_have_text(received)
        expect(page.get_by_text(reason).first).to_be_visible()
        screenshot(page, "admin-session-evictions")

    in_browser(scenario)
