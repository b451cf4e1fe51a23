"""The session page over HTTP/2: granian over TLS (a generated certificate), real Chromium.

Over HTTP/1.1 a browser opens at most 6 connections per host for all its tabs, and each
open stream holds one: a 7th session tab never loads. Over HTTP/2 the streams share one
connection. Ten tabs of ten *different* sessions (so that the page's tab sharing cannot
hide the test) are live at once, each receives its own session's events, every page was
loaded over ``h2``, and the server sees at most two TCP connections from the browser (the
streams on one; see the test).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
from playwright.sync_api import Browser

from tests.browser.conftest import VIEWPORT, WAIT_MS, RemoteSession, SessionPage
from tests.support.server import ServerProcess, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

TABS = 10


def established(port: int) -> int:
    """How many established TCP connections the server has on ``port`` (``ss``)."""
    out = subprocess.run(
        ["ss", "-tnH", "state", "established", f"( sport = :{port} )"],
        capture_output=True, text=True, check=True, timeout=10,
    ).stdout  # fmt: skip
    return len([line for line in out.splitlines() if line.strip()])


@pytest.mark.timeout(120)
def test_ten_session_tabs_live_at_once_over_one_http2_connection(
    browser: Browser, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server("serve-tls", QWENWEB_HEARTBEAT_INTERVAL_S="1")
    context = browser.new_context(viewport=VIEWPORT, ignore_https_errors=True)  # type: ignore[arg-type]
    errors: list[str] = []
    try:
        sessions = [RemoteSession.create(server.base_url, title=f"tab {n}") for n in range(TABS)]
        views = []
        for n, session in enumerate(sessions):
            page = context.new_page()
            page.set_default_timeout(WAIT_MS)
            page.on("pageerror", lambda error: errors.append(str(error)))
            view = SessionPage(page, session)
            if n == 0:
                view.open()  # logs in: the other tabs share the cookie
            else:
                page.goto(session.page_url)
                view.expect_state("open")
            views.append(view)
        # All ten live at once: each gets its own session's next event.
        for n, session in enumerate(sessions):
            session.say(f"hello tab {n}")
        for n, view in enumerate(views):
            view.wait_for_id(1)
            assert view.agent_text() == f"hello tab {n}"
            assert (
                view.page.evaluate("performance.getEntriesByType('navigation')[0].nextHopProtocol")
                == "h2"
            )
        assert all(s.subscriber_count() == 1 for s in sessions)
        # Ten streams open at once, and the browser holds at most two TCP connections (our
        # own requests above are closed): over HTTP/1.1 each open stream would hold one.
        # Chromium keeps requests without credentials in a pool of their own: the page's
        # snapshot fetch (`credentials: "omit"`) has the second connection; the pages,
        # their files and the ten streams (credentials "same-origin") share the first.
        assert wait_for(lambda: established(server.port) <= 2, 10), established(server.port)
    finally:
        context.close()
    assert not errors, f"errors in the pages: {errors}"
