"""Production settings (``DJANGO_DEBUG=0``): static files from ``python -m qwenweb.serve`` alone.

The production set-up: ``collectstatic`` into a ``STATIC_ROOT`` of the test's own (hashed
names, ``qwenweb.storage``), then the production entry point with the same settings. The
session page and the admin, fetched as a logged-in operator, reference only files the same
process serves (200, cached for a year), and the page's ES modules import hashed names
too. The only test of the suite that needs ``collectstatic``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urljoin

import pytest
from django.conf import settings

from tests.support.server import (
    REPO,
    RemoteSession,
    ServerProcess,
    free_port,
    serve_argv,
    server_env,
)
from tests.support.staff import StaffClient, staffed_database

pytestmark = [pytest.mark.e2e, pytest.mark.transport_only]

YEAR_S = 365 * 24 * 3600
STATIC_REF = re.compile(r'(?:src|href)="(/static/[^"]+)"')
JS_IMPORT = re.compile(r'^\s*import\s[^"\']*["\'](\.[^"\']+)["\']', re.MULTILINE)
HASHED = re.compile(r"\.[0-9a-f]{12}\.(?:js|css)$")


@pytest.fixture(scope="module")
def production_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("production")
    database = staffed_database(directory)
    env = server_env(
        database,
        DJANGO_DEBUG="0",
        # The test process's key, so that the tokens it issues are valid there.
        DJANGO_SECRET_KEY=settings.SECRET_KEY,
        DJANGO_STATIC_ROOT=str(directory / "static"),
    )
    # Every test here serves with DEBUG off, which needs collectstatic's manifest (a 404
    # page without it is a 500), whichever test runs first or alone.
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v0"],
        cwd=REPO, env=env, check=True, timeout=120,
    )  # fmt: skip
    return env


@pytest.fixture(scope="module")
def production_server(
    production_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    port = free_port()
    log = tmp_path_factory.mktemp("logs") / "serve-production.log"
    server = ServerProcess(serve_argv(port), port, production_env, log).start()
    yield server
    server.stop()


def fetch(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, dict(response.headers.items()), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers.items()), exc.read()


def check_static(base_url: str, path: str, seen: set[str]) -> None:
    """``path`` is served with a year's cache; follow a JS module's relative imports."""
    if path in seen:
        return
    seen.add(path)
    status, headers, body = fetch(f"{base_url}{path}")
    assert status == 200, path
    assert f"max-age={YEAR_S}" in headers.get("cache-control", ""), (path, headers)
    if path.endswith(".js"):
        for target in JS_IMPORT.findall(body.decode()):
            imported = urljoin(path, target)
            assert HASHED.search(imported), f"{path} imports the unhashed {target}"
            check_static(base_url, imported, seen)


@pytest.mark.timeout(120)
def test_page_and_admin_get_their_js_and_css_from_the_production_entry_point(
    production_server: ServerProcess,
) -> None:
    base = production_server.base_url
    staff = StaffClient(base).login()
    session = RemoteSession.create(base)
    seen: set[str] = set()
    for page in ("/admin/", "/admin/login/", f"/sessions/{session.id}/", "/"):
        html = staff.get_text(page)
        refs = STATIC_REF.findall(html)
        assert refs, f"{page} references no static file"
        for ref in refs:
            assert HASHED.search(ref) or not ref.endswith((".js", ".css")), ref
            check_static(base, ref, seen)
    assert any("admin/css/base." in path for path in seen)
    # session_page.js imports shared_stream.js, which imports sse.js, which imports
    # sse_parser.js: every level of imports is hashed and served.
    assert any("qwenweb/sse." in path for path in seen)
    assert any("qwenweb/sse_parser." in path for path in seen)
    # Django itself serves no /static/ with DEBUG off: what answered was granian's mount.
    status, _, _ = fetch(f"{base}/static/does-not-exist.js")
    assert status == 404


def test_production_without_collectstatic_exits_2(
    production_env: dict[str, str], tmp_path: Path
) -> None:
    env = {**production_env, "DJANGO_STATIC_ROOT": str(tmp_path / "empty")}
    result = subprocess.run(
        serve_argv(free_port()), cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "has no staticfiles.json: run `python manage.py collectstatic" in result.stderr


def test_daphne_says_it_serves_no_static_file(
    production_env: dict[str, str], tmp_path: Path
) -> None:
    port = free_port()
    log = tmp_path / "daphne.log"
    # An event log of its own: the module's granian server may hold the database's (one
    # process per log; a second server on it is refused at start).
    env = {**production_env, "QWENWEB_EVENT_LOG_PATH": str(tmp_path / "events.sqlite3")}
    server = ServerProcess(serve_argv(port, "--server", "daphne"), port, env, log).start()
    try:
        assert "daphne serves no static file with DEBUG off" in server.log()
        status, _, _ = fetch(f"{server.base_url}/static/qwenweb/sse.js")
        assert status == 404
    finally:
        server.stop()
