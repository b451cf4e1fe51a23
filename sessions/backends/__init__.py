"""Backends: where live sessions are held, chosen once per process from settings.

``QWENWEB["BACKEND"]`` (or ``$QWENWEB_BACKEND``) is ``"durable"`` (the default, one
process, history in an event log on disk), ``"memory"`` (one process, nothing outlives
it), ``"redis"`` (several processes share sessions through Redis) or the dotted
path of a :class:`~sessions.backends.base.Backend` subclass of your own; it is built the
way Channels builds its channel layer (``import_string``), with the effective settings
and the process's :data:`sessions.hooks.hooks`. This is the only place that knows which
backend is on: everything else calls :func:`get_backend` and asks the backend
(``supports_multiple_processes``, ``health()``, ...).
"""

from __future__ import annotations

from typing import Final

from django.utils.module_loading import import_string

from sessions.backends.base import Backend
from sessions.conf import get_config
from sessions.hooks import hooks

__all__ = [
    "BACKEND_ALIASES",
    "BackendHandler",
    "backends",
    "check_can_start",
    "get_backend",
    "resolve_backend",
]

BACKEND_ALIASES: Final = {
    "memory": "sessions.backends.memory.MemoryBackend",
    "redis": "sessions.backends.redis.RedisBackend",
    "durable": "sessions.backends.durable.DurableBackend",
}


def resolve_backend(name: str) -> type[Backend]:
    """Return the backend class that the setting ``name`` names (an alias or a dotted path).

    Raises:
        ImportError: the path cannot be imported.
        TypeError: it names something that is not a ``Backend`` subclass.
    """
    found = import_string(BACKEND_ALIASES.get(name, name))
    if not (isinstance(found, type) and issubclass(found, Backend)):
        raise TypeError(f"{name!r} is not a subclass of sessions.backends.base.Backend")
    return found


class BackendHandler:
    """Builds the process's backend on first use and keeps it (like Channels'
    ``channel_layers``); tests install one of their own with :meth:`set`."""

    def __init__(self) -> None:
        self._backend: Backend | None = None

    def get(self) -> Backend:
        """Return the backend, building it from the settings the first time."""
        if self._backend is None:
            config = get_config()
            self._backend = resolve_backend(config.backend)(config, hooks)
        return self._backend

    def set(self, backend: Backend | None) -> Backend | None:
        """Install ``backend`` (None: build from settings on next use); return the old one."""
        old, self._backend = self._backend, backend
        return old

    @property
    def current(self) -> Backend | None:
        """The backend if one was built (never builds one)."""
        return self._backend


backends = BackendHandler()
"""The process's backend handler."""


def get_backend() -> Backend:
    """Return this process's backend (built from settings on first use)."""
    return backends.get()


def check_can_start() -> None:
    """Ask the configured backend whether it can serve, before a server starts
    (``Backend.check_can_start``; builds no backend). Raises
    :class:`~sessions.backends.errors.BackendStartError` with one line."""
    config = get_config()
    resolve_backend(config.backend).check_can_start(config)
