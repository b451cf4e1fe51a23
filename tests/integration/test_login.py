"""The login page for owners who are not staff (``/accounts/login/``, Django's LoginView).

The admin's own login refuses users without ``is_staff``; this page is where an owner
logs in to reach their session pages.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model

from tests.integration.conftest import Response, call, csrf_headers

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

PASSWORD = "a long enough password"


async def owner(username: str = "alice") -> Any:
    create_user = get_user_model().objects.create_user
    return await database_sync_to_async(create_user)(username=username, password=PASSWORD)


async def post_login(username: str, password: str, next_path: str = "") -> Response:
    body = urlencode({"username": username, "password": password, "next": next_path}).encode()
    headers = csrf_headers() | {"content-type": "application/x-www-form-urlencoded"}
    return await call("POST", "/accounts/login/", headers=headers, body=body)


async def test_the_login_page_is_a_form_for_everyone():
    response = await call("GET", "/accounts/login/", query="next=/sessions/")
    assert response.status == 200
    assert b'name="username"' in response.body
    assert b'name="password"' in response.body
    assert b'value="/sessions/"' in response.body


async def test_an_owner_who_is_not_staff_logs_in_and_is_sent_to_next(make_session):
    user = await owner()
    sid = await make_session(owner=user)
    response = await post_login("alice", PASSWORD, f"/sessions/{sid}/")
    assert response.status == 302
    assert response.headers["location"] == f"/sessions/{sid}/"
    cookie = response.headers["set-cookie"].split(";", 1)[0]
    page = await call("GET", f"/sessions/{sid}/", headers={"cookie": cookie})
    assert page.status == 200


async def test_without_next_the_login_goes_to_the_session_list():
    await owner()
    response = await post_login("alice", PASSWORD)
    assert (response.status, response.headers["location"]) == (302, "/sessions/")


async def test_a_wrong_password_shows_the_form_again_with_the_reason():
    await owner()
    response = await post_login("alice", "wrong")
    assert response.status == 200
    assert b"enter a correct username and password" in response.body
    assert b'role="alert"' in response.body


async def test_next_pointing_to_another_site_is_not_followed():
    await owner()
    response = await post_login("alice", PASSWORD, "https://evil.example/")
    assert (response.status, response.headers["location"]) == (302, "/sessions/")


@pytest.fixture
def fresh_login_counts() -> Iterator[None]:
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()  # (the counts live in the process's cache: other tests log in too)


async def test_after_too_many_wrong_passwords_even_the_right_one_is_refused(
    qwenweb_settings: Any, fresh_login_counts: None
):
    qwenweb_settings(LOGIN_MAX_FAILURES=3)
    await owner()
    for _ in range(3):
        assert (await post_login("alice", "wrong")).status == 200
    refused = await post_login("alice", PASSWORD)
    assert refused.status == 200  # the form again, no session
    assert "set-cookie" not in refused.headers or "sessionid" not in refused.headers["set-cookie"]
    await owner("bob")  # another username from the same address still logs in
    assert (await post_login("bob", PASSWORD)).status == 302
