"""Browser tests: the session page in a real headless Chromium against a real server process.

Playwright's sync API drives Debian's ``/usr/bin/chromium`` (never ``playwright install``).
Each server is another process with its own SQLite database and its own bus: tests drive it
over HTTP only (style.md, Tests). The operator logs in through the admin login form, as a
person would.

Every wait is bounded: ``expect(...)`` with a ``timeout``, or ``tests.support.server.wait_for``.
Where a test needs "while the page is disconnected" to be certain, it pauses the page's
clock (Playwright's fake timers drive the client's reconnect ``setTimeout``) instead of
racing the retry delay.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import (
    Browser,
    Page,
    Playwright,
    Request,
    Response,
    expect,
    sync_playwright,
)

from sessions.auth import issue_token
from tests.support.server import (
    REPO,
    ServerProcess,
    daphne_argv,
    free_port,
    migrate,
    request_json,
    runserver_argv,
    serve_argv,
    server_env,
    stop_all,
)
from tests.support.tls import tls_argv

CHROMIUM = Path(os.environ.get("QWENWEB_CHROMIUM", "/usr/bin/chromium"))
INSECURE_HOST = "lease.qwenweb.test"
"""A host name Chromium maps to 127.0.0.1 (``--host-resolver-rules``): plain http:// to it
is not a secure context, so the page has no ``navigator.locks``."""
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # A name for 127.0.0.1 that only this Chromium resolves: a page there is not a secure
    # context (the name is neither localhost nor a loopback literal), and nothing on the
    # host's network changes (a new interface would fail other browsers' loads with
    # ERR_NETWORK_CHANGED; test_tabs's lease test once made a veth pair and did).
    f"--host-resolver-rules=MAP {INSECURE_HOST} 127.0.0.1",
]
USERNAME = "operator"
PASSWORD = "operator-password-1"
VIEWPORT = {"width": 1440, "height": 900}
WAIT_MS = 10_000
"""Default bound of a wait on the page (milliseconds)."""

SCREENSHOT_DIR = os.environ.get("QWENWEB_SCREENSHOT_DIR", "")
"""When set (e.g. ``docs``), tests save the screenshots named in :func:`screenshot` there."""


# -- servers -----------------------------------------------------------------------------


def create_operator(database: Path) -> None:
    """Create the staff user ``operator`` in ``database`` (``createsuperuser --noinput``)."""
    subprocess.run(
        [sys.executable, "manage.py", "createsuperuser", "--noinput",
         "--username", USERNAME, "--email", "operator@example.com"],
        cwd=REPO,
        env=server_env(database, DJANGO_SUPERUSER_PASSWORD=PASSWORD),
        check=True,
        timeout=120,
        stdout=subprocess.DEVNULL,
    )  # fmt: skip


def server_argv(kind: str, port: int) -> list[str]:
    """The command line of a server ``kind`` on 127.0.0.1:``port``.

    ``serve``: the production entry point (granian); ``serve-tls``: the same over TLS
    (HTTP/2 by ALPN); ``runserver``:
    the demo's server; ``uvicorn``; ``plain-daphne``: the ``daphne`` command, whose ``send``
    never waits for the socket (a control for the backpressure test).
    """
    if kind == "serve":
        return serve_argv(port)
    if kind == "serve-tls":  # over TLS: HTTP/2 by ALPN (tests.support.tls's certificate)
        return serve_argv(port, *tls_argv())
    if kind == "runserver":
        return runserver_argv(port)
    if kind == "plain-daphne":
        return daphne_argv(port)
    if kind == "uvicorn":
        return [
            sys.executable, "-m", "uvicorn", "qwenweb.asgi:application",
            "--host", "127.0.0.1", "--port", str(port), "--lifespan", "off",
            "--log-level", "warning",
        ]  # fmt: skip
    raise ValueError(f"unknown server kind {kind!r}")


@pytest.fixture(scope="session")
def browser_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite database holding the staff user ``operator``."""
    path = tmp_path_factory.mktemp("browser") / "db.sqlite3"
    migrate(path)
    create_operator(path)
    return path


@pytest.fixture(scope="session")
def start_server(
    browser_database: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., ServerProcess]]:
    """Return ``start_server(kind="serve", **env)`` (see :func:`server_argv`); all are stopped
    at the end of the test session. ``env`` overrides settings (``QWENWEB_...``)."""
    started: list[ServerProcess] = []

    def _start(kind: str = "serve", **env: str) -> ServerProcess:
        port = free_port()
        log = tmp_path_factory.mktemp("logs") / f"{kind}-{port}.log"
        server = ServerProcess(
            server_argv(kind, port),
            port,
            server_env(browser_database, **env),
            log,
            tls=kind == "serve-tls",
        )
        started.append(server)
        return server.start()

    yield _start
    stop_all(started)


@pytest.fixture(scope="session")
def server(start_server: Callable[..., ServerProcess]) -> ServerProcess:
    """The shared server of the browser tests: the production entry point, heartbeat 1 s."""
    return start_server("serve", QWENWEB_HEARTBEAT_INTERVAL_S="1")


# -- the browser -------------------------------------------------------------------------


# Module scope, not session: while Playwright's sync API is active it keeps its own asyncio
# loop registered as running in this thread, which would break every asyncio test after it.
@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as instance:
        yield instance


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    """Debian's Chromium, headless. Fails with the install command when it is missing."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (or set QWENWEB_CHROMIUM)")
    instance = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
    yield instance
    instance.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh browser context (no cookies) and page; page errors fail the test."""
    context = browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert not errors, f"errors in the page: {errors}"


# -- sessions over HTTP ------------------------------------------------------------------


@dataclass
class RemoteSession:
    """A session on a server, driven over HTTP with tokens issued per call (never stale)."""

    base_url: str
    id: str
    browser_base_url: str | None = None
    """Where the browser reaches the server, when not at ``base_url`` (the test's own
    requests): a name that only Chromium resolves (:data:`INSECURE_HOST`)."""

    @classmethod
    def create(cls, base_url: str, **body: Any) -> RemoteSession:
        """``POST /session`` with a create token for ``operator`` (who becomes the owner)."""
        status, created = request_json(
            "POST", f"{base_url}/session", body, token=issue_token("*", ["create"], USERNAME)
        )
        assert status == 201, created
        return cls(base_url, created["id"])

    @property
    def browser_origin(self) -> str:
        return self.browser_base_url or self.base_url

    @property
    def page_url(self) -> str:
        return f"{self.browser_origin}/sessions/{self.id}/"

    def publish(self, event_type: str, data: Any = None) -> int:
        status, body = request_json(
            "POST", f"{self.base_url}/session/{self.id}/events", {"type": event_type, "data": data},
            token=issue_token(self.id, ["publish"], "browser-test"),
        )  # fmt: skip
        assert status == 200, body
        return int(body["id"])

    def say(self, *texts: str) -> list[int]:
        """Publish one ``agent_message_chunk`` per text; return their ids."""
        return [self.publish("session_update", agent_chunk(text)) for text in texts]

    def load(self) -> Any:
        """``GET /session/<id>``: the snapshot."""
        status, body = request_json(
            "GET", f"{self.base_url}/session/{self.id}", token=issue_token(self.id, ["read"])
        )
        assert status == 200, body
        return body

    def subscriber_count(self) -> int:
        """How many streams the server counts on this session now (from the snapshot)."""
        return int(self.load()["subscriberCount"])

    def close(self) -> None:
        status, body = request_json(
            "POST", f"{self.base_url}/session/{self.id}/close",
            token=issue_token(self.id, ["publish"], "browser-test"),
        )  # fmt: skip
        assert status == 200, body


def agent_chunk(text: str) -> dict[str, Any]:
    """An ACP ``agent_message_chunk`` session update carrying ``text``."""
    return {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}


def agent_text(events: list[dict[str, Any]]) -> str:
    """The agent's text as the page joins it: every ``agent_message_chunk`` in order."""
    return "".join(
        e["data"]["content"]["text"]
        for e in events
        if e.get("type") == "session_update"
        and e["data"].get("sessionUpdate") == "agent_message_chunk"
    )


def event_ids(events: list[dict[str, Any]]) -> list[int]:
    """Ids of the real events of a snapshot (its ``history_truncated`` entry has none)."""
    return [e["id"] for e in events if e.get("id") is not None]


# -- the page ----------------------------------------------------------------------------


@dataclass
class SeenRequest:
    """A request the page sent, and the status of its response once it came."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    status: int | None = None


@dataclass
class Traffic:
    """Every request of a page (``page.on("request")``), with response statuses."""

    requests: list[SeenRequest] = field(default_factory=list)
    _by_request: dict[int, SeenRequest] = field(default_factory=dict)

    def attach(self, page: Page) -> Traffic:
        page.on("request", self._on_request)
        page.on("response", self._on_response)
        return self

    def _on_request(self, request: Request) -> None:
        url = urlsplit(request.url)
        seen = SeenRequest(request.method, url.path, url.query, dict(request.headers))
        self.requests.append(seen)
        self._by_request[id(request)] = seen

    def _on_response(self, response: Response) -> None:
        seen = self._by_request.get(id(response.request))
        if seen is not None:
            seen.status = response.status

    def streams(self) -> list[SeenRequest]:
        """The ``GET /session/<id>/events`` requests, in order."""
        return [r for r in self.requests if r.method == "GET" and r.path.endswith("/events")]

    def token_requests(self) -> list[SeenRequest]:
        """The ``POST /session/<id>/token`` requests, in order."""
        return [r for r in self.requests if r.method == "POST" and r.path.endswith("/token")]


class SessionPage:
    """The session page of one session in one browser page: actions and observations."""

    def __init__(self, page: Page, session: RemoteSession) -> None:
        self.page = page
        self.session = session
        self.traffic = Traffic().attach(page)
        self.console: list[str] = []
        page.on("console", lambda message: self.console.append(f"{message.type}: {message.text}"))

    def open(
        self, *, install_clock: bool = False, timeout_ms: int = WAIT_MS, query: str = ""
    ) -> SessionPage:
        """Log in through the admin form, land on the page (with ``?query``), wait until
        the stream is open.

        A page that does not get there fails with what it requested (path, status or
        "no answer") and what it logged, so a stall says where it stalled."""
        if install_clock:
            self.page.clock.install()
        self.login(urlsplit(self.session.page_url).path + (f"?{query}" if query else ""))
        try:
            self.expect_state("open", timeout_ms=timeout_ms)
        except AssertionError as error:
            requests = [
                f"{r.method} {r.path} -> {r.status if r.status is not None else 'no answer'}"
                for r in self.traffic.requests
                if not r.path.startswith("/static/")
            ]
            static = [r for r in self.traffic.requests if r.path.startswith("/static/")]
            pending = [r.path for r in static if r.status is None]
            raise AssertionError(
                f"{error}\nrequests: {requests}\nstatic files: {len(static)}, "
                f"unanswered: {pending}\nconsole: {self.console[-20:]}"
            ) from None
        return self

    def login(self, next_path: str) -> None:
        """Log in as ``operator`` with the admin login form; land on ``next_path``."""
        origin = self.session.browser_origin
        self.page.goto(f"{origin}/admin/login/?next={urllib.parse.quote(next_path)}")
        self.page.fill("#id_username", USERNAME)
        self.page.fill("#id_password", PASSWORD)
        self.page.click("input[type=submit]")
        self.page.wait_for_url(f"{origin}{next_path}")

    @property
    def badge(self) -> Any:
        return self.page.locator("#state-badge")

    def expect_state(self, state: str, timeout_ms: int = WAIT_MS) -> None:
        expect(self.badge).to_have_attribute("data-state", state, timeout=timeout_ms)

    def log_ids(self) -> list[int]:
        """The ids of the event rows of the frame log, top to bottom; a compacted row
        ``a–b`` (docs/protocol.md, "Compacted history") stands for every id from a to b."""
        ids: list[int] = self.page.eval_on_selector_all(
            "#frame-log tbody tr[data-id]",
            """rows => rows.flatMap(r => {
                const [a, b] = r.dataset.id.split("–").map(Number);
                return b === undefined ? [a] : Array.from({length: b - a + 1}, (_, i) => a + i);
            })""",
        )
        return ids

    def log_types(self) -> list[str]:
        """The type of every row of the frame log (events, synthetic and local rows)."""
        types: list[str] = self.page.eval_on_selector_all(
            "#frame-log tbody tr", "rows => rows.map(r => r.dataset.type)"
        )
        return types

    def wait_for_id(self, event_id: int, timeout_ms: int = WAIT_MS) -> None:
        """Wait until the frame log's last event row has ``event_id`` (alone, or as the end
        of a compacted row ``a–b``)."""
        expect(self.page.locator("#frame-log tbody tr[data-id]").last).to_have_attribute(
            "data-id", re.compile(rf"^(\d+–)?{event_id}$"), timeout=timeout_ms
        )

    def wait_for_row(self, event_id: int, timeout_ms: int = WAIT_MS) -> None:
        """Wait until the frame log has a row for ``event_id``."""
        expect(self.page.locator(f'#frame-log tbody tr[data-id="{event_id}"]')).to_have_count(
            1, timeout=timeout_ms
        )

    def agent_text(self) -> str:
        """The text of every agent message of the transcript, joined."""
        texts: list[str] = self.page.eval_on_selector_all(
            "#transcript .msg-agent .msg-text", "nodes => nodes.map(n => n.textContent)"
        )
        return "".join(texts)

    def text(self, selector: str) -> str:
        return self.page.locator(selector).inner_text()

    def fake_now_ms(self) -> int:
        """The page's ``Date.now()`` (the fake clock's time when one is installed)."""
        now: int = self.page.evaluate("Date.now()")
        return now

    def freeze_clock(self) -> None:
        """Stop the page's timers (a reconnect cannot fire) until :meth:`advance_clock`."""
        self.page.clock.pause_at(self.fake_now_ms() + 1)

    def advance_clock(self, ms: int) -> None:
        """Fire every timer due in the next ``ms`` milliseconds, then let time flow again."""
        self.page.clock.run_for(ms)
        self.page.clock.resume()


def screenshot(page: Page, name: str) -> None:
    """Save ``<QWENWEB_SCREENSHOT_DIR>/<name>.png`` when that variable is set; else nothing."""
    if SCREENSHOT_DIR:
        directory = Path(SCREENSHOT_DIR)
        directory.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(directory / f"{name}.png"))


def number_in(text: str, pattern: str) -> int:
    """The integer captured by ``pattern`` (one group) in ``text``; fails when absent."""
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in {text!r}"
    return int(match.group(1))
