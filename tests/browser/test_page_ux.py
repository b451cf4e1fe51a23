"""The pages an operator lives in, as a new user meets them (Debian's Chromium).

Layout at 390 px (no sideways scroll, controls reachable, the connection state near the
top, bounded transcript and frame log), the frame log's follow mode and tools, honest
states (a paused reader the server evicted), dashboard staleness, and axe-core's serious or
critical findings on every page. axe-core comes from ``node_modules/`` (``npm ci``, run by
``make system-deps``): never a download at test time.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from playwright.sync_api import Page, ViewportSize
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from tests.browser.conftest import RemoteSession, SessionPage, screenshot
from tests.support.server import REPO, ServerProcess

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

AXE = REPO / "node_modules" / "axe-core" / "axe.min.js"
PHONE: ViewportSize = {"width": 390, "height": 844}
BLOB = "x" * 64 * 1024
PUBLISH_CAP = 2000
"""At most this many 64 KiB events (128 MiB) are published to provoke an eviction."""


def axe_violations(page: Page) -> list[dict[str, Any]]:
    """Run axe-core on the page; return its serious and critical violations."""
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
        if v["impact"] in ("serious", "critical")
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
    session.say(*[f"line {n}\n" * 20 for n in range(60)])  # a transcript taller than the screen
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
    pages = {"session page": session.page_url}
    found = {"session page": axe_violations(page)}
    for name, path in [
        ("dashboard", "/"),
        ("session list", "/sessions/"),
        ("admin index", "/admin/"),
        ("admin sessions", "/admin/agent_sessions/agentsession/"),
        ("admin session", f"/admin/agent_sessions/agentsession/{session.id}/change/"),
        ("admin records", "/admin/agent_sessions/subscriberconnection/"),
    ]:
        pages[name] = server.base_url + path
        response = page.goto(server.base_url + path)
        assert response is not None
        assert response.status == 200, (name, path)
        found[name] = axe_violations(page)
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
