"""Bearer tokens for the session API, signed with ``django.core.signing``.

A token is ``signing.dumps({"sid": <session id>, "scp": [<scope>, ...], "sub": <subject>},
salt=TOKEN_SALT)``: salted, timestamped, and checked with ``max_age`` (the
``TOKEN_LIFETIME_S`` setting) on every use. Scopes: ``read`` (stream and load a session),
``publish`` (publish into and close it) and ``create`` (create sessions; its ``sid`` is
``"*"``). Spec: EB-12 and section 5.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from django.core import signing

from sessions.conf import get_config

__all__ = [
    "ANY_SESSION",
    "SCOPES",
    "TOKEN_SALT",
    "TokenClaims",
    "TokenError",
    "issue_token",
    "parse_bearer",
    "verify_token",
]

TOKEN_SALT: Final = "qwenweb.sessions.token"  # noqa: S105 - a salt, not a secret
SCOPES: Final = frozenset({"read", "publish", "create"})
ANY_SESSION: Final = "*"
_MAX_TOKEN_LENGTH: Final = 4096


class TokenError(Exception):
    """Raised when a bearer token is missing, malformed, forged or expired (a 401)."""


@dataclass(frozen=True, slots=True)
class TokenClaims:
    """What a verified token grants: one session (or ``"*"``), a set of scopes, a subject."""

    session_id: str
    scopes: frozenset[str]
    subject: str

    def grants(self, session_id: str, scope: str) -> bool:
        """Return whether this token allows ``scope`` on ``session_id``. Never raises."""
        return scope in self.scopes and self.session_id in (session_id, ANY_SESSION)


def issue_token(
    session_id: str, scopes: Iterable[str], subject: str = "", *, salt: str = TOKEN_SALT
) -> str:
    """Return a signed token for ``session_id`` (``"*"`` with the ``create`` scope).

    Raises:
        ValueError: an unknown scope, or no scope at all.
    """
    scope_list = sorted(set(scopes))
    unknown = set(scope_list) - SCOPES
    if not scope_list or unknown:
        raise ValueError(f"scopes must be a non-empty subset of {sorted(SCOPES)}; got {scope_list}")
    return signing.dumps({"sid": session_id, "scp": scope_list, "sub": subject}, salt=salt)


def verify_token(token: str, *, max_age_s: int | None = None) -> TokenClaims:
    """Verify ``token`` and return its claims.

    Args:
        token: the string after ``Bearer ``.
        max_age_s: lifetime in seconds; default the ``TOKEN_LIFETIME_S`` setting.

    Raises:
        TokenError: forged, tampered, malformed or older than ``max_age_s``; the message
            says which, without echoing the token.
    """
    if not token or len(token) > _MAX_TOKEN_LENGTH:
        raise TokenError("malformed token")
    lifetime = get_config().token_lifetime_s if max_age_s is None else max_age_s
    try:
        payload = signing.loads(token, salt=TOKEN_SALT, max_age=lifetime)
    except signing.SignatureExpired:
        raise TokenError("token expired") from None
    except (signing.BadSignature, ValueError, UnicodeError):
        raise TokenError("invalid token") from None
    if not isinstance(payload, dict):
        raise TokenError("invalid token")
    sid, scopes, subject = payload.get("sid"), payload.get("scp"), payload.get("sub", "")
    if (
        not isinstance(sid, str)
        or not isinstance(scopes, list)
        or not all(isinstance(s, str) for s in scopes)
        or not isinstance(subject, str)
    ):
        raise TokenError("invalid token")
    return TokenClaims(session_id=sid, scopes=frozenset(scopes) & SCOPES, subject=subject)


def parse_bearer(header: str | bytes | None) -> str:
    """Return the token of an ``Authorization: Bearer <token>`` value (scheme case-insensitive).

    Raises:
        TokenError: no header, another scheme, or no token after the scheme.
    """
    if header is None:
        raise TokenError("missing Authorization header")
    if isinstance(header, bytes):
        header = header.decode("latin-1")
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise TokenError("Authorization must use the Bearer scheme")
    token = token.strip()
    if not token or " " in token:
        raise TokenError("malformed bearer token")
    return token
