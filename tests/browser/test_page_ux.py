"""The pages an operator lives in, as a new user meets them (Debian's Chromium).

Layout at 390 px (no sideways scroll, controls reachable, the connection state near the
top, bounded transcript and frame log), the frame log's follow mode and tools, honest
states (a paused reader the server evicted), dashboard staleness, and axe-core's serious or
critical findings on every page. axe-core comes from ``node_modules/`` (``npm ci``, run by
``make system-deps``): never a download at test time.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, ViewportSize, expect
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from tests.browser.conftest import RemoteSession, SessionPage, screenshot
from tests.support.server import REPO, ServerProcess

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

AXE = REPO / "node_modules" / "axe-core" / "axe.min.js"
ALSO_REFUSED = {"empty-table-header", "landmark-unique"}
"""axe rules of lower impact that the pages must pass too: every column header has a name,
every region a label of its own."""
PHONE: ViewportSize = {"width": 390, "height": 844}
BLOB_BYTES = 64 * 1024
USER_ASKS = {
    "sessionUpdate": "user_message_chunk",
    "content": {"type": "text", "text": "Summarise the design of the event bus, please."},
}
PARAGRAPH = (
    "Each session has one event bus: ids from 1, a ring of the last events for replay, and a"
    " bounded queue per subscriber, so a reader that falls behind is warned, then evicted,"
    " and nobody else notices."
)
PUBLISH_CAP = 2000
"""At most this many 64 KiB events (128 MiB) are published to provoke an eviction."""


def axe_violations(page: Page) -> list[dict[str, Any]]:
    """Run axe-core on the page; return its serious and critical violations (and those of
    ``ALSO_REFUSED``)."""
    if not AXE.exists():
        pytest.fail(f"{AXE} is missing: run `make system-deps` (npm ci)")
    page.add_script_tag(path=str(AXE))
    result = page.evaluate("async () => (await axe.run(document)).violations")
    return [
        {
            "id": v["id"],
            "impact": v["impact"],
            "nodes": [n["target"] for n in v["nodes"]][:5],
            "summary": v["nodes"][0].get("failureSummary", "")[:300],
        }
        for v in result
        if v["impact"] in ("serious", "critical") or v["id"] in ALSO_REFUSED
    ]


def document_width(page: Page) -> int:
    width: int = page.evaluate("document.documentElement.scrollWidth")
    return width


def in_view(page: Page, selector: str) -> bool:
    """Whether the element is inside the viewport (fully, horizontally)."""
    box = page.locator(selector).bounding_box()
    assert box is not None, selector
    viewport = page.viewport_size
    assert viewport is not None
    return box["x"] >= 0 and box["x"] + box["width"] <= viewport["width"] + 0.5


def test_session_page_and_list_fit_a_390px_phone(page: Page, server: ServerProcess) -> None:
    session = RemoteSession.create(server.base_url, title="Phone session with a long title")
    session.publish("session_update", USER_ASKS)
    session.say(*[f"{PARAGRAPH} ({n + 1})\n\n" for n in range(59)])  # taller than the screen
    page.set_viewport_size(PHONE)
    view = SessionPage(page, session).open()
    view.wait_for_id(60)
    assert document_width(page) <= PHONE["width"]
    for control in ("#drop", "#pause", "#demo", "#max-queued", "#max-queued-form button"):
        assert in_view(page, control), f"{control} is off-screen"
    badge = page.locator("#state-badge").bounding_box()
    assert badge is not None
    assert badge["y"] < 300, badge  # the connection state near the top
    for scroller in ("#transcript", "#log-scroll"):
        height = page.evaluate(f"document.querySelector('{scroller}').clientHeight")
        assert 100 < height <= PHONE["height"], (scroller, height)
    screenshot(page, "session-page-phone")
    page.goto(f"{server.base_url}/sessions/")
    assert document_width(page) <= PHONE["width"]
    assert in_view(page, "#new-session button")
    page.goto(f"{server.base_url}/")
    assert document_width(page) <= PHONE["width"]


@pytest.mark.parametrize("width", [1280, 1440])
def test_dashboard_tiles_fill_one_row_and_the_last_column_is_visible(
    page: Page, server: ServerProcess, width: int
) -> None:
    RemoteSession.create(server.base_url, title="dashboard row")
    page.set_viewport_size(ViewportSize(width=width, height=900))
    SessionPage(page, RemoteSession(server.base_url, "")).login("/")
    tops = page.eval_on_selector_all(
        ".dash-tiles .tile", "tiles => tiles.map(t => Math.round(t.getBoundingClientRect().top))"
    )
    assert len(set(tops)) == 1, f"the stat cards wrap: {tops}"
    last = page.locator("#sessions thead th:last-child").bounding_box()
    area = page.locator(".dash-sessions").bounding_box()
    assert last is not None
    assert area is not None
    assert last["x"] + last["width"] <= area["x"] + area["width"] + 0.5, (last, area)


def test_axe_finds_no_serious_or_critical_violation_on_any_page(
    page: Page, server: ServerProcess
) -> None:
    session = RemoteSession.create(server.base_url, title="axe")
    session.say("Hello ", "world")
    view = SessionPage(page, session).open()
    view.wait_for_id(2)
    found = {"session page": axe_violations(page)}
    for name, path in [
        ("dashboard", "/"),
        ("session list", "/sessions/"),
        ("admin index", "/admin/"),
        ("admin sessions", "/admin/agent_sessions/agentsession/"),
        ("admin session", f"/admin/agent_sessions/agentsession/{session.id}/change/"),
        ("admin records", "/admin/agent_sessions/subscriberconnection/"),
    ]:
        response = page.goto(server.base_url + path)
        assert response is not None
        assert response.status == 200, (name, path)
        found[name] = axe_violations(page)
    page.goto(f"{server.base_url}/")
    page.locator(f'tr[data-session-id="{session.id}"] .detail-open').click()
    expect(page.locator("#session-detail")).to_be_visible()
    found["dashboard, a session's subscribers"] = axe_violations(page)
    page.goto(session.page_url)  # the session page again, then ended (banner, badge)
    view.expect_state("open")
    session.close()
    view.expect_state("ended")
    found["session page, ended"] = axe_violations(page)
    browser = page.context.browser
    assert browser is not None
    anonymous = browser.new_context().new_page()  # the login pages, as a visitor sees them
    for name, path in [("login", "/accounts/login/"), ("admin login", "/admin/login/")]:
        anonymous.goto(server.base_url + path)
        found[name] = axe_violations(anonymous)
    anonymous.context.close()
    bad = {name: v for name, v in found.items() if v}
    assert not bad, json.dumps(bad, indent=1)


def test_skip_link_and_admin_favicon(page: Page, server: ServerProcess) -> None:
    SessionPage(page, RemoteSession(server.base_url, "")).login("/sessions/")
    page.keyboard.press("Tab")
    focused = page.evaluate("document.activeElement.textContent.trim()")
    assert focused == "Skip to content"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "content"
    icon = page.request.get(f"{server.base_url}/favicon.ico")
    assert icon.status == 200
    assert icon.headers["content-type"].startswith("image/")


ROW_VISIBLE_JS = """(id) => {
  const row = document.querySelector(`#frame-log tbody tr[data-id="${id}"]`);
  const box = document.getElementById("log-scroll").getBoundingClientRect();
  if (row === null) return false;
  const r = row.getBoundingClientRect();
  return r.bottom > box.top && r.top < box.bottom;
}"""
"""Whether the frame log's row of an event id is inside the log's visible area."""


def expect_row_in_view(page: Page, event_id: int, why: str) -> None:
    try:
        page.wait_for_function(ROW_VISIBLE_JS, arg=event_id, timeout=3_000)
    except PlaywrightTimeoutError:
        pytest.fail(f"#{event_id} never scrolled into the frame log's view: {why}")


def test_after_drop_connection_the_frame_log_keeps_following_new_events(
    page: Page, server: ServerProcess
) -> None:
    session = RemoteSession.create(server.base_url, title="follow")
    view = SessionPage(page, session).open()
    first = session.say(*[f"{n} " for n in range(80)])[-1]
    view.wait_for_id(first)
    expect_row_in_view(page, first, "follow mode before any drop")
    page.click("#drop")
    during = session.say(*[f"d{n} " for n in range(400)])[-1]  # replayed in one burst
    view.wait_for_id(during, timeout_ms=20_000)
    last = session.say("after the reconnect")[-1]
    view.wait_for_id(last)
    expect_row_in_view(page, last, "the frame log stopped following after the reconnect")


def evict_paused_reader(view: SessionPage) -> int:
    """Pause the page at maxQueued=16, publish 64 KiB events until the server evicted its
    reader (bounded: 2,000 events / 128 MiB); return the number published."""
    page, session = view.page, view.session
    page.fill("#max-queued", "16")
    page.click("#max-queued-form button")
    expect(page.locator("#max-queued-current")).to_have_text("16")
    view.expect_state("open")
    page.click("#pause")
    expect(page.locator("#paused-chip")).to_be_visible()
    published = 0
    while session.subscriber_count() > 0 and published < PUBLISH_CAP:
        for n in range(25):
            # Random text: the stream is gzipped (EB-17); a run of one letter would not fill
            # the socket's buffers.
            blob = secrets.token_urlsafe(BLOB_BYTES * 3 // 4)
            session.publish("note", {"n": published + n, "blob": blob})
        published += 25
    assert session.subscriber_count() == 0, "the server never evicted the paused reader"
    return published


# serial: publishes tens of MiB of random text, gzipped by the server and inflated by
# Chromium, until the paused page's reader is evicted: CPU-bound on both sides. Beside two
# other pytest-xdist workers it ran into the 60 s test timeout (13-28 s alone), and
# the page's 5 s to say so is measured on the machine's clock.
@pytest.mark.serial
def test_a_paused_page_says_within_5_s_that_the_server_evicted_its_reader(
    page: Page, server: ServerProcess
) -> None:
    session = RemoteSession.create(server.base_url, title="paused and evicted", ringSize=64)
    view = SessionPage(page, session).open()
    view.wait_for_id(session.say("Reading the backlog slowly… ")[-1])
    evict_paused_reader(view)  # about 1,025 events of 64 KiB on this machine
    # Without Resume: the page asks whether its reader is still there while it is paused.
    view.expect_state("evicted", timeout_ms=5_000)
    expect(page.locator("#state-reason")).to_contain_text("evicted this reader while reading")
    expect(page.locator("#paused-chip")).to_have_text("paused · evicted")
    screenshot(page, "session-page-paused-evicted")
    page.click("#pause")  # resume: the backlog, the eviction frame, the reconnect
    # Either cap may be the one that evicted: both wait OVERFLOW_GRACE_S, the byte cap
    # only up to twice its 2 MiB (EB-3, EB-5).
    overflow = re.compile(r"queue_(bytes_)?overflow")
    expect(page.locator("#last-evicted")).to_contain_text(overflow, timeout=20_000)
    view.expect_state("open", timeout_ms=20_000)
    expect(page.locator("#notice")).to_be_hidden()  # the eviction notice is no longer true
    screenshot(page, "session-page-evicted")


def test_notices_clear_once_they_are_no_longer_true(page: Page, server: ServerProcess) -> None:
    session = RemoteSession.create(server.base_url, title="notices")
    view = SessionPage(page, session).open(install_clock=True)
    view.freeze_clock()
    page.click("#drop")
    expect(page.locator("#notice")).to_contain_text("Connection dropped")
    # The only tab of its session: no other tab shared its stream, none keeps sharing.
    expect(page.locator("#notice")).to_contain_text("no other tab of this session shared it")
    expect(page.locator("#notice")).not_to_contain_text("keep sharing")
    view.advance_clock(4_000)  # the reconnect after the retry delay (3 s)
    view.expect_state("open")
    expect(page.locator("#notice")).to_be_hidden()
    page.fill("#max-queued", "16")
    page.click("#max-queued-form button")
    view.expect_state("open")
    expect(page.locator("#notice")).to_be_hidden()


def test_frame_log_filters_searches_exports_and_offers_jump_to_latest(
    page: Page, server: ServerProcess
) -> None:
    session = RemoteSession.create(server.base_url, title="log tools")
    view = SessionPage(page, session).open()
    ids = session.say(*[f"chunk {n} " for n in range(60)])
    session.publish("turn_complete", {"turn": 1, "stopReason": "end_turn"})
    view.wait_for_id(ids[-1] + 1)
    rows = page.locator("#frame-log tbody tr:visible")
    page.select_option("#log-type", "turn_complete")
    expect(rows).to_have_count(1)
    page.select_option("#log-type", "")
    page.fill("#log-search", "chunk 42 ")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-id", str(ids[42]))
    page.fill("#log-search", "")
    page.check("#log-incidents")
    expect(rows).to_have_count(0)
    page.uncheck("#log-incidents")
    with page.expect_download() as download:
        page.click("#log-export")
    lines = Path(download.value.path()).read_text().splitlines()
    exported = [json.loads(line) for line in lines]
    assert [r["id"] for r in exported if r["kind"] == "event"] == [*ids, ids[-1] + 1]
    assert exported[-1]["type"] == "turn_complete"
    # Scrolled up by the user: follow mode is off, new rows are counted, one click jumps.
    page.locator("#log-scroll").hover()
    page.mouse.wheel(0, -5_000)
    expect(page.locator("#log-follow")).not_to_be_checked()
    last = session.say("a", "b", "c")[-1]
    view.wait_for_id(last)
    expect(page.locator("#log-jump")).to_have_text("3 new — jump to latest")
    page.click("#log-jump")
    expect_row_in_view(page, last, "jump to latest")
    expect(page.locator("#log-follow")).to_be_checked()
    expect(page.locator("#log-jump")).to_be_hidden()


def test_start_demo_says_when_an_agent_runs_and_refusals_are_words(
    page: Page, server: ServerProcess
) -> None:
    session = RemoteSession.create(server.base_url, title="demo state")
    SessionPage(page, session).open()
    page.click("#demo")
    expect(page.locator("#demo")).to_have_text("Demo agent running")
    expect(page.locator("#demo")).to_be_disabled()
    page.reload()  # a page opened while the agent runs says so too
    expect(page.locator("#demo")).to_have_text("Demo agent running")
    session.close()
    expect(page.locator("#state-badge")).to_have_attribute("data-state", "ended")
    expect(page.locator("#reading")).to_have_text("ended (the session is closed)")
    expect(page.locator("#reconnects")).to_have_text("0")
    assert "demo_running" not in page.locator("body").inner_text()


def test_dashboard_greys_out_its_values_with_their_time_while_the_feed_is_down(
    page: Page, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server("serve")
    RemoteSession.create(server.base_url, title="stale")
    SessionPage(page, RemoteSession(server.base_url, "")).login("/")
    expect(page.locator("#feed-state")).to_have_attribute("data-state", "live")
    expect(page.locator(".dash")).not_to_have_class(re.compile(r"\bstale\b"))
    expect(page.locator(".topbar-user a", has_text="Dashboard")).to_be_visible()
    expect(page.locator("body")).to_have_attribute("data-stats-seen", re.compile(r"^[1-9]"))
    server.stop()
    expect(page.locator(".dash")).to_have_class(re.compile(r"\bstale\b"))
    expect(page.locator("#stale-note")).to_have_text(re.compile(r"^values as of \d\d:\d\d:\d\d$"))


def test_session_list_shows_the_live_last_id_and_subscribers(
    page: Page, server: ServerProcess
) -> None:
    session = RemoteSession.create(server.base_url, title="listed live")
    view = SessionPage(page, session).open()
    last = session.say("one ", "two ", "three ")[-1]
    view.wait_for_id(last)
    listing = page.context.new_page()  # the session page keeps streaming in the first tab
    listing.goto(f"{server.base_url}/sessions/")
    row = listing.locator("tr", has=listing.get_by_role("link", name="listed live", exact=True))
    expect(row.locator('[data-field="lastEventId"]')).to_have_text(str(last))
    expect(row.locator('[data-field="subscribers"]')).to_have_text("1")
    listing.close()
