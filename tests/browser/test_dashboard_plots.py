"""The dashboard's plots and session order against a real server that stops (Chromium).

The outage is real: every process of ``python -m qwenweb.serve`` is stopped with SIGSTOP
for :data:`OUTAGE_S` seconds (longer than the plots' gap rule, ``GAP_AFTER_S`` = 5 s, as
a 20 s outage is), then continued. No sample is taken meanwhile, and the page must draw a
gap there — by the samples' times — not a line across.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import RemoteSession, SessionPage, screenshot
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.timeout(180)]

OUTAGE_S = 10.0
"""How long the server is stopped: twice the gap rule (the brief allows shortening 20 s)."""


def stopped(server: ServerProcess, seconds: float) -> None:
    """Stop every process of ``server`` for ``seconds`` (SIGSTOP … SIGCONT), then go on."""
    pids = server.pids()
    assert pids, "the server has no process"
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)  # the outage itself: its length is what the test is about
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def stats_seen(page: Page) -> int:
    return int(page.locator("body").get_attribute("data-stats-seen") or 0)


def test_a_stopped_server_leaves_a_gap_in_the_plots_not_a_line(
    page: Page, start_server: Callable[..., ServerProcess]
) -> None:
    server = start_server("serve")
    session = RemoteSession.create(server.base_url, title="through the outage")
    SessionPage(page, session).login("/")
    expect(page.locator("#feed-state")).to_have_attribute("data-state", "live")
    page.wait_for_function("() => Number(document.body.dataset.statsSeen) >= 3")
    stopped(server, OUTAGE_S)
    seen = stats_seen(page)
    page.wait_for_function(f"() => Number(document.body.dataset.statsSeen) >= {seen + 3}")
    for plot in ("rate", "subscribers", "lag"):
        gaps = page.eval_on_selector_all(
            f"#plot-{plot} rect.gap", "rects => rects.map(r => [+r.dataset.from, +r.dataset.to])"
        )
        assert any(to - start >= (OUTAGE_S - 1) * 1000 for start, to in gaps), (plot, gaps)
        subpaths = page.locator(f"#plot-{plot} path.line").get_attribute("d") or ""
        assert subpaths.count("M") >= 2, f"{plot}: one line across the outage: {subpaths[:200]}"
    # Hovering the middle of the gap reads the missing data, not a value.
    start = next(a for a, b in gaps if b - a >= (OUTAGE_S - 1) * 1000)  # the last plot's
    box = page.locator(f'#plot-lag rect.gap[data-from="{start}"]').bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    tip = page.locator("#plot-lag-frame .plot-tip")
    expect(tip).to_be_visible()
    expect(tip).to_contain_text(re.compile(r"^no data from \d\d:\d\d:\d\d to \d\d:\d\d:\d\d"))
    screenshot(page, "dashboard-gap")
    # By keyboard: the last sample before the outage says the missing data follows.
    frame = page.locator("#plot-subscribers-frame")
    frame.focus()
    page.keyboard.press("End")
    expect(frame).to_have_attribute(
        "aria-valuetext", re.compile(r"^\d\d:\d\d:\d\d · \d+ subscribers")
    )
    for _ in range(120):
        text = frame.get_attribute("aria-valuetext") or ""
        if "then no data for" in text:
            break
        page.keyboard.press("ArrowLeft")
    assert "then no data for" in text, text


def test_live_sessions_come_first_and_the_filter_and_search_find_them(
    page: Page, server: ServerProcess
) -> None:
    tag = f"order-{time.monotonic_ns()}"
    live = RemoteSession.create(server.base_url, title=f"{tag} live")  # the oldest
    view = SessionPage(page, live).open()  # subscribed: loaded and open
    for name in ("closed a", "closed b"):
        RemoteSession.create(server.base_url, title=f"{tag} {name}").close()
    dashboard = page.context.new_page()
    dashboard.goto(f"{server.base_url}/")
    dashboard.fill("#session-search", tag)
    rows = dashboard.locator("#sessions tbody tr[data-session-id]:visible")
    expect(rows).to_have_count(3)
    expect(rows.first).to_have_attribute("data-session-id", live.id)
    expect(rows.first.locator('[data-field="subscribers"]')).to_have_text("1")
    expect(rows.nth(1).locator('[data-field="status"]')).to_have_text("closed")
    dashboard.locator("#session-filter label", has_text="Closed").click()
    expect(rows).to_have_count(2)
    dashboard.locator("#session-filter label", has_text="Live").click()
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-session-id", live.id)
    dashboard.fill("#session-search", f"{tag} nothing-like-this")
    expect(rows).to_have_count(0)
    expect(dashboard.locator("#sessions .filter-empty")).to_be_visible()
    # Closed while watched: it leaves the top without a reload.
    dashboard.fill("#session-search", tag)
    dashboard.locator("#session-filter label", has_text="All").click()
    live.close()
    view.expect_state("ended")
    expect(rows.first).not_to_have_attribute("data-session-id", live.id)
    dashboard.close()


def test_the_time_range_switches_the_plots_to_the_last_hour(
    page: Page, server: ServerProcess
) -> None:
    SessionPage(page, RemoteSession(server.base_url, "")).login("/")
    expect(page.locator("#plot-rate-frame + .plot-axis")).to_contain_text("−5 min")
    page.locator("#time-range label", has_text="1 h").click()
    expect(page.locator("#plot-rate-frame + .plot-axis")).to_contain_text("−1 h")
    expect(page.locator("#plot-rate-title")).to_contain_text("last hour")
