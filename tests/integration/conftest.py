"""Plumbing for integration tests through the real ASGI application (``qwenweb.asgi``).

Every request goes through asgiref's ``ApplicationCommunicator``: it hands out one ASGI
message at a time, so a test can read the start of an endless event stream, act, and read
on (httpx's ASGI transport and Channels' ``HttpCommunicator`` wait for the body to end).
Every wait is bounded by ``WAIT_S``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import pytest
import pytest_asyncio
from asgiref.sync import SyncToAsync
from asgiref.testing import ApplicationCommunicator
from channels.db import database_sync_to_async
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.db import connections
from django.test import AsyncClient, Client

from qwenweb.asgi import application
from sessions.auth import issue_token
from sessions.backends import event_log, get_backend
from sessions.backends.base import LiveSession
from sessions.conf import get_config
from sessions.models import AgentSession
from sessions.wire import ServerSentEvent, SSEParser
from tests.support import backend

WAIT_S = 2.0
"""Upper bound for any single wait on the application (a message, the app ending)."""

HOST = "testserver"
CSRF_SECRET = "a" * 32
"""A CSRF secret sent both as the ``csrftoken`` cookie and the ``X-CSRFToken`` header."""

Headers = dict[str, str] | Iterable[tuple[str, str | bytes]]


def _encode_headers(headers: Headers | None) -> list[tuple[bytes, bytes]]:
    items = headers.items() if isinstance(headers, dict) else (headers or ())
    encoded = [(b"host", HOST.encode())]
    for name, value in items:
        raw = value if isinstance(value, bytes) else value.encode("latin-1")
        encoded.append((name.lower().encode("latin-1"), raw))
    return encoded


def http_scope(
    method: str, path: str, headers: Headers | None = None, query: str | dict[str, Any] = ""
) -> dict[str, Any]:
    """Return an ASGI 3 ``http`` scope; ``query`` is a raw string or a dict to urlencode."""
    query_string = urlencode(query, doseq=True) if isinstance(query, dict) else query
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query_string.encode("latin-1"),
        "root_path": "",
        "headers": _encode_headers(headers),
        "client": ("127.0.0.1", 50000),
        "server": (HOST, 80),
    }


# -- plain (ending) responses ------------------------------------------------------------


@dataclass
class Response:
    """A whole HTTP response: status, headers (lowercase name -> value) and body."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _header_dict(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    return {bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1") for k, v in raw}


async def call(
    method: str,
    path: str,
    *,
    headers: Headers | None = None,
    json_body: Any = None,
    body: bytes | None = None,
    query: str | dict[str, Any] = "",
) -> Response:
    """Send one request through ``application`` and collect the whole response (bounded)."""
    header_list = list(headers.items() if isinstance(headers, dict) else (headers or ()))
    if json_body is not None:
        body = json.dumps(json_body).encode()
        header_list.append(("content-type", "application/json"))
    body = body or b""
    header_list.append(("content-length", str(len(body))))
    communicator = ApplicationCommunicator(
        application, http_scope(method, path, header_list, query)
    )
    await communicator.send_input({"type": "http.request", "body": body, "more_body": False})
    start = await communicator.receive_output(WAIT_S)
    assert start["type"] == "http.response.start", start
    chunks = []
    while True:
        message = await communicator.receive_output(WAIT_S)
        assert message["type"] == "http.response.body", message
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    await communicator.wait(WAIT_S)
    return Response(start["status"], _header_dict(start.get("headers", [])), b"".join(chunks))


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def csrf_headers(cookie: str = "", *, with_header: bool = True) -> dict[str, str]:
    """Headers of a browser request: the login cookie, the CSRF cookie, the CSRF header."""
    cookies = "; ".join(
        c for c in (cookie, f"{django_settings.CSRF_COOKIE_NAME}={CSRF_SECRET}") if c
    )
    headers = {"cookie": cookies}
    if with_header:
        headers["x-csrftoken"] = CSRF_SECRET
    return headers


async def publish(session_id: str, event: dict[str, Any], token: str | None = None) -> Response:
    """``POST /session/<id>/events`` with a publish token (one is issued if not given)."""
    token = token or issue_token(session_id, ["publish"])
    return await call(
        "POST", f"/session/{session_id}/events", headers=bearer(token), json_body=event
    )


async def publish_many(session_id: str, count: int) -> list[int]:
    """Publish ``count`` events ``{"type": "step", "data": {"n": i}}``; return their ids."""
    ids = []
    for n in range(count):
        response = await publish(session_id, {"type": "step", "data": {"n": n}})
        assert response.status == 200, response.body
        ids.append(response.json()["id"])
    return ids


async def load(session_id: str, token: str | None = None) -> Response:
    """``GET /session/<id>`` with a read token (one is issued if not given)."""
    token = token or issue_token(session_id, ["read"])
    return await call("GET", f"/session/{session_id}", headers=bearer(token))


async def close(session_id: str, token: str | None = None) -> Response:
    """``POST /session/<id>/close`` with a publish token (one is issued if not given)."""
    token = token or issue_token(session_id, ["publish"])
    return await call("POST", f"/session/{session_id}/close", headers=bearer(token))


def ids_of(frames: list[dict[str, Any]]) -> list[int]:
    """The ids of the real events among ``frames`` (synthetic frames carry none, EB-18)."""
    return [f["id"] for f in frames if "id" in f]


def live_bus(session_id: str) -> Any:
    """The bus of a loaded session in this process (the test runs on the server's loop)."""
    live = get_backend().registry.get(session_id)
    assert live is not None, f"session {session_id} is not loaded"
    return live.bus


# -- streams -----------------------------------------------------------------------------


@dataclass
class Stream:
    """One open ``GET /session/<id>/events``: read it message by message, every wait bounded.

    ``chunks`` are the raw body messages, ``events`` what :class:`SSEParser` dispatched,
    ``comments`` the comment lines, ``ended`` whether a body message had ``more_body``
    False.
    """

    communicator: ApplicationCommunicator
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[bytes] = field(default_factory=list)
    events: list[ServerSentEvent] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    ended: bool = False

    def __post_init__(self) -> None:
        self._parser = SSEParser(self.events.append, on_comment=self.comments.append)

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    @property
    def frames(self) -> list[dict[str, Any]]:
        """The ``data`` of every dispatched event, parsed as JSON (the whole envelope)."""
        return [json.loads(event.data) for event in self.events]

    @property
    def types(self) -> list[str]:
        return [event.type for event in self.events]

    def blocks(self) -> list[list[str]]:
        """The body split into SSE blocks, each a list of lines (for ``id:`` checks)."""
        text = self.body.decode()
        return [block.split("\n") for block in text.split("\n\n") if block]

    def frame(self, event_type: str) -> dict[str, Any]:
        """The first frame of ``event_type`` read so far."""
        return next(f for f in self.frames if f["type"] == event_type)

    async def read_start(self) -> Stream:
        message = await self._receive()
        assert message["type"] == "http.response.start", message
        self.status = message["status"]
        self.headers = _header_dict(message.get("headers", []))
        return self

    async def read_chunk(self) -> bytes:
        """Read one body message; raises AssertionError if the body already ended."""
        assert not self.ended, "the stream already ended"
        message = await self._receive()
        assert message["type"] == "http.response.body", message
        chunk = message.get("body", b"")
        self.chunks.append(chunk)
        self._parser.feed_bytes(chunk)
        if not message.get("more_body", False):
            self.ended = True
            self._parser.end()
        return chunk

    async def read_until(self, predicate: Callable[[Stream], bool]) -> Stream:
        """Read body messages until ``predicate(self)`` holds; fail if the body ends first."""
        while not predicate(self):
            assert not self.ended, f"stream ended before the condition; got {self.types}"
            await self.read_chunk()
        return self

    async def read_until_type(self, event_type: str) -> dict[str, Any]:
        """Read until a frame of ``event_type`` arrives and return it."""
        await self.read_until(lambda s: event_type in s.types)
        return self.frame(event_type)

    async def read_to_end(self) -> Stream:
        while not self.ended:
            await self.read_chunk()
        return self

    async def disconnect(self) -> None:
        """Send ``http.disconnect`` and wait (bounded) for the application to return."""
        await self.communicator.send_input({"type": "http.disconnect"})
        await self.communicator.wait(WAIT_S)

    @property
    def done(self) -> bool:
        return self.communicator.future.done()

    async def _receive(self) -> dict[str, Any]:
        try:
            return await self.communicator.receive_output(WAIT_S)
        except TimeoutError:
            raise AssertionError(
                f"no message from the application within {WAIT_S}s; got {self.types}"
            ) from None


OpenStream = Callable[..., Awaitable[Stream]]


@pytest_asyncio.fixture
async def open_stream() -> AsyncIterator[OpenStream]:
    """Return ``open_stream(path, headers=None, query="", method="GET")``.

    Sends the scope and ``http.request`` and returns a :class:`Stream` whose response
    start is already read. Streams still open at the end of the test are disconnected.
    """
    opened: list[ApplicationCommunicator] = []

    async def _open(
        path: str, headers: Headers | None = None, query: str | dict[str, Any] = "", method="GET"
    ) -> Stream:
        communicator = ApplicationCommunicator(
            application, http_scope(method, path, headers, query)
        )
        opened.append(communicator)
        await communicator.send_input({"type": "http.request", "body": b"", "more_body": False})
        return await Stream(communicator).read_start()

    yield _open
    for communicator in opened:
        if not communicator.future.done():
            await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait(WAIT_S)


@pytest.fixture
def stream_of(open_stream: OpenStream) -> Callable[..., Awaitable[Stream]]:
    """Return ``stream_of(session_id, token=None, headers=None, query="")``.

    Opens the session's stream with a read token (issued if not given) plus ``headers``.
    """

    async def _open(
        session_id: str,
        token: str | None = None,
        headers: dict[str, str] | None = None,
        query: str | dict[str, Any] = "",
    ) -> Stream:
        all_headers = {**bearer(token or issue_token(session_id, ["read"])), **(headers or {})}
        return await open_stream(f"/session/{session_id}/events", all_headers, query)

    return _open


# -- data --------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _close_connections_of_asgiref_thread() -> Iterator[None]:
    """After the test, close the connections a test's own async ORM calls left open.

    Outside a request, Django's async ORM (``aget``, ``async for`` over a queryset ...)
    runs in asgiref's one process-wide thread and leaves its connection open there until
    some later ``database_sync_to_async`` call happens to run in that thread: after the
    last test, PostgreSQL refuses to drop the test database ("is being accessed by other
    users"). The application never does this (``sessions.queries``,
    ``test_db_connections.py``), nor do the helpers below; a test may.
    """
    yield
    SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=WAIT_S)


@pytest.fixture
def make_session() -> Callable[..., Awaitable[str]]:
    """Return ``await make_session(**fields)``: create an ``AgentSession`` row, give its id."""

    async def _make(**fields: Any) -> str:
        row = await database_sync_to_async(AgentSession.objects.create)(**fields)
        return row.id

    return _make


@pytest.fixture
def staff() -> Client:
    """A Django test client logged in as a superuser (``root``), for the admin's pages."""
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def make_user() -> Callable[..., Awaitable[Any]]:
    """Return ``await make_user(username, is_staff=False)``."""

    async def _make(username: str, *, is_staff: bool = False) -> Any:
        create_user = get_user_model().objects.create_user
        return await database_sync_to_async(create_user)(username=username, is_staff=is_staff)

    return _make


async def login_cookie(user: Any) -> str:
    """Return a ``Cookie`` header value holding a Django login session for ``user``."""
    client = AsyncClient()
    await database_sync_to_async(client.force_login)(user)
    name = django_settings.SESSION_COOKIE_NAME
    return f"{name}={client.cookies[name].value}"


@pytest.fixture
def qwenweb_settings(settings: Any) -> Callable[..., None]:
    """Return ``qwenweb_settings(KEY=value, ...)``: override keys of ``settings.QWENWEB``.

    ``sessions.conf`` clears its cache on ``setting_changed``; pytest-django restores the
    setting afterwards. Bus settings apply to buses built after the call.
    """

    def _override(**values: Any) -> None:
        settings.QWENWEB = {**settings.QWENWEB, **values}

    return _override


@pytest.fixture
def strict_caps(qwenweb_settings: Callable[..., None]) -> None:
    """Apply the queue caps at once (``OVERFLOW_GRACE_S=0``) for buses built after this.

    Through ``ApplicationCommunicator`` a ``send`` never waits, so these tests stand for a
    reader that stops reading with a burst published without yielding; under the default
    grace such a burst is one the reader had no chance to take, and evicts nobody
    (tests/unit/test_overflow_grace.py).
    """
    qwenweb_settings(OVERFLOW_GRACE_S=0)


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """``caplog`` that also sees the ``qwenweb`` loggers (they do not propagate to root)."""
    logger = logging.getLogger("qwenweb")
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


def records(logs: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    """The captured records whose message contains ``text``, leaving out the one summary
    line per closed stream (``stream_closed ... reason=<how it ended>``), which repeats it."""
    return [
        r
        for r in logs.records
        if text in r.getMessage() and not r.getMessage().startswith("stream_closed ")
    ]


async def burst(session_id: str, count: int, event_type: str = "burst") -> None:
    """Publish ``count`` events that reach the loaded bus without a yield between them.

    The stream's pump cannot run in between, so the frames pile up in the subscriber
    queue exactly as they would behind a client that stops reading (EB-3, EB-4).
    Memory backend: published on the bus directly (no await); durable backend: in one
    commit, handed to the bus in one callback (the log's release slices lifted for it: in
    slices, the pump would take each before the next). Redis backend: published
    through Redis while this process's reader does not watch the session, then handed to
    the mirror in one reader callback (``RedisBackend._on_entries``), as one ``XREAD`` would.
    """
    live = get_backend().registry.get(session_id)
    assert live is not None, f"session {session_id} is not loaded"
    events = [{"type": event_type, "data": {"n": n}} for n in range(count)]
    if not get_backend().supports_multiple_processes:
        # The durable backend delivers after the commit: the writer waits while the events
        # are submitted, so that they reach the bus in one commit, with no yield between.
        log = getattr(get_backend(), "log", None)
        with pytest.MonkeyPatch.context() as patch:
            if log is not None:
                patch.setattr(event_log, "RELEASE_SLICE", count + 1)
                patch.setattr(event_log, "RELEASE_SLICE_BYTES", 2**62)
                log.pause()
            try:
                for event in events:
                    assert backend.as_memory().publish_nowait(live, event) is not None
            finally:
                if log is not None:
                    log.resume()
            if log is not None:
                await log.submit(lambda conn: None)  # every event before it is delivered
        return
    store = backend.as_redis().store()
    after = live.bus.last_event_id
    store.unwatch(session_id)
    try:
        for event in events:
            assert await get_backend().publish(live, event) is not None
        window = await store.window(session_id)
        backend.as_redis()._on_entries(
            session_id, [entry for entry in window.entries if entry[0] > after]
        )
    finally:
        store.watch(session_id, live.bus.last_event_id)
    assert live.bus.last_event_id == after + count


async def publish_here(live: LiveSession, event: dict[str, Any]) -> int:
    """Publish through the backend (either one); return once this process's bus has it.

    With the Redis backend the event reaches the local bus through the reader task.
    """
    published = await get_backend().publish(live, event)
    assert published is not None
    async with asyncio.timeout(WAIT_S):
        while live.bus.last_event_id < published.id:
            await _advanced(live).wait()
    return published.id


def _advanced(live: LiveSession) -> asyncio.Event:
    from sessions.backends.redis import RedisLiveSession

    assert isinstance(live, RedisLiveSession), live
    return live._advanced


def assert_error(response: Response | Stream, status: int, code: str) -> dict[str, Any]:
    """Assert a JSON error ``{"error": <non-empty str>, "code": code, ...}``; return it."""
    if isinstance(response, Stream):
        assert response.ended, "read the rejected stream to its end first"
    assert response.status == status, (response.status, response.body)
    assert response.headers.get("content-type", "").startswith("application/json"), response.headers
    body = json.loads(response.body)
    assert isinstance(body.get("error"), str), body
    assert body["error"], body
    assert body.get("code") == code, body
    if status == 401:
        assert response.headers.get("www-authenticate", "").startswith("Bearer"), response.headers
    return body


@pytest_asyncio.fixture
async def redis_backend(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    """Select the Redis backend, whatever the run's, under a key prefix of its own; yield
    the prefix; close the backend and delete its keys afterwards."""
    prefix = f"qwtest-redis-{secrets.token_hex(4)}"
    monkeypatch.setenv("QWENWEB_BACKEND", "redis")
    monkeypatch.setenv("QWENWEB_REDIS_KEY_PREFIX", prefix)
    get_config.cache_clear()
    yield prefix
    await get_backend().aclose()
    get_config.cache_clear()
    backend.delete_run_keys(prefix, get_config().redis_url)
