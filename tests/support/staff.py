"""A staff user for end-to-end tests: created in the server's database, logged in over HTTP.

The login goes through the admin's login form (CSRF cookie and token, like a browser), and
the session cookie is kept in a cookie jar for the following requests.
"""

from __future__ import annotations

import http.cookiejar
import json
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.server import REPO, migrate, server_env

USERNAME = "operator"
PASSWORD = "operator-password-1"


def create_staff_user(database: Path, username: str = USERNAME, password: str = PASSWORD) -> None:
    """``createsuperuser --noinput`` in ``database`` (bounded: 120 s)."""
    subprocess.run(
        [sys.executable, "manage.py", "createsuperuser", "--noinput",
         "--username", username, "--email", f"{username}@example.com"],
        cwd=REPO,
        env=server_env(database, DJANGO_SUPERUSER_PASSWORD=password),
        check=True,
        timeout=120,
        stdout=subprocess.DEVNULL,
    )  # fmt: skip


def staffed_database(directory: Path) -> Path:
    """A migrated SQLite file ``directory/db.sqlite3`` with the staff user (bounded)."""
    path = directory / "db.sqlite3"
    migrate(path)
    create_staff_user(path)
    return path


@dataclass
class StaffClient:
    """An HTTP client logged in as staff on the server at ``base_url``."""

    base_url: str
    jar: http.cookiejar.CookieJar = field(default_factory=http.cookiejar.CookieJar)

    def __post_init__(self) -> None:
        self._opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))

    def login(self, username: str = USERNAME, password: str = PASSWORD) -> StaffClient:
        """Log in through ``/admin/login/``; raises AssertionError if the form refuses."""
        form = self.get_text("/admin/login/")
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
        assert match, "no CSRF token in the login form"
        body = urllib.parse.urlencode(
            {
                "csrfmiddlewaretoken": match.group(1),
                "username": username,
                "password": password,
                "next": "/admin/",
            }
        ).encode()
        request = urllib.request.Request(f"{self.base_url}/admin/login/", data=body)
        request.add_header("Referer", f"{self.base_url}/admin/login/")
        with self._opener.open(request, timeout=10) as response:
            assert response.url.endswith("/admin/"), f"login refused: ended on {response.url}"
        return self

    def post_form(self, path: str, fields: dict[str, Any]) -> str:
        """POST ``fields`` (values may be lists) to ``path`` with the CSRF token of the form
        at ``path``, as a browser submits it; return the page it ends on (after redirects)."""
        match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', self.get_text(path))
        assert match, f"no CSRF token in {path}"
        body = urllib.parse.urlencode(
            {**fields, "csrfmiddlewaretoken": match.group(1)}, doseq=True
        ).encode()
        request = urllib.request.Request(f"{self.base_url}{path}", data=body)
        request.add_header("Referer", f"{self.base_url}{path}")
        with self._opener.open(request, timeout=30) as response:
            return str(response.read().decode())

    def get_text(self, path: str) -> str:
        with self._opener.open(f"{self.base_url}{path}", timeout=10) as response:
            return str(response.read().decode())

    def get_json(self, path: str) -> Any:
        try:
            with self._opener.open(f"{self.base_url}{path}", timeout=10) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"GET {path}: {exc.code} {exc.read()[:200]!r}") from None

    def csrf_token(self) -> str:
        """The ``csrftoken`` cookie the login form set (what a page sends as ``X-CSRFToken``)."""
        for cookie in self.jar:
            if cookie.name == "csrftoken":
                return str(cookie.value)
        raise AssertionError("no csrftoken cookie: log in first")

    def call_json(self, method: str, path: str, *, csrf: bool = True) -> tuple[int, Any]:
        """``method path`` with the login cookie (and the CSRF header); ``(status, JSON)``."""
        data = b"" if method == "POST" else None
        request = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method)
        request.add_header("Accept", "application/json")
        if csrf:
            request.add_header("X-CSRFToken", self.csrf_token())
        try:
            with self._opener.open(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, json.loads(raw) if raw else None
