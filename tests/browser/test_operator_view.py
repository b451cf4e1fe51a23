"""The session page as an operator reads an agent (issue 30), in Debian's Chromium.

Turns and tool calls (duration from the server's timestamps, outcome, failed ones marked),
the search in the transcript, `#e<id>` links, a frame's JSON, true empty states, the debug
tools apart and off once the session has ended, and the page at 390 px (no sideways
scroll, axe-core clean live and ended).
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import RemoteSession, SessionPage, screenshot
from tests.browser.test_page_ux import PHONE, axe_violations, document_width
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.browser, pytest.mark.e2e]


def tool(update: str, call_id: str, **fields: Any) -> dict[str, Any]:
    """An ACP ``tool_call`` / ``tool_call_update`` session update."""
    return {"sessionUpdate": update, "toolCallId": call_id, **fields}


def play_turn(session: RemoteSession) -> dict[str, int]:
    """One turn: a prompt, a read that completes, a command that fails, an answer, the end.
    Returns the ids by name."""
    user = {
        "sessionUpdate": "user_message_chunk",
        "content": {"type": "text", "text": "Find the needle."},
    }
    ids = {"prompt": session.publish("session_update", user)}
    for name, update in [
        ("read", tool("tool_call", "c1", title="Read hay.txt", kind="read", status="in_progress")),
        ("read_done", tool("tool_call_update", "c1", status="completed")),
        ("run", tool("tool_call", "c2", title="Run grep", kind="execute", status="in_progress")),
        ("run_failed", tool("tool_call_update", "c2", status="failed")),
    ]:
        ids[name] = session.publish("session_update", update)
    ids["answer"] = session.say("The needle is ", "in the haystack.")[-1]
    ids["end"] = session.publish("turn_complete", {"turn": 1, "stopReason": "end_turn"})
    return ids


def open_and_play_turn(
    page: Page, server: ServerProcess, title: str
) -> tuple[RemoteSession, SessionPage, dict[str, int]]:
    """A new session titled ``title``, its page open in ``page``, then one turn played
    (:func:`play_turn`): the session, its page and the turn's ids (not yet drawn)."""
    session = RemoteSession.create(server.base_url, title=title)
    view = SessionPage(page, session).open()
    return session, view, play_turn(session)


def shown_ms(text: str) -> float:
    """The milliseconds of a duration as the page writes it ("350 ms", "1.2 s", "42 s")."""
    match = re.fullmatch(r"(\d+) ms|(\d+(?:\.\d)?) s", text)
    assert match, text
    return float(match.group(1)) if match.group(1) else float(match.group(2)) * 1000


def server_times(session: RemoteSession) -> dict[int, int]:
    return {e["id"]: e["_meta"]["serverTimestamp"] for e in session.load()["events"] if e.get("id")}


def test_a_turn_shows_each_tool_call_with_its_duration_and_outcome(
    page: Page, server: ServerProcess
) -> None:
    session, view, ids = open_and_play_turn(page, server, "tool calls")
    view.wait_for_id(ids["end"])
    times = server_times(session)
    turn = page.locator("#transcript .turn")
    expect(turn).to_have_count(1)
    expect(turn).to_have_attribute("data-complete", "true")
    expect(turn.locator(".turn-title")).to_have_text("Turn 1")
    expect(turn.locator(".turn-meta")).to_contain_text("end turn")
    read = page.locator('.tool[data-tool-call-id="c1"]')
    run = page.locator('.tool[data-tool-call-id="c2"]')
    expect(read).to_have_attribute("data-outcome", "completed")
    expect(read.locator(".tool-status")).to_have_text("completed")
    expect(run).to_have_attribute("data-outcome", "failed")
    expect(run.locator(".tool-status")).to_have_text("✕ failed")
    for card, start, end in [(read, "read", "read_done"), (run, "run", "run_failed")]:
        took = times[ids[end]] - times[ids[start]]
        assert abs(shown_ms(card.locator(".tool-duration").inner_text()) - took) <= 50, took
    screenshot(page, "session-page-turns")


def test_search_finds_a_word_of_the_transcript_and_steps_through_its_matches(
    page: Page, server: ServerProcess
) -> None:
    _, view, ids = open_and_play_turn(page, server, "search")
    view.wait_for_id(ids["end"])
    query = page.locator("#transcript-query")
    query.fill("NEEDLE")
    count = page.locator("#search-count")
    expect(count).to_have_text("1 of 2")  # the prompt's and the answer's, case-insensitive
    current = "() => { const [r] = CSS.highlights.get('transcript-current'); return r.toString(); }"
    assert page.evaluate(current) == "needle"
    assert page.evaluate("CSS.highlights.get('transcript-match').size") == 2
    query.press("Enter")
    expect(count).to_have_text("2 of 2")
    query.press("Enter")
    expect(count).to_have_text("1 of 2")  # wraps around
    query.press("Shift+Enter")
    expect(count).to_have_text("2 of 2")
    query.fill("no such word")
    expect(count).to_have_text("no match")
    assert page.evaluate("CSS.highlights.get('transcript-match').size") == 0


VISIBLE_IN = """([selector, box]) => {
  const node = document.querySelector(selector);
  const area = document.querySelector(box).getBoundingClientRect();
  if (node === null) return false;
  const r = node.getBoundingClientRect();
  return r.bottom > area.top && r.top < area.bottom;
}"""


def test_an_event_link_in_the_url_scrolls_to_the_event_and_highlights_it(
    page: Page, server: ServerProcess
) -> None:
    session, view, ids = open_and_play_turn(page, server, "links")
    last = session.say(*[f"line {n}\n" for n in range(150)])[-1]  # both views scroll
    view.wait_for_id(last)
    target = ids["read_done"]
    page.goto(f"{session.page_url}#e{target}")  # the same document: a hashchange
    row = f'#frame-log tr[data-id="{target}"]'
    expect(page.locator(row)).to_have_class(re.compile(r"\bis-target\b"))
    card = page.locator('#transcript .tool[data-tool-call-id="c1"]')
    expect(card).to_have_class(re.compile(r"\bis-target\b"))
    page.wait_for_function(VISIBLE_IN, arg=[row, "#log-scroll"])
    page.wait_for_function(VISIBLE_IN, arg=["#transcript .is-target", "#transcript"])
    page.reload()  # a page opened on such a URL shows the event once it is drawn
    view.expect_state("open")
    expect(page.locator(row)).to_have_class(re.compile(r"\bis-target\b"))
    page.wait_for_function(VISIBLE_IN, arg=[row, "#log-scroll"])
    page.locator(f'#frame-log tr[data-id="{ids["prompt"]}"] td:first-child a').click()
    expect(page).to_have_url(re.compile(rf"#e{ids['prompt']}$"))
    expect(page.locator("#transcript .msg-user")).to_have_class(re.compile(r"\bis-target\b"))
    page.goto(f"{session.page_url}#e{last + 1000}")
    missing = f"Event #{last + 1000} is not shown on this page"
    expect(page.locator("#notice")).to_contain_text(missing)


def test_a_frames_json_opens_from_the_frame_log_and_the_transcript(
    page: Page, server: ServerProcess
) -> None:
    session, view, ids = open_and_play_turn(page, server, "json")
    blob = secrets.token_urlsafe(24 * 1024)  # above what the page keeps: fetched
    big = session.publish("note", {"blob": blob})
    view.wait_for_id(big)
    dialog = page.locator("#event-json")
    page.locator(f'#frame-log tr[data-id="{ids["run_failed"]}"] button.type-name').click()
    expect(dialog).to_be_visible()
    shown = json.loads(dialog.locator(".json-body").inner_text())
    assert shown["id"] == ids["run_failed"]
    assert shown["data"] == tool("tool_call_update", "c2", status="failed")
    page.keyboard.press("Escape")
    expect(dialog).to_be_hidden()
    page.locator(f'#frame-log tr[data-id="{big}"] button.type-name').click()
    expect(dialog.locator(".json-body")).to_contain_text(blob)
    dialog.locator("[data-close]").click()
    page.locator('#transcript .tool[data-tool-call-id="c2"] .btn-json').click()
    shown = json.loads(dialog.locator(".json-body").inner_text())
    assert [e["id"] for e in shown] == [ids["run"], ids["run_failed"]]
    assert not axe_violations(page), "the open dialog"


def test_an_empty_transcript_says_what_the_session_holds(page: Page, server: ServerProcess) -> None:
    session = RemoteSession.create(server.base_url, title="notes only")
    view = SessionPage(page, session).open()
    empty = page.locator("#transcript .transcript-empty")
    expect(empty).to_have_text("No events yet. Start the demo agent, or publish to this session.")
    last = 0
    for n in range(12):
        last = session.publish("note", {"n": n})
    view.wait_for_id(last)
    expect(empty).to_have_text(
        "No agent messages or tool calls yet: 12 events of other types (note ×12); see Frames."
    )
    page.reload()
    expect(empty).to_contain_text("12 events of other types")
    other = RemoteSession.create(server.base_url, title="closed empty")
    other.close()
    page.goto(other.page_url)
    expect(page.locator("#transcript .marker-closed").first).to_contain_text("Session closed")
    expect(page.locator("#transcript")).not_to_contain_text("Start the demo agent")


def debug_controls_disabled(page: Page) -> None:
    for control in (
        "#demo", "#provoke", "#provoke-stop", "#publish-type", "#publish-data",
        "#publish-form button[type=submit]",
    ):  # fmt: skip
        expect(page.locator(control)).to_be_disabled()
    expect(page.locator("#debug-ended")).to_be_visible()


def test_debug_tools_sit_apart_and_are_off_once_the_session_has_ended(
    page: Page, server: ServerProcess
) -> None:
    session = RemoteSession.create(server.base_url, title="debug tools")
    view = SessionPage(page, session).open()
    for control in ("#demo", "#publish-form", "#provoke"):
        expect(page.locator(f".pane-debug {control}")).to_have_count(1)
    expect(page.locator(".session-bar #demo")).to_have_count(0)
    expect(page.locator("#demo")).to_be_enabled()
    expect(page.locator(".subs-note")).to_contain_text("its client may reconnect")
    session.close()
    view.expect_state("ended")
    debug_controls_disabled(page)
    page.reload()  # opened on an ended session
    expect(page.locator("#state-badge")).to_have_attribute("data-state", "ended")
    debug_controls_disabled(page)
    assert "stopped after" not in page.locator("body").inner_text().lower()


@pytest.mark.timeout(180)  # two axe-core runs, slow on a loaded machine: a liveness bound only
@pytest.mark.parametrize("width", [PHONE["width"], 1440])
def test_session_page_is_axe_clean_and_does_not_scroll_sideways(
    page: Page, server: ServerProcess, width: int
) -> None:
    page.set_viewport_size({"width": width, "height": PHONE["height"] if width < 1000 else 900})
    session, view, _ = open_and_play_turn(page, server, "A session page on a phone and a desk")
    long_note = "a note without any space " * 3 + "x" * 300
    last = session.publish("note", {"text": long_note})
    view.wait_for_id(last)
    expect(page.locator("#subscribers tbody tr")).to_have_count(1)  # this page's subscriber
    page.locator("#transcript-query").fill("needle")
    assert document_width(page) <= width
    first_cells = page.eval_on_selector_all(
        "#frame-log tbody tr[data-id]", "rows => rows.map(r => r.cells[0].textContent)"
    )
    assert first_cells[-1] == str(last)  # still a table, one row per frame, the id first
    log_display = "getComputedStyle(document.getElementById('frame-log')).display"
    assert page.evaluate(log_display) == "table"
    subs = page.evaluate(
        "(e => [e.scrollWidth, e.clientWidth])(document.querySelector('.subs-scroll'))"
    )
    if width < 1000:  # cards on a phone; a wide screen keeps the table (scrolled if it must)
        assert subs[0] <= subs[1], f"the subscribers scroll sideways inside their box: {subs}"
    found = {"live": axe_violations(page)}
    session.close()
    view.expect_state("ended")
    assert document_width(page) <= width
    found["ended"] = axe_violations(page)
    bad = {name: v for name, v in found.items() if v}
    assert not bad, json.dumps(bad, indent=1)
