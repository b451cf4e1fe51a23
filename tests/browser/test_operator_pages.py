"""The operator's pages other than the session page, at 1440 and 390 px (Debian's Chromium).

Every page — dashboard, session list, admin index, lists and session pages (with and
without incidents), the login pages, 403 and 404 — must not scroll sideways at 390 px and
must have no serious or critical axe-core finding at either width. The session list and the
dashboard show their live numbers on a phone; the admin's session page is read-only and
shows times to the second and sizes in KiB/MiB.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.template.loader import render_to_string
from django.test import RequestFactory
from playwright.sync_api import Browser, Page, Route, ViewportSize, expect

from tests.browser.conftest import VIEWPORT, WAIT_MS, RemoteSession, SessionPage, screenshot
from tests.browser.test_page_ux import PHONE, axe_violations, document_width
from tests.support.server import ServerProcess, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.timeout(300)]
"""Many pages a test, and an eviction to provoke first: longer than the default bound."""

BIG_EVENT = "x" * 65536
EVICTION_CAP = 1000
"""At most this many 64 KiB events (64 MiB) are published to get one reader evicted."""
ADMIN = "/admin/agent_sessions"


@contextlib.contextmanager
def stalled_reader(server: ServerProcess, session: RemoteSession) -> Iterator[None]:
    """A subscriber (raw socket, ``maxQueued=16``, no gzip) that never reads its stream."""
    from sessions.auth import issue_token

    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    token = issue_token(session.id, ["read"])
    sock.sendall(
        f"GET /session/{session.id}/events?maxQueued=16 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    try:
        assert sock.recv(12).startswith(b"HTTP/1.1 200")
        yield
    finally:
        sock.close()


def session_with_an_eviction(server: ServerProcess) -> RemoteSession:
    """A session whose one stalled reader the server evicted (bounded: 1,000 events)."""
    session = RemoteSession.create(server.base_url, title="evicted reader")
    with stalled_reader(server, session):
        assert wait_for(lambda: session.subscriber_count() == 1, timeout_s=10)
        for n in range(EVICTION_CAP):
            session.publish("big", {"n": n, "payload": BIG_EVENT})
            if n % 10 == 9 and session.subscriber_count() == 0:
                break  # evicted (EB-5)
        assert session.subscriber_count() == 0, "the server never evicted the stalled reader"
    return session


@pytest.fixture(scope="module")
def sessions(server: ServerProcess) -> dict[str, RemoteSession]:
    """A session with incidents (an eviction) and one without, both with a connection."""
    quiet = RemoteSession.create(server.base_url, title="quiet session")
    quiet.say("Hello ", "world")
    return {"evicted": session_with_an_eviction(server), "quiet": quiet}


SIDEWAYS_JS = """() => [...document.querySelectorAll("*")].filter((el) => {
  const style = getComputedStyle(el);
  return ["auto", "scroll"].includes(style.overflowX) && el.scrollWidth > el.clientWidth + 1;
}).map((el) => el.id ? `#${el.id}` : `${el.tagName}.${[...el.classList].join(".")}`)"""
"""The elements of the page that scroll sideways inside themselves (a table in a box)."""


def sideways(page: Page) -> dict[str, Any]:
    """How the page spills sideways: the document's width and the inner scrollers."""
    return {"width": document_width(page), "scrollers": page.evaluate(SIDEWAYS_JS)}


def log_in(page: Page, server: ServerProcess, path: str = "/") -> None:
    SessionPage(page, RemoteSession(server.base_url, "")).login(path)


def admin_pages(sessions: dict[str, RemoteSession], page: Page, base: str) -> list[tuple[str, str]]:
    """The admin pages to check (a connection's page found from the connections list)."""
    page.goto(f"{base}{ADMIN}/subscriberconnection/?session__id__exact={sessions['evicted'].id}")
    connection = page.locator("#result_list tbody tr a").first.get_attribute("href")
    page.goto(f"{base}{ADMIN}/subscriberincident/?session__id__exact={sessions['evicted'].id}")
    incident = page.locator("#result_list tbody tr a").first.get_attribute("href")
    assert connection is not None
    assert incident is not None
    return [
        ("admin index", "/admin/"),
        ("admin sessions", f"{ADMIN}/agentsession/"),
        ("admin session with incidents", f"{ADMIN}/agentsession/{sessions['evicted'].id}/change/"),
        ("admin session without incidents", f"{ADMIN}/agentsession/{sessions['quiet'].id}/change/"),
        ("admin connections", f"{ADMIN}/subscriberconnection/"),
        ("admin connection", connection),
        ("admin incidents", f"{ADMIN}/subscriberincident/"),
        ("admin incident", incident),
    ]


def wait_for_incidents(page: Page, base: str, session: RemoteSession) -> None:
    """Reload the admin's session page until its eviction is recorded (records are
    written every second: RECORDS_FLUSH_INTERVAL_S)."""
    for _ in range(20):
        page.goto(f"{base}{ADMIN}/agentsession/{session.id}/change/")
        if page.locator("#incidents-group table").count():
            return
        page.wait_for_timeout(500)  # the records writer's next batch, at most 20 times
    pytest.fail("the eviction was never recorded")


def not_found_html() -> str:
    """``templates/404.html`` as the server renders it with DEBUG off (the test servers run
    with DEBUG on, where Django shows its technical 404 page instead)."""
    from django.contrib.auth.models import AnonymousUser

    request = RequestFactory().get("/sessions/missing/")
    request.user = AnonymousUser()
    return render_to_string("404.html", request=request)


def open_not_found(page: Page, base: str) -> None:
    path = f"/sessions/{uuid.uuid4()}/"
    body = not_found_html()

    def fulfil(route: Route) -> None:
        route.fulfill(status=404, body=body, content_type="text/html; charset=utf-8")

    page.route(f"{base}{path}", fulfil)
    response = page.goto(f"{base}{path}")
    assert response is not None
    assert response.status == 404
    expect(page.locator("h1")).to_contain_text("404")


def open_forbidden(page: Page, base: str, session: RemoteSession) -> None:
    """A form POST to the admin's read-only session page: Django's 403 page."""
    page.goto(f"{base}{ADMIN}/agentsession/{session.id}/change/")
    with page.expect_navigation():
        page.evaluate(
            """() => {
              const form = document.createElement("form");
              form.method = "post";
              const token = document.cookie.match(/csrftoken=([^;]+)/)[1];
              form.innerHTML = `<input type="hidden" name="csrfmiddlewaretoken" value="${token}">`;
              document.body.append(form);
              form.submit();
            }"""
        )
    expect(page.locator("h1")).to_contain_text("403")


def every_page(
    page: Page, browser: Browser, server: ServerProcess, sessions: dict[str, RemoteSession],
    viewport: ViewportSize, check: Any,
) -> dict[str, Any]:  # fmt: skip
    """``check(page)`` on every page at ``viewport``: ``{page name: its result}``."""
    base = server.base_url
    page.set_viewport_size(viewport)
    log_in(page, server, "/sessions/")
    wait_for_incidents(page, base, sessions["evicted"])
    found: dict[str, Any] = {}
    for name, path in [("dashboard", "/"), ("session list", "/sessions/")]:
        page.goto(base + path)
        found[name] = check(page)
    for name, path in admin_pages(sessions, page, base):
        response = page.goto(base + path)
        assert response is not None
        assert response.status == 200, (name, path)
        found[name] = check(page)
    open_forbidden(page, base, sessions["quiet"])
    found["403"] = check(page)
    open_not_found(page, base)
    found["404"] = check(page)
    anonymous = browser.new_context(viewport=viewport).new_page()  # as a visitor sees them
    try:
        for name, path in [("login", "/accounts/login/"), ("admin login", "/admin/login/")]:
            anonymous.goto(base + path)
            found[name] = check(anonymous)
    finally:
        anonymous.context.close()
    return found


def test_no_page_scrolls_sideways_at_390px(
    page: Page, browser: Browser, server: ServerProcess, sessions: dict[str, RemoteSession]
) -> None:
    found = every_page(page, browser, server, sessions, PHONE, sideways)
    wide = {
        name: spill
        for name, spill in found.items()
        if spill["width"] > PHONE["width"] or spill["scrollers"]
    }
    assert not wide, f"pages that scroll sideways at {PHONE['width']} px: {wide}"


@pytest.mark.parametrize("viewport", [VIEWPORT, PHONE], ids=["1440px", "390px"])
def test_axe_finds_nothing_serious_on_the_operator_pages(
    page: Page,
    browser: Browser,
    server: ServerProcess,
    sessions: dict[str, RemoteSession],
    viewport: ViewportSize,
) -> None:
    found = every_page(page, browser, server, sessions, viewport, axe_violations)
    bad = {name: v for name, v in found.items() if v}
    assert not bad, json.dumps(bad, indent=1)


def test_session_list_and_dashboard_show_the_live_numbers_on_a_phone(
    page: Page, browser: Browser, server: ServerProcess
) -> None:
    session = RemoteSession.create(server.base_url, title="on a phone")
    view = SessionPage(page, session).open()  # one subscriber: this page's stream
    last = session.say("one ", "two ")[-1]
    view.wait_for_id(last)
    phone = browser.new_context(viewport=PHONE).new_page()
    phone.set_default_timeout(WAIT_MS)
    try:
        log_in(phone, server, "/sessions/")
        row = phone.locator("tr", has=phone.get_by_role("link", name="on a phone", exact=True))
        for field, value in (("lastEventId", str(last)), ("subscribers", "1")):
            cell = row.locator(f'[data-field="{field}"]')
            expect(cell).to_have_text(value)
            box = cell.bounding_box()
            assert box is not None
            assert box["x"] >= 0, (field, box)
            assert box["x"] + box["width"] <= PHONE["width"], (field, box)
        uuid_box = row.locator(".uuid").bounding_box()
        assert uuid_box is not None
        assert uuid_box["height"] < 30, f"the id wraps: {uuid_box}"  # one line
        expect(row.locator(".uuid")).to_have_attribute("title", session.id)
        screenshot(phone, "session-list-phone")
        phone.goto(f"{server.base_url}/")
        card = phone.locator(f'#sessions tr[data-session-id="{session.id}"]')
        expect(card.locator('[data-field="subscribers"]')).to_have_text("1")
        assert document_width(phone) <= PHONE["width"]
        screenshot(phone, "dashboard-phone")
    finally:
        phone.context.close()


def test_admin_session_page_is_read_only_with_seconds_and_kib(
    page: Page, server: ServerProcess, sessions: dict[str, RemoteSession]
) -> None:
    log_in(page, server, "/admin/")
    wait_for_incidents(page, server.base_url, sessions["evicted"])
    expect(page.locator("input[name=_save], input[name=_continue]")).to_have_count(0)
    expect(page.locator("a.deletelink")).to_have_count(0)
    created = page.locator(".field-created_at .readonly")
    expect(created).to_have_text(re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$"))
    sent = page.locator("#connections-group td.field-sent p").first
    expect(sent).to_have_text(re.compile(r"^\d+(\.\d+)? (B|KiB|MiB|GiB)$"))
    # Loaded: the live numbers, and of the saved counters only those they do not show.
    expect(page.locator(".field-event_id_reserved")).to_have_count(1)
    expect(page.locator(".field-events_published")).to_have_count(0)
    page.goto(f"{server.base_url}{ADMIN}/agentsession/{sessions['quiet'].id}/change/")
    expect(page.locator("#incidents-group")).to_contain_text("None recorded.")
    expect(page.locator("#incidents-group table")).to_have_count(0)
