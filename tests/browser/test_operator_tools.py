"""The session page's operator tools in a real headless Chromium against a real server.

The live subscribers table (staff), the publish console and its "Provoke backpressure"
helper (docs/protocol.md: the live subscribers endpoints, EB-4, EB-5, EB-21, SC-12). The
page is driven as a person would (admin login form, buttons, text fields); the server is
checked over HTTP only. Every wait is bounded (``expect`` with a timeout).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import (
    PASSWORD,
    USERNAME,
    RemoteSession,
    SessionPage,
    agent_chunk,
    screenshot,
)
from tests.support.backend import delete_run_keys
from tests.support.server import ServerProcess, start_redis_server, wait_for
from tests.support.staff import StaffClient

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

PROVOKE_WAIT_MS = 150_000
"""Bound of the whole backpressure run: ~1,000 events of 64 KiB, then the backlog read."""
REDIS_URL = os.environ.get("QWENWEB_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REPORT_WAIT_MS = 10_000
"""Another process's subscribers appear within one report interval (PROCESS_TTL_S / 4)."""


@pytest.fixture
def two_redis_servers(browser_database: Path, tmp_path: Path) -> Iterator[list[ServerProcess]]:
    """Two ``python -m qwenweb.serve`` on the Redis backend, one database, a prefix of their own."""
    prefix = f"qwtest-{secrets.token_hex(4)}"
    servers: list[ServerProcess] = []
    try:
        for name in ("a", "b"):
            servers.append(
                start_redis_server(browser_database, REDIS_URL, prefix, tmp_path / f"{name}.log")
            )
        yield servers
    finally:
        for server in servers:
            server.stop()
        delete_run_keys(prefix, REDIS_URL)


def test_staff_see_both_processes_subscribers_on_the_page_and_disconnect_the_other_ones(
    page: Page, two_redis_servers: list[ServerProcess]
) -> None:
    # The first "Done when", in the browser: the page on A, a second tab on B.
    a, b = two_redis_servers
    session = RemoteSession.create(a.base_url, title="two processes")
    mine = SessionPage(page, session).open()
    other = SessionPage(page.context.new_page(), RemoteSession(b.base_url, session.id))
    other.page.goto(other.session.page_url)  # cookies ignore the port: the same login
    other.expect_state("open")
    expect(page.locator("#subscribers tbody tr")).to_have_count(2, timeout=REPORT_WAIT_MS)
    expect(page.locator("#subscribers .subs-status")).to_contain_text("in 2 server processes")
    page.locator("#subscribers tbody tr:not(.subs-own) .subs-disconnect").click()
    expect(page.locator("#subscribers .subs-result")).to_contain_text("asked process")
    expect(other.page.locator("#last-stream-error")).to_contain_text("operator_disconnect")
    mine.wait_for_id(session.say("on A ")[-1])
    staff = StaffClient(a.base_url).login(USERNAME, PASSWORD)

    def operator_recorded() -> bool:
        connections = staff.get_json(f"/ops/sessions/{session.id}/records")["connections"]
        return any(c["endDetail"] == f"by {USERNAME}" for c in connections)

    assert wait_for(operator_recorded, timeout_s=10, interval_s=0.2)
    other.page.close()


def test_dashboard_detail_lists_a_sessions_subscribers_and_disconnects_one(
    page: Page, server: ServerProcess
) -> None:
    session = RemoteSession.create(server.base_url, title="watched from the dashboard")
    watcher = SessionPage(page, session).open()
    dashboard = page.context.new_page()
    dashboard.goto(f"{server.base_url}/")
    dashboard.click(f'tr[data-session-id="{session.id}"] .detail-open')
    rows = dashboard.locator("#detail-subscribers tbody tr")
    expect(rows).to_have_count(1)
    expect(rows).to_contain_text("operator")
    rows.locator(".subs-disconnect").click()
    expect(dashboard.locator("#detail-subscribers .subs-result")).to_contain_text("Disconnected")
    expect(page.locator("#last-stream-error")).to_contain_text("operator_disconnect")
    watcher.expect_state("open", timeout_ms=20_000)  # it reconnects with its cursor
    dashboard.click("#detail-close")
    expect(dashboard.locator("#session-detail")).to_be_hidden()
    dashboard.close()


def test_staff_see_the_live_subscribers_and_disconnecting_a_row_ends_that_one_only(
    page: Page, server: ServerProcess
) -> None:
    session = RemoteSession.create(server.base_url, title="two tabs")
    mine = SessionPage(page, session).open()
    # Another browser (context): the tabs of one browser share one stream (issue 13).
    assert page.context.browser is not None
    other_context = page.context.browser.new_context()
    other = SessionPage(other_context.new_page(), session).open()
    rows = page.locator("#subscribers tbody tr")
    expect(rows).to_have_count(2)
    expect(page.locator("#subscribers tbody tr.subs-own")).to_have_count(1)
    expect(page.locator("#subscribers tbody tr.subs-own")).to_contain_text("operator")
    page.locator("#subscribers tbody tr:not(.subs-own) .subs-disconnect").click()
    expect(page.locator("#subscribers .subs-result")).to_contain_text("Disconnected subscriber")
    expect(other.page.locator("#last-stream-error")).to_contain_text("operator_disconnect")
    mine.wait_for_id(session.say("still here ")[-1])
    expect(page.locator("#last-stream-error")).to_have_text("—")
    other_context.close()


def test_publish_console_publishes_an_event_that_appears_in_the_transcript(
    page: Page, server: ServerProcess
) -> None:
    session = RemoteSession.create(server.base_url, title="console")
    view = SessionPage(page, session).open()
    page.fill("#publish-type", "session_update")
    text = "typed into the console"
    page.fill("#publish-data", json.dumps(agent_chunk(text)))
    page.click("#publish-form button[type=submit]")
    expect(page.locator("#publish-result")).to_contain_text("Published event #1 (epoch ")
    view.wait_for_id(1)
    expect(page.locator("#transcript .msg-agent .msg-text")).to_have_text(text)
    assert session.load()["events"][0]["data"]["content"]["text"] == text


def test_publish_console_says_a_refusal_in_words_not_as_a_code(
    page: Page, server: ServerProcess
) -> None:
    session = RemoteSession.create(server.base_url)
    SessionPage(page, session).open()
    page.fill("#publish-type", "client_evicted")  # a type only the server may make
    page.fill("#publish-data", "")
    page.click("#publish-form button[type=submit]")
    result = page.locator("#publish-result")
    expect(result).to_contain_text("Not published: The server refused the event.")
    assert "invalid_event" not in result.inner_text()
    page.fill("#publish-data", "{not json")
    page.click("#publish-form button[type=submit]")
    expect(result).to_contain_text("The data is not valid JSON")


# serial: the page provokes its own eviction with ~1,000 events of 64 KiB through the
# browser's buffers: CPU-bound for Chromium and the server (27 s alone, 61 s beside two
# other pytest-xdist workers), the same load as the paused-page tests, which run alone.
@pytest.mark.serial
@pytest.mark.timeout(PROVOKE_WAIT_MS // 1000 + 60)
def test_provoke_backpressure_from_the_page_alone_shows_a_warning_then_an_eviction(
    page: Page, server: ServerProcess
) -> None:
    # EB-21 real backpressure through the browser's own buffers (tens of MiB), EB-4, EB-5,
    # SC-12: the page reconnects with its cursor. The default maxQueued: nothing set by hand.
    session = RemoteSession.create(server.base_url, title="provoked", ringSize=64)
    view = SessionPage(page, session).open()
    view.wait_for_id(session.say("before ")[-1])
    page.click("#provoke")
    expect(page.locator("#paused-chip")).to_be_visible()
    expect(page.locator("#provoke-status")).to_contain_text(
        "showed slow_client_warning, then client_evicted", timeout=PROVOKE_WAIT_MS
    )
    expect(page.locator("#last-warning")).to_contain_text("queue")
    expect(page.locator("#last-evicted")).to_contain_text("overflow")
    expect(page.locator("#paused-chip")).to_be_hidden()
    types = view.log_types()
    assert types.index("slow_client_warning") < types.index("client_evicted")
    published = session.load()["lastEventId"] - 1  # the one "before" event
    assert 0 < published <= 2000
    screenshot(page, "session-page-provoked")
    view.expect_state("open", timeout_ms=20_000)  # reconnected with its cursor
