"""The page draws the bounded snapshot (issue 13, point 3): the newest events on load and
after a resync, and "Load earlier events" pages back with ``?before=`` until the start."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import RemoteSession, SessionPage, event_ids
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.browser, pytest.mark.e2e]


@pytest.fixture(scope="module")
def small_snapshots(start_server: Callable[..., ServerProcess]) -> ServerProcess:
    """A server whose snapshot answers the newest 5 events by default."""
    return start_server("serve", QWENWEB_SNAPSHOT_LIMIT="5", QWENWEB_HEARTBEAT_INTERVAL_S="1")


def test_the_page_draws_the_newest_events_and_loads_earlier_ones_on_demand(
    page: Page, small_snapshots: ServerProcess
) -> None:
    session = RemoteSession.create(small_snapshots.base_url, title="long history")
    texts = [f"m{n} " for n in range(12)]
    session.say(*texts)
    view = SessionPage(page, session).open()
    assert view.log_ids() == list(range(8, 13)), "the newest 5 only"
    assert view.agent_text() == "".join(texts[7:])
    earlier = page.locator("#load-earlier")
    expect(earlier).to_be_visible()
    requests = len(view.traffic.requests)
    earlier.click()
    expect(page.locator("#frame-log tbody tr[data-type='earlier events']")).to_have_count(1)
    assert view.agent_text() == "".join(texts[2:])
    loads = [r for r in view.traffic.requests[requests:] if r.path == f"/session/{session.id}"]
    assert [r.query for r in loads] == ["before=8&compact=1"]
    earlier.click()
    expect(earlier).to_be_hidden()
    assert view.agent_text() == "".join(texts)
    live = session.say("live ")[-1]
    view.wait_for_id(live)
    assert view.agent_text().endswith("m11 live ")


def test_a_resync_keeps_the_view_and_fetches_what_the_ring_holds_beyond_the_snapshot(
    page: Page, small_snapshots: ServerProcess
) -> None:
    # SC-12 with the bounded snapshot (issue 25): what was shown stays, the span the ring
    # lost is marked, and the ring's events below the snapshot's page are fetched (SC-14).
    session = RemoteSession.create(small_snapshots.base_url, ringSize=10)
    view = SessionPage(page, session).open(install_clock=True)
    view.wait_for_id(session.say("x0 ", "x1 ")[-1])
    view.freeze_clock()
    page.click("#drop")
    view.expect_state("reconnecting")
    session.say(*(f"y{n} " for n in range(20)))
    view.advance_clock(5_000)
    expect(page.locator("#last-resync")).to_contain_text("view rebuilt", timeout=15_000)
    snapshot = session.load()
    assert event_ids(snapshot["events"]) == list(range(18, 23))
    view.wait_for_id(22)
    assert view.log_ids() == [1, 2, *range(13, 23)]
    assert view.agent_text() == "x0 x1 " + "".join(f"y{n} " for n in range(10, 20))
    expect(page.locator("#transcript .marker-lost")).to_have_text("#3–12 no longer on the server")
    expect(page.locator("#load-earlier")).to_be_hidden()
