"""The page on the compacted snapshot and the gzipped stream (issue 28): the same transcript
as a raw load, one frame-log row ``a–b`` per compacted entry, a resume without gap or
duplicate, and a live stream the page reads through ``fetch``'s own decompression."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import RemoteSession, SessionPage
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

TRANSCRIPT = "#transcript"


def _turn(session: RemoteSession, words: list[str], call_id: str) -> list[int]:
    ids = [
        session.publish(
            "session_update",
            {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "read it"}},
        )
    ]
    ids.append(
        session.publish(
            "session_update",
            {
                "sessionUpdate": "tool_call",
                "toolCallId": call_id,
                "title": "Reading",
                "kind": "read",
                "status": "pending",
            },
        )
    )
    for status in ("in_progress", "completed"):
        ids.append(
            session.publish(
                "session_update",
                {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": status},
            )
        )
    ids += session.say(*words)
    ids.append(session.publish("turn_complete", {"stopReason": "end_turn"}))
    return ids  # fmt: skip


def test_compacted_load_draws_the_raw_transcript_and_resumes_without_gap(
    page: Page, server: ServerProcess
) -> None:
    session = RemoteSession.create(server.base_url, title="tokens")
    published = _turn(session, [f"w{n} " for n in range(40)], "c1")
    published += _turn(session, [f"v{n} " for n in range(30)], "c2")
    view = SessionPage(page, session).open(query="compact=1")  # the first load is raw unasked
    loads = [r for r in view.traffic.requests if r.path == f"/session/{session.id}"]
    assert [r.query for r in loads] == ["compact=1"]
    view.wait_for_id(published[-1])
    rows = page.eval_on_selector_all(
        "#frame-log tbody tr[data-id]", "rows => rows.map(r => r.cells[0].textContent)"
    )
    assert "5–44" in rows, rows  # the first turn's 40 chunks: one row
    assert view.log_ids() == published
    live = session.say("live ", "words")
    view.wait_for_id(live[-1])
    assert view.log_ids() == [*published, *live], "no gap, no duplicate after the snapshot"
    compacted_text = page.locator(TRANSCRIPT).inner_text()
    page.goto(f"{session.page_url}?compact=0")
    view.expect_state("open")
    view.wait_for_id(live[-1])
    raw_loads = [r for r in view.traffic.requests if r.path == f"/session/{session.id}"]
    assert raw_loads[-1].query == ""
    assert page.locator(TRANSCRIPT).inner_text() == compacted_text


def test_page_reads_the_gzipped_stream(page: Page, server: ServerProcess) -> None:
    session = RemoteSession.create(server.base_url, title="gzip")
    view = SessionPage(page, session).open()
    streams = view.traffic.streams()
    assert streams, "the page opened a stream"
    words = [f"t{n} " for n in range(20)]
    ids = session.say(*words)
    view.wait_for_id(ids[-1])
    expect(page.locator("#transcript .msg-agent .msg-text")).to_have_text("".join(words))
    encoding = page.evaluate(
        """async (url) => {
            const r = await fetch(url, {headers: {Accept: "text/event-stream"}});
            const e = r.headers.get("content-encoding");
            await r.body.cancel();
            return e;
        }""",
        f"/session/{session.id}/events",
    )
    assert encoding == "gzip"


_FRESH_TEXT = """() => [...document.querySelectorAll("#transcript > *, #transcript > .turn > *")]
    .filter(n => !n.matches(".turn, .turn-head, .stale, .marker-lost, .marker-truncated"))
    .map(n => n.innerText)"""
"""The transcript's entries (inside its turns or between them) that are not greyed and not a
lost/truncated marker; the turns' headings are left out (a turn cut by the lost span is
headed by where each view saw it start)."""


def test_a_resync_continues_from_the_compacted_snapshot_as_a_raw_load_draws_it(
    page: Page, server: ServerProcess
) -> None:
    # SC-12 with the compacted snapshot (issue 28): the resync asks compact=1, a run of
    # token events is one frame-log row a–b, the text below the lost span is the one a raw
    # load draws, and the stream resumes after it with no gap and no duplicate.
    session = RemoteSession.create(server.base_url, ringSize=60, title="resync")
    view = SessionPage(page, session).open(install_clock=True)
    first = _turn(session, [f"a{n} " for n in range(10)], "c1")
    view.wait_for_id(first[-1])
    view.freeze_clock()
    page.click("#drop")
    view.expect_state("reconnecting")
    loads_before = len(view.traffic.requests)
    later = _turn(session, [f"b{n} " for n in range(40)], "c2")
    later += _turn(session, [f"c{n} " for n in range(30)], "c3")
    view.advance_clock(5_000)
    expect(page.locator("#last-resync")).to_contain_text("view rebuilt", timeout=15_000)
    loads = [
        r.query for r in view.traffic.requests[loads_before:] if r.path == f"/session/{session.id}"
    ]
    assert loads == ["compact=1"], "the resync loads the compacted snapshot, once"
    view.wait_for_id(later[-1])
    earliest = later[-1] - 59  # the ring keeps the newest 60
    rows = page.eval_on_selector_all(
        "#frame-log tbody tr[data-id]:not(.row-stale)",
        "rows => rows.map(r => r.cells[0].textContent)",
    )
    assert any("–" in row for row in rows), rows  # the 30 words of turn 3: one row
    assert len(rows) < 60 / 2, rows
    assert view.log_ids() == [*first, *range(earliest, later[-1] + 1)]
    raw = SessionPage(page.context.new_page(), session)  # the same login, a raw first load
    raw.page.goto(f"{session.page_url}?compact=0")
    raw.expect_state("open")
    raw.wait_for_id(later[-1])
    assert raw.log_ids() == list(range(earliest, later[-1] + 1))
    assert page.evaluate(_FRESH_TEXT) == raw.page.evaluate(_FRESH_TEXT)
    raw.page.close()
    live = session.say("live ", "words")
    view.wait_for_id(live[-1])
    assert view.log_ids() == [*first, *range(earliest, live[-1] + 1)], "no gap, no duplicate"
    assert view.agent_text().endswith("c29 live words")
