"""What an operator read stays readable (issue 25): a closed session's page shows its
history with the end state (``CLOSED_HISTORY_S``), and tabs that detached for Drop or
Pause/Resume share one server stream again.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import VIEWPORT, RemoteSession, SessionPage
from tests.support.server import ServerProcess, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.e2e]


def test_a_closed_sessions_page_shows_its_history_and_the_end_state(
    page: Page, server: ServerProcess
) -> None:
    session = RemoteSession.create(server.base_url, title="to review")
    ids = session.say("first ", "second ", "third ")
    session.close()
    view = SessionPage(page, session)
    view.login(f"/sessions/{session.id}/")
    view.expect_state("ended")
    assert view.log_ids() == [*ids, ids[-1] + 1]  # and the session_closed event
    assert view.agent_text() == "first second third "
    expect(page.locator("#transcript .marker-closed").first).to_contain_text("Session closed")
    expect(page.locator("#transcript")).to_contain_text("This session is closed.")


def test_three_tabs_after_drop_and_pause_resume_share_one_server_stream_again(
    browser: Browser, server: ServerProcess
) -> None:
    # Issue 25, point 4: a tab's own controls detach it only for as long as they need to.
    context = browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
    try:
        session = RemoteSession.create(server.base_url, title="rejoin")
        views = [SessionPage(context.new_page(), session).open()]
        for _ in range(2):
            view = SessionPage(context.new_page(), session)
            view.page.goto(session.page_url)
            view.expect_state("open")
            views.append(view)
        first = session.say("one ")[-1]
        for view in views:
            view.wait_for_row(first)
        for view in views:
            view.page.click("#drop")
            view.expect_state("open", timeout_ms=15_000)
            view.page.click("#pause")
            expect(view.page.locator("#sharing")).to_have_attribute("data-role", "own")
            view.page.click("#pause")  # resume
        assert wait_for(lambda: session.subscriber_count() == 1, timeout_s=20), (
            f"{session.subscriber_count()} server streams"
        )
        last = session.say("two ")[-1]
        for view in views:
            view.wait_for_row(last)
            ids = view.log_ids()
            assert ids == list(range(ids[0], last + 1))
        roles = sorted(v.page.locator("#sharing").get_attribute("data-role") or "" for v in views)
        assert roles == ["follower", "follower", "leader"]
    finally:
        context.close()
