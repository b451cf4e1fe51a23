"""Property tests over every request input.

Hypothesis generates ``Last-Event-ID``, ``X-Event-Epoch`` and ``Authorization`` header
values, ``?maxQueued`` values and publish bodies, and sends them through the real ASGI
application (``qwenweb.asgi``). Whatever comes in: never a 5xx, every 4xx is a JSON error
(EB-12 ... EB-15, docs/protocol.md "Endpoints"), each valid value means exactly what the
protocol says, and a subscriber streaming the same session all along (the *watcher*)
receives exactly the events that were accepted, in order, and nothing else.

Header values are bytes in ASGI. The strategies produce arbitrary bytes, UTF-8 and
latin-1 text (control characters, NUL, non-ASCII included); only values no HTTP/1.1
server can deliver to the application are left out: a header value containing CR or LF
(the line would end there), a request target containing whitespace.

Hypothesis runs each test's examples synchronously; every example drives the
application on one event loop owned by the test (:class:`Harness`), bounded by
``EXAMPLE_WAIT_S``. One session (ring of ``RING`` events) and one watcher per test.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any, TypeVar
from urllib.parse import quote

import pytest
from asgiref.testing import ApplicationCommunicator
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from qwenweb.asgi import application
from sessions.auth import issue_token
from sessions.backends import get_backend
from sessions.models import AgentSession
from tests.integration.conftest import (
    WAIT_S,
    Response,
    Stream,
    assert_error,
    bearer,
    call,
    http_scope,
)

pytestmark = [pytest.mark.django_db(transaction=True)]

_T = TypeVar("_T")

RING = 32
SEED_EVENTS = 40  # more than RING: the ring has evicted ids 1 ... 8
EXAMPLE_WAIT_S = 20.0
MAX_SAFE_INTEGER = 2**53 - 1
RESERVED_TYPES = frozenset(
    {"slow_client_warning", "client_evicted", "state_resync_required", "replay_complete",
     "stream_error", "history_truncated", "session_closed"}
)  # fmt: skip
"""Types of frames the server makes: a publisher may not use them (SC-12)."""

FUZZ = settings(
    max_examples=300,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# -- the harness: one loop, one session, one watcher per test ------------------------------


class Harness:
    """Drive the application on one event loop; keep the session's accepted events."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.session_id = ""
        self.accepted: list[dict[str, Any]] = []
        self.watcher: Stream | None = None
        self.epoch = ""
        self._communicators: list[ApplicationCommunicator] = []
        self._checked = 0

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the harness's loop, bounded by ``EXAMPLE_WAIT_S``."""

        async def bounded() -> _T:
            async with asyncio.timeout(EXAMPLE_WAIT_S):
                return await coro

        return self.loop.run_until_complete(bounded())

    @property
    def last_id(self) -> int:
        return int(self.accepted[-1]["id"]) if self.accepted else 0

    async def start(self) -> None:
        row = await AgentSession.objects.acreate(ring_size=RING)
        self.session_id = row.id
        self.read_token = issue_token(row.id, ["read"])
        self.publish_token = issue_token(row.id, ["publish"])
        self.watcher = await self.open({}, "maxQueued=2048")
        assert self.watcher.status == 200
        self.epoch = self.watcher.headers["x-event-epoch"]
        for n in range(SEED_EVENTS):
            await self.publish_json({"type": "seed", "data": n})

    async def stop(self) -> None:
        for communicator in self._communicators:
            if not communicator.future.done():
                await communicator.send_input({"type": "http.disconnect"})
            await communicator.wait(WAIT_S)

    # requests

    async def open(
        self, headers: Mapping[str, bytes | str], query: str = "", *, auth: bool = True
    ) -> Stream:
        """Open ``GET /session/<id>/events`` with a read token (unless ``auth`` is False)."""
        auth_headers = list(bearer(self.read_token).items()) if auth else []
        all_headers: list[tuple[str, str | bytes]] = [*auth_headers, *headers.items()]
        scope = http_scope("GET", f"/session/{self.session_id}/events", all_headers, query)
        communicator = ApplicationCommunicator(application, scope)
        self._communicators.append(communicator)
        await communicator.send_input({"type": "http.request", "body": b"", "more_body": False})
        return await Stream(communicator).read_start()

    async def publish_raw(
        self, body: bytes, headers: Mapping[str, str | bytes] | None = None
    ) -> Response:
        """POST ``body`` to the session; record the event if accepted (status 200)."""
        if headers is None:
            headers = {**bearer(self.publish_token), "content-type": "application/json"}
        response = await call(
            "POST", f"/session/{self.session_id}/events", headers=list(headers.items()), body=body
        )
        assert response.status < 500, response.body
        if response.status == 200:
            sent = json.loads(body)
            self.accepted.append({"id": response.json()["id"], **sent})
            assert response.json()["id"] == len(self.accepted)  # ids 1, 2, 3 ... (EB-2)
        return response

    async def publish_json(self, event: dict[str, Any]) -> int:
        response = await self.publish_raw(json.dumps(event).encode())
        assert response.status == 200, response.body
        return int(response.json()["id"])

    # checks

    async def check_watcher(self) -> None:
        """The watcher got exactly the accepted events, in order, and nothing else.

        Checks the events that arrived since the last call (each example adds a few).
        """
        watcher = self.watcher
        assert watcher is not None
        count = len(self.accepted)
        await watcher.read_until(lambda s: len(s.events) >= count)
        assert len(watcher.events) == count, [e.type for e in watcher.events[count:]]
        new = zip(watcher.events[self._checked :], self.accepted[self._checked :], strict=True)
        for sse, sent in new:
            frame = json.loads(sse.data)
            assert frame["id"] == sent["id"]
            assert sse.last_event_id == str(sent["id"])
            assert sse.type == frame["type"] == sent["type"]
            assert frame.get("data") == sent.get("data")
            assert frame.get("originatorClientId") == sent.get("originatorClientId")
            meta = {k: v for k, v in frame["_meta"].items() if k != "serverTimestamp"}
            assert meta == {
                k: v for k, v in (sent.get("_meta") or {}).items() if k != "serverTimestamp"
            }
        self._checked = count

    async def read_live_only(self, stream: Stream) -> None:
        """A live-only stream (EB-7, no cursor): the next event published is its first frame."""
        marker = await self.publish_json({"type": "marker"})
        await stream.read_until(lambda s: any(f.get("id") == marker for f in s.frames))
        assert [f.get("id") for f in stream.frames] == [marker]  # no resync, no replay

    async def read_replay(self, stream: Stream) -> tuple[dict[str, Any] | None, list[int]]:
        """Read through ``replay_complete``; return the resync frame (if any) and the ids."""
        await stream.read_until_type("replay_complete")
        frames = stream.frames
        resync = frames[0] if frames[0]["type"] == "state_resync_required" else None
        replayed = frames[1 if resync else 0 : -1]
        assert all("id" in f for f in replayed), [f["type"] for f in frames]
        ids = [f["id"] for f in replayed]
        assert frames[-1]["data"]["replayedCount"] == len(ids)
        return resync, ids

    def ring_ids(self) -> list[int]:
        return list(range(max(1, self.last_id - RING + 1), self.last_id + 1))


@pytest.fixture
def harness(transactional_db: None) -> Iterator[Harness]:
    loop = asyncio.new_event_loop()
    harness = Harness(loop)
    try:
        harness.run(harness.start())
        yield harness
        harness.run(harness.stop())
    finally:
        loop.run_until_complete(get_backend().aclose())  # the Redis backend's store
        loop.run_until_complete(_cancel_leftover_tasks())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _cancel_leftover_tasks() -> None:
    """Cancel what the application left running (background writes), so the loop closes clean."""
    tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _example(harness: Harness, check: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run one example's ``check``, then the watcher's."""
    harness.run(check())
    harness.run(harness.check_watcher())


# -- strategies ----------------------------------------------------------------------------


def _deliverable(value: bytes) -> bool:
    # A header line ends at LF (or CR LF): no server can hand such a value to the app.
    return b"\r" not in value and b"\n" not in value


ANY_HEADER = st.one_of(
    st.binary(max_size=48),
    st.text(max_size=24).map(lambda s: s.encode("utf-8")),
    st.text(st.characters(max_codepoint=0xFF), max_size=24).map(lambda s: s.encode("latin-1")),
).filter(_deliverable)

CURSOR_LIKE = st.one_of(
    st.integers(0, 200).map(str),
    st.integers(0, 50).map(lambda n: "0" * 30 + str(n)),
    st.integers(MAX_SAFE_INTEGER - 2, MAX_SAFE_INTEGER + 2).map(str),
    st.from_regex(r"[ +\-0-9.,eExX\t]{0,24}", fullmatch=True),
    st.integers(0, 9).map(lambda n: chr(0xFF10 + n)),  # fullwidth digits are not ASCII
).map(lambda s: s.encode("utf-8"))
NEAR_HEAD = st.integers(-RING - 4, 3)
"""A cursor this far from the session's last id when the example runs (in, at the edge
of, behind and beyond the ring)."""

EPOCH_LIKE = st.one_of(
    st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True),
    st.from_regex(r"[A-Za-z0-9_\- .=+/]{0,70}", fullmatch=True),
).map(lambda s: s.encode("latin-1"))


def _json_values(floats: st.SearchStrategy[float]) -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.integers(-(10**300), 10**300),  # beyond 64 bits (and beyond a double)
        floats,
        st.text(max_size=20),
        st.sampled_from(["\n\nevent: x\ndata: y", "\r", "\u2028", "\x00", "\ufeff"]),
    )
    return st.recursive(
        scalars,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(st.text(max_size=8), children, max_size=4),
        ),
        max_leaves=12,
    )


JSON_VALUES = _json_values(st.floats())  # NaN and infinities are not JSON: refused
FINITE_JSON = _json_values(st.floats(allow_nan=False, allow_infinity=False))


def _nested(depth: int, leaf: Any = 0) -> Any:
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


DEEP = st.integers(60, 68).map(_nested)  # around the 64-level limit

VALID_TYPES = st.text(min_size=1, max_size=24).filter(
    lambda t: not any(ch in t for ch in "\r\n\x00") and t not in RESERVED_TYPES
)
TYPES = st.one_of(
    st.text(max_size=24),
    st.sampled_from(sorted(RESERVED_TYPES)),
    st.sampled_from(["", " ", "a\rb", "a\nb", "a\x00b", "x" * 200, "x" * 201, "\u2028", "é"]),
    JSON_VALUES,
)
WELL_FORMED = st.fixed_dictionaries(
    {"type": VALID_TYPES},
    optional={
        "data": st.one_of(FINITE_JSON, DEEP),
        "_meta": st.dictionaries(st.text(max_size=8), FINITE_JSON, max_size=3),
        "originatorClientId": st.one_of(st.none(), st.text(max_size=24)),
    },
)
"""Mostly accepted (a DEEP data beyond 64 levels is not): so that many events flow."""
EVENTS = st.fixed_dictionaries(
    {"type": TYPES},
    optional={
        "data": st.one_of(JSON_VALUES, DEEP),
        "_meta": st.one_of(JSON_VALUES, DEEP, st.dictionaries(st.text(max_size=8), JSON_VALUES)),
        "originatorClientId": st.one_of(st.text(max_size=24), st.just("c" * 201), JSON_VALUES),
    },
)
BODIES = st.one_of(
    WELL_FORMED,
    EVENTS,
    st.tuples(
        WELL_FORMED, st.dictionaries(st.text(max_size=10), FINITE_JSON, min_size=1, max_size=2)
    ).map(lambda pair: {**pair[1], **pair[0]}),  # unknown fields, unless only known names
    JSON_VALUES,  # not an object at all
)


# -- oracles (the contract, restated) -----------------------------------------------------


def expected_cursor(value: bytes) -> int | None:
    """EB-13: ASCII decimal digits (leading zeros allowed) up to 2**53 - 1, else absent."""
    if re.fullmatch(rb"[0-9]+", value) is None:
        return None
    number = int(value)
    return number if number <= MAX_SAFE_INTEGER else None


def is_epoch(value: bytes) -> bool:
    """EB-13, EB-10: ``[A-Za-z0-9_-]{1,64}``."""
    return re.fullmatch(rb"[A-Za-z0-9_-]{1,64}", value) is not None


def max_queued_of(value: str) -> int | None:
    """EB-14: a plain decimal string in [16, 2048] (no clamping), else None (a 400)."""
    if re.fullmatch(r"[0-9]+", value) is None:
        return None
    number = int(value)
    return number if 16 <= number <= 2048 else None


def _depth(value: Any) -> int:
    """Levels of nested arrays/objects (a scalar is 0, ``[]`` is 1)."""
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def publishable(body: Any) -> bool:
    """What ``POST /session/<id>/events`` accepts (docs/protocol.md, "Endpoints")."""
    if not isinstance(body, dict) or set(body) - {"type", "data", "_meta", "originatorClientId"}:
        return False
    event_type = body.get("type")
    if (
        not isinstance(event_type, str)
        or not event_type
        or len(event_type) > 200
        or any(ch in event_type for ch in "\r\n\x00")
        or event_type in RESERVED_TYPES
    ):
        return False
    if "_meta" in body and not isinstance(body["_meta"], dict):
        return False
    originator = body.get("originatorClientId")
    if originator is not None and not (isinstance(originator, str) and len(originator) <= 200):
        return False
    return _depth(body.get("data")) <= 64 and _depth(body.get("_meta")) <= 64 and _finite(body)


# -- EB-13: Last-Event-ID -----------------------------------------------------------------


@FUZZ
@given(value=st.one_of(ANY_HEADER, CURSOR_LIKE, NEAR_HEAD))
@example(value=b"0" * 40 + b"9")
def test_any_last_event_id_is_a_cursor_exactly_when_strictly_decimal(harness, value):
    async def check() -> None:
        if isinstance(value, int):  # relative to the head, now
            value_now = str(max(0, harness.last_id + value)).encode()
        else:
            value_now = value
        stream = await harness.open({"last-event-id": value_now})
        assert stream.status == 200  # never a 400 or a 500 (EB-13)
        cursor = expected_cursor(value_now)
        event(f"valid cursor: {cursor is not None}")
        if cursor is None:
            await harness.read_live_only(stream)
        else:
            await _check_replay(harness, stream, cursor)
        await stream.disconnect()

    _example(harness, check)


async def _check_replay(harness: Harness, stream: Stream, cursor: int) -> None:
    """EB-7: resync frame if any, then the replayed ids, then ``replay_complete``."""
    ring, last = harness.ring_ids(), harness.last_id
    resync, ids = await harness.read_replay(stream)
    event(f"resync: {resync['data']['reason'] if resync else None}")
    if cursor >= last + 1:
        assert resync is not None
        assert resync["data"]["reason"] == "epoch_reset"
        assert ids == ring
    elif ring[0] > cursor + 1:
        assert resync is not None
        assert resync["data"]["reason"] == "ring_evicted"
        assert ids == ring
    else:
        assert resync is None
        assert ids == list(range(cursor + 1, last + 1))


# -- EB-13: X-Event-Epoch -----------------------------------------------------------------


@FUZZ
@given(
    value=st.one_of(ANY_HEADER, EPOCH_LIKE, st.just(b"<the bus epoch>")), with_cursor=st.booleans()
)
def test_any_event_epoch_resets_only_when_valid_and_different(harness, value, with_cursor):
    async def check() -> None:
        epoch = harness.epoch.encode() if value == b"<the bus epoch>" else value
        headers = {"x-event-epoch": epoch}
        if with_cursor:
            headers["last-event-id"] = str(harness.last_id).encode()
        stream = await harness.open(headers)
        assert stream.status == 200
        if not with_cursor:  # an epoch without a cursor means nothing
            await harness.read_live_only(stream)
        else:
            ring = harness.ring_ids()
            resync, ids = await harness.read_replay(stream)
            event(f"valid epoch: {is_epoch(epoch)}")
            if is_epoch(epoch) and epoch != harness.epoch.encode():
                assert resync is not None
                assert resync["data"]["reason"] == "epoch_reset"
                assert resync["data"]["detail"] == "epoch_mismatch"
                assert ids == ring
            else:  # invalid: ignored (with a log line); equal: the cursor is simply current
                assert (resync, ids) == (None, [])
        await stream.disconnect()

    _example(harness, check)


# -- EB-12: Authorization -----------------------------------------------------------------


def _tampered(token: str, position: int, replacement: str) -> str:
    index = position % len(token)
    if token[index] == replacement:
        replacement = "A" if replacement != "A" else "B"
    return token[:index] + replacement + token[index + 1 :]


BEARER_LIKE = st.one_of(
    ANY_HEADER.map(lambda v: b"Bearer " + v),
    st.tuples(st.integers(0, 10_000), st.sampled_from("AZaz09-_:.")).map(
        lambda t: ("TOKEN", t[0], t[1])
    ),
)


@FUZZ
@given(
    value=st.one_of(ANY_HEADER, BEARER_LIKE),
    target=st.sampled_from(["stream", "load", "publish"]),
)
def test_any_bad_authorization_is_401_json_and_leaks_nothing(harness, value, target):
    async def check() -> None:
        header = value
        if isinstance(value, tuple):  # a real token with one character changed
            tokens = {"stream": harness.read_token, "load": harness.read_token}
            token = tokens.get(target, harness.publish_token)
            header = f"Bearer {_tampered(token, value[1], value[2])}".encode()
            event("tampered token")
        response = await _request(harness, target, {"authorization": header})
        body = assert_error(response, 401, "unauthorized")  # EB-12
        assert harness.session_id not in json.dumps(body)

    _example(harness, check)


async def _request(
    harness: Harness, target: str, headers: Mapping[str, str | bytes]
) -> Response | Stream:
    if target == "stream":
        stream = await harness.open(headers, auth=False)
        return await stream.read_to_end()
    if target == "load":
        return await call("GET", f"/session/{harness.session_id}", headers=list(headers.items()))
    return await harness.publish_raw(
        json.dumps({"type": "t", "data": 1}).encode(),
        {**headers, "content-type": "application/json"},
    )


# -- EB-14: ?maxQueued ---------------------------------------------------------------------


MAX_QUEUED_TEXT = st.one_of(
    st.text(max_size=12),
    st.integers(-5, 3000).map(str),
    # Leading zeros up to 32 characters in all: longer ones are the focused test below.
    st.tuples(st.integers(0, 28), st.integers(0, 3000)).map(lambda t: "0" * t[0] + str(t[1])),
    st.sampled_from(["16", "2048", "15", "2049", "", " 16", "16 ", "+16", "1e2", "0x10", "１６"]),
)


@FUZZ
@given(value=MAX_QUEUED_TEXT)
def test_any_max_queued_is_accepted_exactly_when_a_decimal_in_range(harness, value):
    async def check() -> None:
        stream = await harness.open({}, "maxQueued=" + quote(value, safe=""))
        event(f"valid maxQueued: {max_queued_of(value) is not None}")
        if max_queued_of(value) is None:
            assert_error(await stream.read_to_end(), 400, "invalid_max_queued")
        else:
            assert stream.status == 200
            await stream.disconnect()

    _example(harness, check)


def test_max_queued_with_many_leading_zeros_is_accepted(harness):
    # EB-14: "a plain decimal string" in [16, 2048]; leading zeros allowed, as for
    # Last-Event-ID (EB-13), whatever their number.
    async def check() -> None:
        stream = await harness.open({}, "maxQueued=" + "0" * 31 + "16")
        assert stream.status == 200, (await stream.read_to_end()).body
        await stream.disconnect()

    _example(harness, check)


@FUZZ
@given(raw=st.binary(max_size=40).map(lambda b: re.sub(rb"\s", b"", b)))
def test_any_raw_query_string_is_never_a_5xx(harness, raw):
    # The request target cannot contain whitespace; anything else may reach the app.
    async def check() -> None:
        stream = await harness.open({}, "maxQueued=" + raw.decode("latin-1"))
        if stream.status == 200:
            await stream.disconnect()
        else:
            assert_error(await stream.read_to_end(), 400, "invalid_max_queued")

    _example(harness, check)


# -- publish bodies (docs/protocol.md, POST /session/<id>/events) --------------------------


@FUZZ
@given(body=BODIES, ascii_only=st.booleans())
def test_any_publish_body_is_accepted_exactly_when_valid_and_reaches_subscribers(
    harness, body, ascii_only
):
    async def check() -> None:
        raw = json.dumps(body, ensure_ascii=ascii_only).encode()  # NaN/Infinity: not JSON
        response = await harness.publish_raw(raw)
        event(f"status {response.status}")
        if publishable(body):
            assert response.status == 200, response.body
        else:
            assert_error(response, 400, "invalid_json" if not _finite(body) else "invalid_event")

    _example(harness, check)


@FUZZ
@given(raw=st.binary(max_size=64))
def test_any_raw_publish_body_is_never_a_5xx(harness, raw):
    async def check() -> None:
        response = await harness.publish_raw(raw)
        if response.status != 200:
            code = response.json().get("code")
            assert code in ("invalid_json", "invalid_event"), response.body
            assert_error(response, 400, code)

    _example(harness, check)
