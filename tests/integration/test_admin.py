"""The admin through Django's test client, with buses on a real "server loop" thread.

The admin's views are synchronous; in production they run in a worker thread of the
server while the buses live on the server's event loop (EB-11). Here the loop runs in a
thread of its own (:func:`server_loop`) and the test client calls the views from the main
thread, so every live number and every action crosses threads exactly as in production.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from sessions.admin import format_bytes
from sessions.backends import get_backend
from sessions.backends.base import LiveSession, SessionClosedError
from sessions.bus import BusStats, Subscription
from sessions.models import AgentSession, SubscriberConnection, SubscriberIncident
from sessions.ops.records import Batch, write_batch
from tests.integration.conftest import publish_here
from tests.support.backend import USING_REDIS, close_backend_on, memory_only

pytestmark = pytest.mark.django_db(transaction=True)

T = TypeVar("T")
WAIT_S = 5.0
CHANGELIST = reverse("admin:agent_sessions_agentsession_changelist")


@pytest.fixture
def server_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in its own thread, standing in for the server's."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="server-loop", daemon=True)
    thread.start()
    yield loop
    close_backend_on(loop, WAIT_S)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(WAIT_S)
    loop.close()


def on_loop(loop: asyncio.AbstractEventLoop, function: Callable[[], T]) -> T:
    """Run ``function()`` on the server loop and return its result (bounded)."""

    async def call() -> T:
        return function()

    return asyncio.run_coroutine_threadsafe(call(), loop).result(WAIT_S)


def await_on_loop(loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` on the server loop and return its result (bounded)."""
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result(WAIT_S)


def load(loop: asyncio.AbstractEventLoop, session_id: str) -> LiveSession:
    """Build the session's bus on the server loop (which the runtime then captures)."""
    return await_on_loop(loop, get_backend().get_live_session(session_id))


def stats(loop: asyncio.AbstractEventLoop, live: LiveSession) -> BusStats:
    return on_loop(loop, live.bus.stats)


def session(**fields: Any) -> AgentSession:
    return AgentSession.objects.create(**fields)


def cell(html: str, session_id: str, field: str) -> str:
    """The text of column ``field`` in the changelist row of ``session_id``."""
    row = next(r for r in html.split("<tr") if f'value="{session_id}"' in r)
    match = re.search(rf'<td class="field-{field}[^"]*">(.*?)</td>', row, re.S)
    assert match, f"no column {field} in {row}"
    return re.sub(r"<[^>]+>", "", match.group(1)).strip()


# -- the session list ------------------------------------------------------------------------


@pytest.mark.usefixtures("strict_caps")
def test_session_list_shows_the_numbers_of_the_bus_stats(server_loop, staff):
    # EB-10: live numbers come from stats(), read on the server loop
    sid = session(title="busy").id
    live = load(server_loop, sid)

    async def traffic() -> list[Subscription]:
        kept = [live.bus.subscribe(), live.bus.subscribe()]
        slow = live.bus.subscribe(max_queued=2)  # warned at 2, evicted at the 3rd
        for n in range(5):
            await publish_here(live, {"type": "step", "data": {"n": n}})
        assert slow.evicted
        return kept

    await_on_loop(server_loop, traffic())
    html = staff.get(CHANGELIST).content.decode()
    current = stats(server_loop, live)
    assert cell(html, sid, "source") == "live"
    assert cell(html, sid, "subscribers") == str(current.subscriber_count) == "2"
    assert cell(html, sid, "last_event") == str(current.last_event_id) == "5"
    assert cell(html, sid, "published") == str(current.published) == "5"
    assert cell(html, sid, "warnings") == str(current.slow_client_warnings) == "1"
    assert cell(html, sid, "evicted") == str(sum(current.evictions.values())) == "1"
    assert cell(html, sid, "ring") == f"5 / {current.ring_size:,} (0%)"


def test_session_not_loaded_shows_its_saved_counters(staff):
    sid = session(last_event_id=40, events_published=40, slow_client_warnings=3, evictions=2).id
    html = staff.get(CHANGELIST).content.decode()
    assert cell(html, sid, "source") == "saved"
    values = [cell(html, sid, f) for f in ("subscribers", "last_event", "warnings", "evicted")]
    assert values == ["0", "40", "3", "2"]


def test_session_list_filters_by_status_and_evictions_and_searches(staff):
    evicted = session(title="alpha", evictions=1).id
    recorded = session(title="beta").id
    closed = session(title="gamma", status=AgentSession.Status.CLOSED).id
    _incident(recorded, "client_evicted")
    _incident(closed, "slow_client_warning")

    def listed(**query: str) -> set[str]:
        html = staff.get(CHANGELIST, query).content.decode()
        return {sid for sid in (evicted, recorded, closed) if f'value="{sid}"' in html}

    assert listed(status__exact="closed") == {closed}
    assert listed(evictions="yes") == {evicted, recorded}
    assert listed(evictions="no") == {closed}
    assert listed(q="gam") == {closed}


# -- the session page -------------------------------------------------------------------------


def test_session_page_shows_connections_and_incidents_newest_first_with_payloads(staff):
    sid = session(title="watched").id
    older, newer = _incident(sid, "slow_client_warning"), _incident(sid, "client_evicted")
    html = staff.get(reverse("admin:agent_sessions_agentsession_change", args=[sid])).content
    text = html.decode()
    newer_at, older_at = (text.find(i.payload.replace('"', "&quot;")) for i in (newer, older))
    assert 0 < newer_at < older_at  # both payloads, exactly, newest first
    assert "tab-client_evicted" in text  # the connection inline
    assert "not loaded in this process" in text


def test_session_page_shows_the_live_numbers_of_a_loaded_bus(server_loop, staff):
    sid = session().id
    live = load(server_loop, sid)
    await_on_loop(server_loop, publish_here(live, {"type": "step", "data": None}))
    html = staff.get(reverse("admin:agent_sessions_agentsession_change", args=[sid])).content
    assert f"<td>{live.bus.epoch}</td>".encode() in html
    assert b"<th>events published</th><td>1</td>" in html
    # The saved counters the live numbers show are not beside them (a saved 0, a live 1).
    assert b"field-events_published" not in html
    assert b"field-event_id_reserved" in html


def test_session_page_is_read_only_no_save_no_delete_and_a_post_is_refused(staff):
    sid = session(title="watched").id
    url = reverse("admin:agent_sessions_agentsession_change", args=[sid])
    html = staff.get(url).content.decode()
    assert 'name="_save"' not in html
    assert "deletelink" not in html
    assert staff.post(url, {"title": "renamed"}).status_code == 403
    assert AgentSession.objects.get(pk=sid).title == "watched"


def test_session_page_times_are_to_the_second_and_sizes_in_kib(staff):
    sid = session(title="sized").id
    incident = _incident(sid, "client_evicted")
    SubscriberConnection.objects.filter(pk=incident.connection_id).update(bytes_sent=65_576_008)
    html = staff.get(reverse("admin:agent_sessions_agentsession_change", args=[sid])).content
    assert b"62.54 MiB" in html
    assert b'title="65,576,008 bytes"' in html
    created = AgentSession.objects.get(pk=sid).created_at
    assert created.strftime("%Y-%m-%d %H:%M:%S").encode() in html


def test_byte_counts_read_in_iec_units():
    assert [format_bytes(n) for n in (None, 0, 1023, 1024, 65_576_008, 3 * 1024**3)] == [
        "—", "0 B", "1023 B", "1.0 KiB", "62.54 MiB", "3.00 GiB",
    ]  # fmt: skip


# -- actions ----------------------------------------------------------------------------------


def test_close_action_closes_the_bus_on_the_server_loop(server_loop, staff):
    sid = session().id
    live = load(server_loop, sid)
    subscription = on_loop(server_loop, live.bus.subscribe)
    response = staff.post(CHANGELIST, {"action": "close_sessions", "_selected_action": [sid]})
    assert response.status_code == 302
    row = AgentSession.objects.get(pk=sid)
    assert (row.status, row.closed_at is not None) == ("closed", True)
    assert on_loop(server_loop, lambda: (live.bus.closed, subscription.end_reason)) == (
        True,
        "closed",
    )
    with pytest.raises(SessionClosedError):
        load(server_loop, sid)
    if not USING_REDIS:  # (a closed Redis mirror is unloaded later, with the idle ones)
        assert get_backend().registry.get(sid) is None


@memory_only(
    "with no server loop in the process the action closes the row alone; with Redis it "
    "refuses (test_redis_operators.py: ..._refuse_rather_than_close_only_the_row)"
)
def test_close_action_on_a_session_not_loaded_marks_its_row_closed(staff):
    sid = session().id
    staff.post(CHANGELIST, {"action": "close_sessions", "_selected_action": [sid]})
    assert AgentSession.objects.get(pk=sid).status == "closed"


def test_disconnect_action_ends_every_subscriber_and_keeps_the_session_open(server_loop, staff):
    sid = session().id
    live = load(server_loop, sid)
    subscriptions = on_loop(server_loop, lambda: [live.bus.subscribe() for _ in range(3)])
    response = staff.post(
        CHANGELIST, {"action": "disconnect_all_subscribers", "_selected_action": [sid]}, follow=True
    )
    assert b"Disconnected 3 subscriber(s)" in response.content  # (Redis: "in this process")
    assert stats(server_loop, live).subscriber_count == 0
    assert [s.end_reason for s in subscriptions] == ["disconnected"] * 3
    assert not live.bus.closed
    assert AgentSession.objects.get(pk=sid).status == "open"


def test_actions_are_refused_to_non_staff(server_loop):
    sid = session().id
    live = load(server_loop, sid)
    on_loop(server_loop, live.bus.subscribe)
    user = get_user_model().objects.create_user("mallory", password="pw")
    client = Client()
    client.force_login(user)
    for action in ("close_sessions", "disconnect_all_subscribers"):
        response = client.post(CHANGELIST, {"action": action, "_selected_action": [sid]})
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login"))
    assert AgentSession.objects.get(pk=sid).status == "open"
    assert stats(server_loop, live).subscriber_count == 1


def test_actions_need_the_change_permission(server_loop):
    sid = session().id
    live = load(server_loop, sid)
    on_loop(server_loop, live.bus.subscribe)
    viewer = get_user_model().objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_agentsession"))
    client = Client()
    client.force_login(viewer)
    assert b"close_sessions" not in client.get(CHANGELIST).content
    client.post(CHANGELIST, {"action": "close_sessions", "_selected_action": [sid]})
    client.post(CHANGELIST, {"action": "disconnect_all_subscribers", "_selected_action": [sid]})
    assert AgentSession.objects.get(pk=sid).status == "open"
    assert stats(server_loop, live).subscriber_count == 1


# -- helpers -----------------------------------------------------------------------------------


def _incident(session_id: str, kind: str) -> SubscriberIncident:
    """Write one connection and one incident of ``kind`` through the recorder's writer."""
    import uuid

    now = timezone.now()
    connection_id = uuid.uuid4()
    payload = f'{{"v":1,"type":"{kind}","data":{{"reason":"queue_overflow","n":"{uuid.uuid4()}"}}}}'
    write_batch(
        Batch(
            [
                {
                    "id": connection_id,
                    "session_id": session_id,
                    "auth": "token",
                    "user_id": None,
                    "subject": "t",
                    "client_addr": "127.0.0.1",
                    "user_agent": "",
                    "client_id": f"tab-{kind}",
                    "max_queued": 16,
                    "resumed_from": None,
                    "opened_at": now,
                    "closed_at": now,
                    "frames_sent": 1,
                    "bytes_sent": 10,
                    "end_reason": "client_evicted",
                    "end_detail": "",
                    "end_payload": "",
                }
            ],
            [
                {
                    "id": uuid.uuid4(),
                    "session_id": session_id,
                    "connection_id": connection_id,
                    "kind": kind,
                    "reason": "queue_overflow",
                    "event_id": 3,
                    "at": now,
                    "payload": payload,
                }
            ],
        )
    )
    return SubscriberIncident.objects.get(connection_id=connection_id)
