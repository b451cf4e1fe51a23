"""The session page over the WebSocket transport (``?transport=ws``, issue 27) in Chromium.

The page's stream rides ``GET /ws`` (./static/qwenweb/ws.js); these tests check that it
shows the same thing as over SSE and resumes the same way: after a Drop, and after the
server itself cut the socket (a restart), one ``subscribe`` with the cursor and epoch,
every event once and in order. Playwright records the messages the page sends.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, WebSocket, expect

from sessions.auth import issue_token
from tests.browser.conftest import VIEWPORT, RemoteSession, SessionPage
from tests.support.server import ServerProcess

pytestmark = [
    pytest.mark.browser,
    pytest.mark.e2e,
    # servers of their own, restarts, token lifetimes, three tabs: on a loaded machine
    pytest.mark.timeout(180),
]


class SentMessages:
    """The JSON messages the page sends on its WebSockets, in order, with the socket's number."""

    def __init__(self, page: Page) -> None:
        self.sockets: list[str] = []
        self.messages: list[tuple[int, dict[str, Any]]] = []
        page.on("websocket", self._on_socket)

    def _on_socket(self, socket: WebSocket) -> None:
        number = len(self.sockets)
        self.sockets.append(socket.url)
        socket.on("framesent", lambda payload: self.messages.append((number, json.loads(payload))))

    def subscribes(self) -> list[tuple[int, dict[str, Any]]]:
        return [(n, m) for n, m in self.messages if m.get("op") == "subscribe"]


def open_over_ws(
    page: Page, server: ServerProcess
) -> tuple[RemoteSession, SessionPage, SentMessages]:
    session = RemoteSession.create(server.base_url, title="over ws")
    sent = SentMessages(page)
    view = SessionPage(page, session).open(install_clock=True, query="transport=ws")
    return session, view, sent


def test_over_ws_the_panel_says_websocket_and_events_arrive_in_order(
    page: Page, server: ServerProcess
) -> None:
    session, view, sent = open_over_ws(page, server)
    expect(page.locator("#transport")).to_have_attribute("data-transport", "websocket")
    said = session.say("Hello ", "over ", "a socket")
    view.wait_for_id(said[-1])
    assert view.log_ids() == said
    assert view.agent_text() == "Hello over a socket"
    assert view.traffic.streams() == [], "no SSE request over ?transport=ws"
    assert sent.sockets[0].endswith("/ws")
    [(_, subscribe)] = sent.subscribes()
    assert subscribe["session"] == session.id
    assert "token" in subscribe


def test_over_ws_drop_then_30_events_resume_with_the_cursor_each_id_once(
    page: Page, server: ServerProcess
) -> None:
    # The Drop cuts the socket; the reconnect sends one subscribe with the cursor and epoch.
    session, view, sent = open_over_ws(page, server)
    before = session.say(*(f"a{n} " for n in range(5)))
    view.wait_for_id(before[-1])
    view.freeze_clock()
    page.click("#drop")
    view.expect_state("reconnecting")
    during = session.say(*(f"b{n} " for n in range(30)))
    view.advance_clock(5_000)
    view.wait_for_id(during[-1])
    assert view.log_ids() == [*before, *during]
    assert len(sent.sockets) == 2
    resubscribe = [m for n, m in sent.subscribes() if n == 1]
    assert len(resubscribe) == 1
    assert resubscribe[0]["lastEventId"] == before[-1]
    assert resubscribe[0]["epoch"] == session.load()["epoch"]
    expect(page.locator("#reconnects")).to_have_text("1")


def test_over_ws_a_server_restart_cuts_the_socket_and_the_page_resumes_without_gap(
    page: Page, start_server: Callable[..., ServerProcess]
) -> None:
    # The server cuts the socket (its process stops); events published before the page's
    # reconnect fires are replayed after the cursor: no gap, no duplicate, no resync
    # (the durable and Redis backends outlive the process).
    server = start_server("serve")
    session, view, sent = open_over_ws(page, server)
    before = session.say("one ", "two ", "three ")
    view.wait_for_id(before[-1])
    server.stop()
    view.expect_state("reconnecting")
    server.start()
    while_away = session.say("four ", "five ")
    view.page.clock.fast_forward(60_000)  # fire the pending reconnect now
    view.expect_state("open")
    view.wait_for_id(while_away[-1])
    after = session.say("six")
    view.wait_for_id(after[-1])
    assert view.log_ids() == [*before, *while_away, *after]
    assert view.agent_text() == "one two three four five six"
    expect(page.locator("#last-resync")).to_have_text("—")
    assert sent.subscribes()[-1][1]["lastEventId"] == before[-1]


def test_over_ws_the_token_is_refreshed_in_band_and_the_subscription_outlives_it(
    page: Page, start_server: Callable[..., ServerProcess]
) -> None:
    # Tokens of 4 s, replaced in band at half their life: after two lifetimes the
    # first subscription still streams; no token_expired, no resubscribe, no reconnect.
    server = start_server("serve", QWENWEB_TOKEN_LIFETIME_S="4")
    session = RemoteSession.create(server.base_url)
    sent = SentMessages(page)
    view = SessionPage(page, session).open(query="transport=ws")
    first = session.say("p0 ")
    view.wait_for_id(first[-1])
    expect(page.locator("#tokens")).to_have_text("5", timeout=30_000)  # four refreshes: 8 s
    after = session.say("q0 ", "q1 ")
    view.wait_for_id(after[-1])
    assert view.log_ids() == [*first, *after]
    expect(page.locator("#last-stream-error")).to_have_text("—")
    expect(page.locator("#reconnects")).to_have_text("0")
    assert len(sent.subscribes()) == 1
    refreshes = [m for _, m in sent.messages if m.get("op") == "refresh"]
    assert len(refreshes) >= 4
    assert len({m["token"] for m in refreshes}) == len(refreshes)


MANY_SESSIONS_JS = """async ({ sessions }) => {
  const { SessionSocket, WsSessionStream } = await import("/static/qwenweb/ws.js");
  const socket = new SessionSocket({ url: "/ws", initialRetryMs: 200 });
  window.received = {};
  window.replays = {};
  window.socket = socket;
  for (const { id, token } of sessions) {
    window.received[id] = [];
    window.replays[id] = 0;
    new WsSessionStream({
      socket,
      session: id,
      lastEventId: "0",
      getToken: async () => token,
      onEvent: (e) => {
        if (e.id !== null) window.received[id].push(Number(e.id));
        if (e.type === "replay_complete") window.replays[id] += 1;
        if (e.type === "state_resync_required") window.resyncs = (window.resyncs ?? 0) + 1;
      },
    }).start();
  }
}"""
"""One SessionSocket carrying every session of ``sessions`` ({id, token}), each from cursor 0."""


def test_one_socket_carries_many_sessions_and_resumes_all_in_one_batch_after_a_server_cut(
    page: Page, start_server: Callable[..., ServerProcess]
) -> None:
    # Issue 27: one socket, N subscriptions; the server's process stops (the socket is cut),
    # events are published to every session meanwhile; the new socket resubscribes all N
    # in one burst with their cursors and epochs: every event once, in order, per session.
    server = start_server("serve")
    sessions = [RemoteSession.create(server.base_url, title=f"many {n}") for n in range(20)]
    for session in sessions:
        session.say("a ", "b ", "c ")
    sent = SentMessages(page)
    page.goto(f"{server.base_url}/admin/login/")
    tokens = [{"id": s.id, "token": issue_token(s.id, ["read"])} for s in sessions]
    page.evaluate(MANY_SESSIONS_JS, {"sessions": tokens})
    every_replay = "n => Object.values(window.replays).every(c => c >= n)"
    page.wait_for_function(every_replay, arg=1, timeout=30_000)
    epoch = {s.id: s.load()["epoch"] for s in sessions}
    server.stop()
    server.start()
    for session in sessions:
        session.say(*(f"d{n} " for n in range(10)))
    page.wait_for_function(every_replay, arg=2, timeout=60_000)
    all_events = "n => Object.values(window.received).every(ids => ids.length >= n)"
    page.wait_for_function(all_events, arg=13, timeout=30_000)
    received = page.evaluate("window.received")
    assert all(received[s.id] == list(range(1, 14)) for s in sessions), received
    assert page.evaluate("window.resyncs ?? 0") == 0
    last_socket = max(n for n, _ in sent.subscribes())
    batch = [m for n, m in sent.subscribes() if n == last_socket]
    first_messages = [m["op"] for n, m in sent.messages if n == last_socket][: len(sessions)]
    assert first_messages == ["subscribe"] * len(sessions), "one burst, nothing in between"
    assert sorted(m["session"] for m in batch) == sorted(s.id for s in sessions)
    assert all((m["lastEventId"], m["epoch"]) == (3, epoch[m["session"]]) for m in batch)
    assert len(sent.sockets) >= 2


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    """One browser profile: its tabs share BroadcastChannels and locks."""
    context = browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
    context.set_default_timeout(10_000)
    errors: list[str] = []
    context.on("weberror", lambda error: errors.append(str(error.error)))
    yield context
    context.close()
    assert not errors, f"errors in the pages: {errors}"


def test_over_ws_three_tabs_share_one_socket_and_a_new_leader_resumes_without_loss(
    context: BrowserContext, server: ServerProcess
) -> None:
    # Tab sharing (shared_stream.js) with WsSessionStream: one leader tab holds the socket;
    # when it closes, another tab is elected and subscribes with the cursor it applied.
    session = RemoteSession.create(server.base_url, title="ws tabs")
    pages = [context.new_page() for _ in range(3)]
    sent = [SentMessages(page) for page in pages]
    views = [SessionPage(pages[0], session).open(query="transport=ws")]
    for page in pages[1:]:
        page.goto(f"{session.page_url}?transport=ws")
        views.append(SessionPage(page, session))
    first = session.say("one ", "two ")
    for view in views:
        view.wait_for_id(first[-1])
    assert sum(len(s.sockets) for s in sent) == 1, "one socket for the three tabs"
    leader = next(n for n, s in enumerate(sent) if s.sockets)
    pages[leader].close()
    while_electing = session.say("three ")
    rest = [view for n, view in enumerate(views) if n != leader]
    after = session.say("four")
    for view in rest:
        view.wait_for_id(after[-1])
        assert view.log_ids() == [*first, *while_electing, *after]
        assert view.agent_text() == "one two three four"
    assert sum(len(s.sockets) for n, s in enumerate(sent) if n != leader) == 1
