"""Token claims and what a revocation ends (docs/protocol.md, "Revocation")."""

from __future__ import annotations

import time

from sessions.auth import issue_token, verify_token
from sessions.backends.revoked_streams import Revocation
from sessions.token_versions import UserState, is_stale


def _token_stream(uid=7, uv=1, sv=0) -> dict[str, object]:
    return {"auth": "token", "userId": uid, "userVersion": uv, "sessionVersion": sv}


def test_new_tokens_carry_user_id_and_versions() -> None:
    claims = verify_token(
        issue_token("s", ["read"], "a", user_id=7, user_version=2, session_version=3)
    )
    assert (claims.user_id, claims.user_version, claims.session_version) == (7, 2, 3)


def test_a_token_without_versions_still_verifies() -> None:
    claims = verify_token(issue_token("s", ["read"], "a"))
    assert (claims.user_id, claims.user_version, claims.session_version) == (None, None, None)


def test_claims_say_when_the_token_expires() -> None:
    claims = verify_token(issue_token("s", ["read"]), max_age_s=60)
    assert claims.expires_at is not None
    assert 58 <= claims.expires_at - time.time() <= 60


def test_an_older_user_version_or_an_inactive_user_is_stale() -> None:
    def stale(state: UserState, uv: int) -> bool:
        return is_stale(user_id=7, user_version=uv, session_version=0, user=state,
                        session_token_version=0)  # fmt: skip

    assert stale(UserState(True, 2), 1)
    assert stale(UserState(False, 1), 1)
    assert not stale(UserState(True, 1), 1)


def test_a_legacy_token_counts_as_session_version_zero() -> None:
    kwargs = {"user_id": None, "user_version": None, "session_version": None, "user": None}
    assert not is_stale(**kwargs, session_token_version=0)
    assert is_stale(**kwargs, session_token_version=1)


def test_a_user_revocation_ends_only_that_users_older_token_streams() -> None:
    revocation = Revocation(user_id=7, user_version=2)
    assert revocation.ends("s", _token_stream(uv=1))
    assert not revocation.ends("s", _token_stream(uv=2))
    assert not revocation.ends("s", _token_stream(uid=8, uv=1))
    assert not revocation.ends("s", {"auth": "login", "userId": 7})


def test_a_deactivation_ends_the_users_login_streams_too() -> None:
    revocation = Revocation(user_id=7, user_version=2, user_inactive=True)
    assert revocation.ends("s", {"auth": "login", "userId": 7})


def test_a_session_revocation_ends_its_older_token_streams_legacy_ones_included() -> None:
    revocation = Revocation(session_id="s", session_version=1)
    assert revocation.ends("s", _token_stream(sv=0))
    assert revocation.ends("s", _token_stream(uid=None, uv=None, sv=None))
    assert not revocation.ends("other", _token_stream(sv=0))
    assert not revocation.ends("s", _token_stream(sv=1))


def test_a_revocation_survives_the_control_channel() -> None:
    revocation = Revocation(user_id=7, user_version=3, user_inactive=True)
    assert Revocation.from_message(revocation.message()) == revocation
    assert Revocation.from_message({"op": "revoke", "user_id": "x"}) is None
