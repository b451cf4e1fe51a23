"""The session page in a real headless Chromium against real server processes.

Rules: SC-n and EB-n of ``docs/protocol.md`` (its rule index). The
page is driven as an operator would (admin login form, buttons); the server only over HTTP.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable

import pytest
from playwright.sync_api import ConsoleMessage, Page, expect

from tests.browser.conftest import (
    RemoteSession,
    SessionPage,
    agent_chunk,
    event_ids,
    number_in,
    screenshot,
)
from tests.support.backend import memory_only
from tests.support.server import ServerProcess, request_json, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

OPEN_NATIVE_AND_OURS_JS = """async ({ url, tokenUrl }) => {
  const { SessionEventStream } = await import("/static/qwenweb/sse.js");
  const csrf = document.querySelector("input[name=csrfmiddlewaretoken]").value;
  const getToken = async () => {
    const init = { method: "POST", headers: { "X-CSRFToken": csrf }, body: "" };
    return (await (await fetch(tokenUrl, init)).json()).token;
  };
  window.native = [];
  window.ours = [];
  const native = new EventSource(url);  // the login cookie authenticates it
  for (const type of ["note", "session_update", "message"]) {
    native.addEventListener(type, (e) => window.native.push([e.lastEventId, e.type, e.data]));
  }
  let opened;
  const ours = new SessionEventStream({
    url,
    getToken,
    onEvent: (e) => window.ours.push([e.lastEventId, e.type, e.data]),
    onStateChange: (state) => state === "open" && opened(),
  });
  await Promise.all([
    new Promise((resolve) => { native.onopen = resolve; }),
    new Promise((resolve) => { opened = resolve; ours.start(); }),
  ]);
}"""
"""Open a native EventSource and our SessionEventStream on ``url``; resolve once both are open."""

PAUSE_PUBLISH_CAP_BYTES = 128_000_000
"""Give up on an eviction after this much was published to a paused reader."""


def test_live_events_appear_in_order_as_one_agent_message_and_tool_card(
    page: Page, server: ServerProcess
) -> None:
    # SC-8 (dispatched as they arrive), SC-12; text is inserted as text, never HTML.
    session = RemoteSession.create(server.base_url, title="live")
    view = SessionPage(page, session).open()
    user = {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "Hi"}}
    session.publish("session_update", user)
    tool = {"sessionUpdate": "tool_call", "toolCallId": "c1", "title": "Read", "status": "pending"}
    session.publish("session_update", tool)
    session.publish(
        "session_update", {**tool, "sessionUpdate": "tool_call_update", "status": "completed"}
    )
    chunks = ["Hello ", "<img src=x onerror=alert(1)> ", "wörld 🙂"]
    last = session.say(*chunks)[-1]
    view.wait_for_id(last)
    assert view.log_ids() == list(range(1, last + 1))
    assert view.agent_text() == "".join(chunks)
    assert page.locator("#transcript img").count() == 0
    assert view.text("#transcript .msg-user .msg-text") == "Hi"
    expect(page.locator("#transcript .tool .tool-status")).to_have_text("completed")


OBJECT_MEMBER_NAMES = ("toString", "constructor", "__proto__", "hasOwnProperty", "valueOf")
"""Event types named like what every JavaScript object inherits from Object.prototype."""


def test_types_named_like_object_members_are_rows_and_never_break_the_page(
    page: Page, server: ServerProcess
) -> None:
    # SC-12: unknown types are shown raw, never fatal, also the names a plain object inherits:
    # a publisher must not break the page of every viewer (in the snapshot, or live).
    session = RemoteSession.create(server.base_url, title="object member names")
    console_errors: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            console_errors.append(message.text)

    page.on("console", on_console)
    in_snapshot = [session.publish(name, {name: name}) for name in OBJECT_MEMBER_NAMES]
    view = SessionPage(page, session).open()
    view.wait_for_id(in_snapshot[-1])
    live = [session.publish(name, {name: name}) for name in OBJECT_MEMBER_NAMES]
    after = session.say("after them")[-1]
    view.wait_for_id(after)
    assert view.log_ids() == [*in_snapshot, *live, after]
    rows = page.eval_on_selector_all(
        "#frame-log tbody tr[data-id]",
        "rows => rows.map(r => [r.dataset.type, r.className,"
        " r.querySelector('.type-name').textContent])",
    )
    names = [*OBJECT_MEMBER_NAMES, *OBJECT_MEMBER_NAMES]
    assert rows == [
        *([name, "row-event", name] for name in names),
        ["session_update", "row-event", "session_update"],
    ]
    assert view.agent_text() == "after them"
    view.expect_state("open")
    expect(page.locator("#notice")).to_be_hidden()  # no "Page error: …"
    assert not console_errors


def test_new_session_button_creates_an_owned_session_and_opens_its_page(
    page: Page, server: ServerProcess
) -> None:
    # POST /session with the login session + CSRF header (docs/protocol.md), then the page.
    SessionPage(page, RemoteSession(server.base_url, "")).login("/sessions/")
    page.fill("#new-session input[name=title]", "made in the browser")
    page.click("#new-session button")
    page.wait_for_url(re.compile(r".*/sessions/[0-9a-f-]{36}/$"))
    expect(page.locator("#state-badge")).to_have_attribute("data-state", "open")
    expect(page.locator(".session-ident h1")).to_have_text("made in the browser")
    page.goto(f"{server.base_url}/sessions/")
    expect(page.locator("table").get_by_text("made in the browser")).to_be_visible()


def test_start_demo_agent_button_streams_the_scripted_agent_once_at_a_time(
    page: Page, server: ServerProcess
) -> None:
    # The demo endpoint: one agent per session (409 for a second one).
    session = RemoteSession.create(server.base_url, title="Demo agent session")
    view = SessionPage(page, session).open()
    page.click("#demo")
    expect(page.locator("#transcript .tool")).to_have_attribute("data-status", "completed")
    expect(page.locator("#transcript .msg-agent .msg-text").first).to_contain_text(
        "Django is a high-level Python web framework", timeout=15_000
    )
    expect(page.locator("#demo")).to_have_text("Demo agent running")  # one at a time
    expect(page.locator("#demo")).to_be_disabled()
    view.wait_for_row(80, timeout_ms=15_000)  # the agent keeps typing, ~25 chunks/s
    ids = view.log_ids()
    assert ids == list(range(1, len(ids) + 1))
    screenshot(page, "session-page-live")


def test_drop_then_30_events_resume_with_last_event_id_each_id_once_in_order(
    page: Page, server: ServerProcess
) -> None:
    # SC-9 (Last-Event-ID exactly once, the last id seen), SC-13 (drop aborts), EB-7 replay.
    session = RemoteSession.create(server.base_url)
    view = SessionPage(page, session).open(install_clock=True)
    before = session.say(*(f"a{n} " for n in range(5)))
    view.wait_for_id(before[-1])
    view.freeze_clock()  # the reconnect timer cannot fire while we publish
    page.click("#drop")
    view.expect_state("reconnecting")
    during = session.say(*(f"b{n} " for n in range(30)))
    assert len(view.traffic.streams()) == 1
    view.advance_clock(5_000)
    view.wait_for_id(during[-1])
    streams = view.traffic.streams()
    assert len(streams) == 2
    assert streams[1].headers.get("last-event-id") == str(before[-1])
    assert streams[1].headers.get("x-event-epoch") == session.load()["epoch"]
    assert view.log_ids() == [*before, *during]
    expect(page.locator("#reconnects")).to_have_text("1")


def _restart_while_open(
    page: Page, server: ServerProcess
) -> tuple[RemoteSession, SessionPage, list[int]]:
    """Open a session page on ``server``, say three chunks, restart the server while the
    page streams and fire the page's pending reconnect; return what was said before."""
    session = RemoteSession.create(server.base_url)
    view = SessionPage(page, session).open(install_clock=True)
    before = session.say("one ", "two ", "three ")
    view.wait_for_id(before[-1])
    server.stop()
    view.expect_state("reconnecting")
    server.start()
    view.page.clock.fast_forward(60_000)  # fire the pending reconnect now
    return session, view, before


@memory_only(
    "a restarted memory-only server starts a new id sequence; with the durable and Redis "
    "backends it outlives the process (test_server_restart_resumes_without_resync_...)"
)
def test_server_restart_with_same_database_recovers_without_duplicate_rows(
    page: Page, start_server: Callable[..., ServerProcess]
) -> None:
    # EB-7 epoch reset after a restart (ids continue above the old ones), SC-12 resync:
    # what was shown stays, greyed and marked, the new history continues below (issue 25).
    session, view, before = _restart_while_open(page, start_server("serve"))
    expect(page.locator("#last-resync")).to_contain_text("view rebuilt", timeout=15_000)
    restarted = session.load()
    # The new sequence has issued nothing: the snapshot names no id (never one that was
    # only reserved, issue 26) and the page resumes just below the next id.
    assert restarted["lastEventId"] is None
    assert restarted["earliestAvailableId"] > max(before)
    # The connection panel shows the new epoch at once, and no cursor id: the position the
    # stream resumes from (earliestAvailableId - 1) was never issued (issue 30).
    expect(page.locator("#cursor")).to_have_text("none yet")
    expect(page.locator("#cursor")).to_have_attribute(
        "title", re.compile(rf"after position {restarted['earliestAvailableId'] - 1}$")
    )
    expect(page.locator("#epoch")).to_have_attribute("title", restarted["epoch"])
    after = session.say("four ", "five ")
    view.wait_for_id(after[-1])
    assert min(after) > max(before)
    snapshot = session.load()
    assert event_ids(snapshot["events"]) == after
    assert view.log_ids() == [*before, *after]
    assert view.agent_text() == "one two three four five "
    lost = page.locator("#transcript .marker-lost")
    expect(lost).to_contain_text(f"#{before[0]}–{before[-1]} no longer on the server")
    expect(page.locator("#transcript .msg-agent.stale")).to_have_count(1)
    expect(page.locator("#transcript .marker-truncated")).to_contain_text(f"#{after[0]}")
    expect(page.locator("#cursor")).to_have_text(str(after[-1]))


def test_server_restart_resumes_without_resync_or_duplicate_rows(
    page: Page, start_server: Callable[..., ServerProcess]
) -> None:
    # The durable backend (the default; its event log) and the Redis backend: the restarted
    # server serves the same ids and epoch (EB-7 resume).
    session, view, before = _restart_while_open(page, start_server("serve"))
    view.expect_state("open")
    after = session.say("four ", "five ")
    view.wait_for_id(after[-1])
    assert after == [before[-1] + 1, before[-1] + 2]
    assert view.log_ids() == [*before, *after]
    assert view.agent_text() == "one two three four five "
    expect(page.locator("#last-resync")).to_have_text("—")


def test_ring_overflow_while_disconnected_rebuilds_view_equal_to_snapshot(
    page: Page, server: ServerProcess
) -> None:
    # SC-12 state_resync_required (EB-7 ring_evicted): continued from GET /session/<id>,
    # what was shown stays (greyed) above the span the ring lost (issue 25).
    session = RemoteSession.create(server.base_url, ringSize=5)
    view = SessionPage(page, session).open(install_clock=True)
    view.wait_for_id(session.say("x0 ", "x1 ", "x2 ")[-1])
    view.freeze_clock()
    page.click("#drop")
    view.expect_state("reconnecting")
    session.say(*(f"y{n} " for n in range(20)))
    view.advance_clock(5_000)
    expect(page.locator("#last-resync")).to_contain_text("ring_evicted")
    expect(page.locator("#last-resync")).to_contain_text("view rebuilt")
    snapshot = session.load()
    assert event_ids(snapshot["events"]) == list(range(19, 24))
    view.wait_for_id(23)
    assert view.log_ids() == [1, 2, 3, *range(19, 24)]
    assert view.agent_text() == "x0 x1 x2 y15 y16 y17 y18 y19 "
    expect(page.locator("#transcript .marker-lost")).to_have_text("#4–18 no longer on the server")
    expect(page.locator("#frame-log tbody tr.row-stale[data-id]")).to_have_count(3)
    live = session.say("z ")[-1]
    view.wait_for_id(live)
    assert view.log_ids() == [1, 2, 3, *range(19, 24), live]
    assert view.log_types().count("state_resync_required") == 1


def test_token_expiry_gets_401_then_one_fresh_token_and_continues_without_loss(
    page: Page, start_server: Callable[..., ServerProcess]
) -> None:
    # SC-10: 401 → a fresh token once, never the rejected one again; no token loop.
    server = start_server("serve", QWENWEB_TOKEN_LIFETIME_S="4")
    session = RemoteSession.create(server.base_url)
    view = SessionPage(page, session).open(install_clock=True)
    view.wait_for_id(session.say("p0 ", "p1 ")[-1])
    first_token = view.traffic.streams()[0].headers["authorization"]
    view.freeze_clock()
    page.click("#drop")
    expired = wait_for(
        lambda: request_json(
            "GET", f"{server.base_url}/session/{session.id}", token=first_token.split()[1]
        )[0] == 401,
        timeout_s=10,
        interval_s=0.2,
    )  # fmt: skip
    assert expired, "the page's token did not expire"
    during = session.say("q0 ", "q1 ", "q2 ")
    view.advance_clock(5_000)
    view.wait_for_id(during[-1])
    streams = view.traffic.streams()
    assert [s.status for s in streams] == [200, 401, 200]
    assert streams[1].headers["authorization"] == first_token
    assert streams[2].headers["authorization"] != first_token
    assert streams[2].headers["last-event-id"] == "2"
    assert len(view.traffic.token_requests()) == 2
    assert view.log_ids() == [1, 2, *during]
    expect(page.locator("#tokens")).to_have_text("2")


def test_session_closed_answers_204_page_shows_ended_and_sends_no_more_requests(
    page: Page, server: ServerProcess
) -> None:
    # SC-10 / EB-15: 204 stops for good.
    session = RemoteSession.create(server.base_url, title="closing")
    view = SessionPage(page, session).open(install_clock=True)
    view.wait_for_id(session.say("bye ")[-1])
    session.close()
    expect(page.locator("#transcript .marker-closed")).to_contain_text("Session closed")
    view.expect_state("reconnecting")
    view.page.clock.fast_forward(5_000)
    view.expect_state("ended")
    expect(page.locator("#banner")).to_contain_text("Session ended")
    streams_when_ended = len(view.traffic.streams())
    assert view.traffic.streams()[-1].status == 204
    view.page.clock.fast_forward(10 * 60_000)  # any timer left would fire now
    page.evaluate("fetch('/capabilities').then(r => r.status)")  # a marker after them
    assert len(view.traffic.streams()) == streams_when_ended
    assert page.locator("#drop").is_disabled()
    screenshot(page, "session-page-ended")


# serial: publishes tens of MiB of random text, gzipped by the server and inflated by
# Chromium, until the paused page's reader is evicted: CPU-bound on both sides. Beside two
# other pytest-xdist workers it ran into the 60 s test timeout (13-28 s alone);
# it is also the load that slows the tests beside it.
# The page on the production entry point only: each server's own flow control (granian,
# daphne, uvicorn, runserver, and plain daphne as the control that proves the check can
# fail) is tests/e2e/test_backpressure.py's matrix, with raw readers.
@pytest.mark.serial
def test_pause_reading_with_small_max_queued_warns_then_evicts_then_recovers_with_cursor(
    page: Page, start_server: Callable[..., ServerProcess]
) -> None:
    # EB-21 real TCP backpressure → EB-4 slow_client_warning → EB-5 client_evicted;
    # SC-12: the page reconnects with its cursor and replay fills the gap.
    server = start_server("serve")
    session = RemoteSession.create(server.base_url, title="slow reader", ringSize=32)
    view = SessionPage(page, session).open(install_clock=True)
    page.fill("#max-queued", "16")
    page.click("#max-queued-form button")
    expect(page.locator("#max-queued-current")).to_have_text("16")
    view.expect_state("open")
    assert view.traffic.streams()[-1].query == "maxQueued=16"
    first = session.say("before ")[-1]
    view.wait_for_id(first)
    page.click("#pause")
    expect(page.locator("#paused-chip")).to_be_visible()
    # 16 frames of ~120 KB come close to the 2 MiB byte cap: which cap trips depends on
    # the pace, since both wait OVERFLOW_GRACE_S but the byte cap is hard at twice itself
    # (EB-3).
    # The kernel's socket buffers (here up to 32 MiB + 4 MiB) and Chromium's fill first.
    # Random text, a new one per event: the page's stream is gzipped (EB-17), and a run of
    # one letter would shrink a thousandfold before it reached the socket.
    blob_chars = 120_000
    published = [first]
    while session.subscriber_count() > 0 and len(published) * blob_chars < PAUSE_PUBLISH_CAP_BYTES:
        published += [
            session.publish("note", {"n": n, "blob": secrets.token_urlsafe(blob_chars * 3 // 4)})
            for n in range(16)
        ]
    assert session.subscriber_count() == 0, "the server never evicted the paused reader"
    page.click("#pause")  # resume: the backlog, the warning, then the eviction
    expect(page.locator("#last-evicted")).to_contain_text("overflow", timeout=20_000)
    expect(page.locator("#last-warning")).to_contain_text("queue")
    screenshot(page, "session-page-evicted")
    dropped_after = number_in(view.text("#last-evicted"), r"after #(\d+)")
    view.page.clock.fast_forward(5_000)  # the reconnect after the eviction
    view.wait_for_id(published[-1], timeout_ms=20_000)
    assert view.log_ids() == published
    types = view.log_types()
    assert types.index("slow_client_warning") < types.index("client_evicted")
    assert view.traffic.streams()[-1].headers["last-event-id"] == str(dropped_after - 1)


def test_native_eventsource_yields_same_ids_and_data_as_our_parser(
    page: Page, server: ServerProcess
) -> None:
    # HTML §9.2 EventSource (login cookie) vs. createParser + SessionEventStream (SC-1..SC-8).
    session = RemoteSession.create(server.base_url)
    SessionPage(page, session).open()
    urls = {"url": f"/session/{session.id}/events", "tokenUrl": f"/session/{session.id}/token"}
    page.evaluate(OPEN_NATIVE_AND_OURS_JS, urls)
    assert wait_for(lambda: session.subscriber_count() == 3, timeout_s=5)
    payloads = [
        ("note", {"text": "naïve café 漢字 🙂", "crlf": "a\r\nb\rc\nd"}),
        ("session_update", agent_chunk("multi\nline\n\n")),
        ("message", {"long": "é" * 50_000}),  # 100 KB of 2-byte characters across chunks (SC-1)
        *(("note", {"n": n}) for n in range(17)),
    ]
    ids = [session.publish(kind, data) for kind, data in payloads]
    page.wait_for_function(
        "n => window.native.length >= n && window.ours.length >= n", arg=len(ids), timeout=10_000
    )
    native = page.evaluate("window.native")
    ours = page.evaluate("window.ours")
    assert ours == native
    assert [int(event_id) for event_id, _, _ in ours] == ids
    assert [json.loads(data)["data"] for _, _, data in ours] == [data for _, data in payloads]
