"""Bearer tokens for the session API, signed with ``django.core.signing``.

A token is ``signing.dumps({"sid": <session id>, "scp": [<scope>, ...], "sub": <subject>},
salt=TOKEN_SALT)``: salted, timestamped, and checked with ``max_age`` (the
``TOKEN_LIFETIME_S`` setting) on every use. Scopes: ``read`` (stream and load a session),
``publish`` (publish into and close it) and ``create`` (create sessions; its ``sid`` is
``"*"``). Rules: EB-12 and docs/protocol.md, "Endpoints".

The access policy lives here, once, for the stream route, the API views, the pages and
the dashboard: :func:`authenticate` says who is calling (a bearer token, or an *active*
logged-in user), :func:`check_access` whether they may act on a session (the token
grants it, or the user owns the session or is active staff; a session without an owner
is for staff only; a user who may not see a session gets the 404 of an unknown one),
:func:`is_operator` whether a user is active staff.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from django.core import signing

from sessions.conf import get_config
from sessions.errors import ApiError

__all__ = [
    "ANY_SESSION",
    "SCOPES",
    "TOKEN_SALT",
    "Principal",
    "TokenClaims",
    "TokenError",
    "authenticate",
    "can_view",
    "check_access",
    "check_token_scope",
    "is_operator",
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


# -- the access policy ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a verified token's claims, or an active logged-in user.

    ``user_id`` and ``is_staff`` are None/False for a token; ``name`` is the token's
    subject or the user name.
    """

    claims: TokenClaims | None
    user_id: int | None
    is_staff: bool
    name: str

    @property
    def auth(self) -> str:
        """``"token"`` or ``"login"`` (what the connection records call it)."""
        return "token" if self.claims is not None else "login"


AUTHENTICATION_REQUIRED: Final = "authentication required: send Authorization: Bearer <token>"


def is_operator(user: Any) -> bool:
    """Return whether ``user`` is an active staff user (operators). Never raises."""
    return bool(
        user is not None
        and getattr(user, "is_authenticated", False)
        and getattr(user, "is_active", False)
        and getattr(user, "is_staff", False)
    )


def can_view(user: Any, owner_id: int | None) -> bool:
    """Return whether the logged-in ``user`` may see a session owned by ``owner_id``:
    active staff, or its active owner (a session without an owner is staff-only)."""
    if user is None or not getattr(user, "is_authenticated", False):
        return False
    if not getattr(user, "is_active", False):
        return False
    return bool(user.is_staff or (owner_id is not None and owner_id == user.pk))


async def authenticate(
    authorization: str | bytes | None, load_user: Callable[[], Awaitable[Any]]
) -> Principal:
    """Return who is calling (EB-12): the bearer token of ``authorization`` when given,
    else the logged-in user that ``load_user()`` returns (None or anonymous: nobody).

    Raises:
        ApiError: 401 ``unauthorized`` for a bad or expired token, or for nobody (an
            inactive user counts as nobody).
    """
    if authorization is not None:
        try:
            claims = verify_token(parse_bearer(authorization))
        except TokenError as exc:
            raise ApiError(401, "unauthorized", str(exc)) from None
        return Principal(claims, None, False, claims.subject)
    user = await load_user()
    if (
        user is None
        or not getattr(user, "is_authenticated", False)
        or not getattr(user, "is_active", False)
    ):
        raise ApiError(401, "unauthorized", AUTHENTICATION_REQUIRED)
    return Principal(None, user.pk, bool(user.is_staff), user.get_username())


def check_token_scope(principal: Principal, session_id: str, scope: str) -> None:
    """For a token: raise a 403 unless it grants ``scope`` on ``session_id``.

    Called before anything is loaded, so a token learns nothing about sessions it has
    no access to. Does nothing for a logged-in user (their check needs the owner).
    """
    if principal.claims is not None and not principal.claims.grants(session_id, scope):
        raise ApiError(403, "forbidden", f"this token does not grant {scope} access here")


def check_access(principal: Principal, session_id: str, owner_id: int | None, scope: str) -> None:
    """Raise unless ``principal`` may use ``scope`` on the session.

    A token must grant it (else 403: a token only ever names its own session, so the
    refusal tells it nothing new). A user must be staff or the session's owner
    (``owner_id``; None: nobody owns it, staff only); anyone else gets exactly the 404 of
    a session that does not exist, so a logged-in user cannot tell which ids exist.

    Raises:
        ApiError: 403 ``forbidden`` (a token), 404 ``not_found`` (a user).
    """
    if principal.claims is not None:
        check_token_scope(principal, session_id, scope)
    elif not (principal.is_staff or (owner_id is not None and owner_id == principal.user_id)):
        raise ApiError(404, "not_found", "unknown session")
