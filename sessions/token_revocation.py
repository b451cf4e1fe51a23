"""Revoking tokens: bump a version in the database, then tell the streams.

Entry points (synchronous: the admin, management commands, model signals):

- :func:`revoke_user_tokens` — every token of a user issued before now (``manage.py
  revoke_tokens --user``, the admin's user action); with ``inactive`` (the user was
  deactivated or deleted) also every login-session stream of the user;
- :func:`revoke_session_tokens` — every token of a session issued before now
  (``manage.py revoke_tokens --session``, the admin's session action);
- the ``User`` signals connected by :func:`connect_signals` (``SessionsConfig.ready``):
  saving an inactive user and deleting a user revoke the user's tokens.

How the news travels (docs/protocol.md, "Revocation"): the new version is written first;
once the transaction commits, this process's version cache drops the entries and the
backend ends the open streams that carry an older version (``Backend.revoke_blocking``:
here, and through Redis in every process). Requests verify tokens against versions at
most a second old, and every server process's sweep re-reads the versions of its open
streams twice a second, so a process that no message reaches still ends them within
about a second.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models.signals import post_delete, post_save, pre_save

from sessions import token_versions
from sessions.backends import get_backend
from sessions.backends.base import Revocation

__all__ = ["connect_signals", "revoke_session_tokens", "revoke_user_tokens"]

logger = logging.getLogger("qwenweb.auth")


def _announce(revocation: Revocation) -> None:
    token_versions.invalidate(user_id=revocation.user_id, session_id=revocation.session_id)
    get_backend().revoke_blocking(revocation)


def revoke_user_tokens(
    user_id: int, *, inactive: bool = False, exists: bool = True, demoted: bool = False
) -> int | None:
    """Revoke every token of the user issued so far; return the new version.

    ``inactive``: the user can no longer log in (deactivated, deleted): their login
    streams end too. ``demoted``: the user lost staff rights: their login streams on
    other users' sessions end too (those rights opened them). ``exists`` False (the user
    was deleted): no version is written (the user's tokens fail their check already) and
    None is returned. The announcement
    happens after the transaction commits. Raises ``django.db.DatabaseError``.
    """
    version = token_versions.bump_user_version(user_id) if exists else None
    revocation = Revocation(
        user_id=user_id, user_version=version, user_inactive=inactive, user_demoted=demoted
    )
    transaction.on_commit(lambda: _announce(revocation))
    logger.info(
        "tokens_revoked user=%d version=%s inactive=%s", user_id, version, inactive or not exists
    )
    return version


def revoke_session_tokens(session_id: str) -> int | None:
    """Revoke every token of the session issued so far; return the new version (None:
    no such session). Raises ``django.db.DatabaseError``."""
    version = token_versions.bump_session_version(session_id)
    if version is None:
        return None
    revocation = Revocation(session_id=session_id, session_version=version)
    transaction.on_commit(lambda: _announce(revocation))
    logger.info("tokens_revoked session=%s version=%d", session_id, version)
    return version


def _user_saving(sender: Any, instance: Any, update_fields: Any = None, **kwargs: Any) -> None:
    # What the row says before the save: a change of rights is told apart from a save
    # (a save of other fields, e.g. login's last_login, costs no query).
    if update_fields is not None and "is_staff" not in update_fields:
        return
    if instance.pk is not None and instance.is_active and not instance.is_staff:
        instance._qwenweb_was_staff = sender.objects.filter(pk=instance.pk, is_staff=True).exists()


def _user_saved(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    if created:
        return
    if not instance.is_active:
        revoke_user_tokens(instance.pk, inactive=True)
    elif getattr(instance, "_qwenweb_was_staff", False):
        instance._qwenweb_was_staff = False
        revoke_user_tokens(instance.pk, demoted=True)


def _user_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    revoke_user_tokens(instance.pk, inactive=True, exists=False)


def connect_signals() -> None:
    """Revoke a user's tokens when the user is saved inactive, loses staff rights, or is
    deleted (idempotent)."""
    user_model = get_user_model()
    pre_save.connect(_user_saving, sender=user_model, dispatch_uid="qwenweb-rights-before")
    post_save.connect(_user_saved, sender=user_model, dispatch_uid="qwenweb-revoke-inactive")
    post_delete.connect(_user_deleted, sender=user_model, dispatch_uid="qwenweb-revoke-deleted")
