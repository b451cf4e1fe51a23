"""What an operator read stays readable (issue 25): a closed session's page shows its
history with the end state (``CLOSED_HISTORY_S``), and tabs that detached for Drop or
Pause/Resume share one server stream again.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import RemoteSession, SessionPage
from tests.support.server import ServerProcess

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
