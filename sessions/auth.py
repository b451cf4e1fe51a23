"""Bearer tokens for the session API, signed with ``django.core.signing``.

A token is ``signing.dumps({"sid": <session id>, "scp": [<scope>, ...], "sub": <subject>,
"uid": <user id>, "uv": <user token version>, "sv": <session token version>},
salt=TOKEN_SALT)``: salted, timestamped, and checked with ``max_age`` (the
``TOKEN_LIFETIME_S`` setting) on every use. Scopes: ``read`` (stream and load a session),
``publish`` (publish into and close it) and ``create`` (create sessions; its ``sid`` is
``"*"``). ``uid``/``uv``/``sv`` are optional: a token issued before revocation existed has
none and keeps working until it expires; a token is *revoked* when its versions are
older than the database's (:mod:`sessions.token_versions`). Rules: EB-12 and
docs/protocol.md, "Endpoints" and "Revocation".

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

from sessions import token_versions
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
    "check_access_by_row",
    "check_token_scope",
    "ensure_current",
    "is_operator",
    "issue_current_token",
    "issue_token",
    "parse_bearer",
    "verify_token",
]

TOKEN_SALT: Final = "qwenweb.sessions.token"  # noqa: S105 - a salt, not a secret
SCOPES: Final = frozenset({"read", "publish", "create"})
ANY_SESSION: Final = "*"
_MAX_TOKEN_LENGTH: Final = 4096
_SCOPE_SETS: dict[frozenset[str], frozenset[str]] = {}
"""One shared frozenset per subset of :data:`SCOPES` (at most 8): every open stream holds
its token's claims, and a set per stream was 0.2 KiB of an idle one (issue 23)."""


def _shared_scopes(scopes: frozenset[str]) -> frozenset[str]:
    return _SCOPE_SETS.setdefault(scopes, scopes)  # (subsets of SCOPES only: bounded)


class TokenError(Exception):
    """Raised when a bearer token is missing, malformed, forged or expired (a 401)."""


TOKEN_REVOKED_MESSAGE: Final = "this token was revoked: ask for a new one"  # noqa: S105


@dataclass(frozen=True, slots=True)
class TokenClaims:
    """What a verified token grants: one session (or ``"*"``), a set of scopes, a subject.

    ``user_id``, ``user_version``, ``session_version``: the ``uid``, ``uv``, ``sv`` claims
    (None in a token issued before they existed). ``expires_at``: when it stops being
    valid (epoch seconds: its signing time plus the lifetime it was verified with).
    """

    session_id: str
    scopes: frozenset[str]
    subject: str
    user_id: int | None = None
    user_version: int | None = None
    session_version: int | None = None
    expires_at: float | None = None

    def grants(self, session_id: str, scope: str) -> bool:
        """Return whether this token allows ``scope`` on ``session_id``. Never raises."""
        return scope in self.scopes and self.session_id in (session_id, ANY_SESSION)


def issue_token(
    session_id: str,
    scopes: Iterable[str],
    subject: str = "",
    *,
    user_id: int | None = None,
    user_version: int | None = None,
    session_version: int | None = None,
    salt: str = TOKEN_SALT,
) -> str:
    """Return a signed token for ``session_id`` (``"*"`` with the ``create`` scope).

    ``user_id``/``user_version``/``session_version`` become the ``uid``/``uv``/``sv``
    claims when given (:func:`issue_current_token` reads them from the database).

    Raises:
        ValueError: an unknown scope, or no scope at all.
    """
    scope_list = sorted(set(scopes))
    unknown = set(scope_list) - SCOPES
    if not scope_list or unknown:
        raise ValueError(f"scopes must be a non-empty subset of {sorted(SCOPES)}; got {scope_list}")
    payload: dict[str, Any] = {"sid": session_id, "scp": scope_list, "sub": subject}
    for name, value in (("uid", user_id), ("uv", user_version), ("sv", session_version)):
        if value is not None:
            payload[name] = value
    return signing.dumps(payload, salt=salt)


def issue_current_token(
    session_id: str, scopes: Iterable[str], subject: str = "", *, user_id: int | None = None
) -> str:
    """Return a token carrying the current token versions of ``user_id`` and the session.

    Synchronous: two small queries (run it in a worker thread from async code). A
    ``create`` token (``session_id == "*"``) carries no session version.
    """
    session = None if session_id == ANY_SESSION else session_id
    user_version, session_version = token_versions.versions_for_new_token_sync(user_id, session)
    return issue_token(
        session_id,
        scopes,
        subject,
        user_id=user_id,
        user_version=user_version if user_id is not None else None,
        session_version=session_version if session is not None else None,
    )


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
        # The signature covers the timestamp: it is the token's signing time.
        signed_at = signing.b62_decode(token.rsplit(":", 2)[1])
    except signing.SignatureExpired:
        raise TokenError("token expired") from None
    except (signing.BadSignature, ValueError, UnicodeError):
        raise TokenError("invalid token") from None
    if not isinstance(payload, dict):
        raise TokenError("invalid token")
    sid, scopes, subject = payload.get("sid"), payload.get("scp"), payload.get("sub", "")
    versions = [payload.get(name) for name in ("uid", "uv", "sv")]
    if (
        not isinstance(sid, str)
        or not isinstance(scopes, list)
        or not all(isinstance(s, str) for s in scopes)
        or not isinstance(subject, str)
        or not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in versions)
    ):
        raise TokenError("invalid token")
    return TokenClaims(
        session_id=sid,
        scopes=_shared_scopes(frozenset(scopes) & SCOPES),
        subject=subject,
        user_id=versions[0],
        user_version=versions[1],
        session_version=versions[2],
        expires_at=float(signed_at + lifetime),
    )


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
    authorization: str | bytes | None,
    load_user: Callable[[], Awaitable[Any]],
    *,
    check_versions: bool = True,
) -> Principal:
    """Return who is calling (EB-12): the bearer token of ``authorization`` when given,
    else the logged-in user that ``load_user()`` returns (None or anonymous: nobody).

    ``check_versions`` False leaves the revocation check to the caller
    (:func:`ensure_current`): the stream answers a closed session's 204 whatever the
    token's version.

    Raises:
        ApiError: 401 ``unauthorized`` for a bad or expired token, or for nobody (an
            inactive user counts as nobody); 401 ``token_revoked`` for a revoked token.
    """
    if authorization is not None:
        try:
            claims = verify_token(parse_bearer(authorization))
        except TokenError as exc:
            raise ApiError(401, "unauthorized", str(exc)) from None
        principal = Principal(claims, None, False, claims.subject)
        if check_versions:
            await ensure_current(principal)
        return principal
    user = await load_user()
    if (
        user is None
        or not getattr(user, "is_authenticated", False)
        or not getattr(user, "is_active", False)
    ):
        raise ApiError(401, "unauthorized", AUTHENTICATION_REQUIRED)
    return Principal(None, user.pk, bool(user.is_staff), user.get_username())


async def ensure_current(principal: Principal) -> None:
    """Raise unless the principal's token is still current (not revoked); nothing for a
    logged-in user (their check is :func:`authenticate`'s, on every request).

    Reads the versions through the cache of :mod:`sessions.token_versions` (at most 1 s
    old; one or two queries on a miss).

    Raises:
        ApiError: 401 ``token_revoked`` (the user is gone or inactive, or a version is
            older than the database's).
        django.db.DatabaseError: the database failed.
    """
    claims = principal.claims
    if claims is None:
        return
    session = None if claims.session_id == ANY_SESSION else claims.session_id
    user, session_version = await token_versions.current_versions(claims.user_id, session)
    if token_versions.is_stale(
        user_id=claims.user_id,
        user_version=claims.user_version,
        session_version=claims.session_version,
        user=user,
        session_token_version=session_version,
    ):
        raise ApiError(
            401, "token_revoked", TOKEN_REVOKED_MESSAGE, log_extra=f" uid={claims.user_id}"
        )


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


async def check_access_by_row(principal: Principal, session_id: str, scope: str) -> None:
    """:func:`check_access` with the owner read from the session's database row.

    For a request the event store cannot serve now (a 503): a logged-in user who may not
    see the session must get the 404 of an unknown one first, or an outage would tell
    which ids exist. Raises ``ApiError`` 404/403 as :func:`check_access` (404 as well when
    there is no row); ``django.db.DatabaseError`` when the database fails.
    """
    from sessions.queries import session_row

    row = await session_row(session_id)
    if row is None:
        raise ApiError(404, "not_found", "unknown session")
    check_access(principal, session_id, row.owner_id, scope)
