"""granian for ``python -m qwenweb.serve``: the one place that builds its options.

:func:`granian_options` turns the command line and the settings into the keyword
arguments of granian's documented Python API (``granian.Granian``, i.e.
``granian.server.Server``); :func:`serve` runs it. The benchmark's ``qwenweb-serve``
contender and the end-to-end tests start ``python -m qwenweb.serve`` itself, so they run
exactly these options.

What is set, and why (docs/deployment.md, "The server"):

- ASGI interface with lifespan (``Interfaces.ASGI``), uvloop. Over TLS, HTTP/1.1 and
  HTTP/2 by ALPN (``HTTPModes.auto``); in clear text HTTP/1.1 only (``HTTPModes.http1``):
  browsers speak HTTP/2 only over TLS, and granian's detection of a clear-text HTTP/2
  preface costs each connection about 12 KiB more (42.0 against 30.3 KiB per idle
  stream at 1,000 streams, docs/benchmarks.md, issue 23).
- Limits for long-lived streams: the listen backlog is ``SERVER_BACKLOG`` (default 4096),
  and granian's *backpressure* (the requests one worker serves at once; by default
  backlog / workers, about 1,000, so the 1,001st stream would wait for ever) is the
  process's file-descriptor limit, since every open stream holds one descriptor anyway.
- ``REQUEST_HEADER_TIMEOUT_S`` as ``--http1-header-read-timeout``.
- With ``DEBUG`` off, ``STATIC_ROOT`` mounted at ``STATIC_URL`` with a cache lifetime of
  one year (the production settings give every file a hashed name); with DEBUG on, Django
  serves ``/static/`` from the app folders (nothing to collect).
- ``workers_kill_timeout``: a worker that has not stopped this long after SIGTERM is
  killed, so a stop never hangs (the shutdown sequence itself is bounded by
  ``sessions.ops.lifecycle.SHUTDOWN_TIMEOUT_S``).
- Each worker dies with the main process, even after a ``kill -9`` of it
  (:func:`load_in_worker`, :mod:`sessions.ops.parent_death`).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sessions.conf import QwenwebConfig

__all__ = [
    "APPLICATION",
    "STATIC_MAX_AGE_S",
    "StaticMount",
    "granian_options",
    "load_in_worker",
    "proxied_application",
    "serve",
]

APPLICATION: Final = "qwenweb.asgi:application"
PROXIED_APPLICATION: Final = "qwenweb.granian_server:proxied_application"

STATIC_MAX_AGE_S: Final = 365 * 24 * 3600
"""Cache lifetime of the static files served by granian (names are hashed in production)."""

KILL_MARGIN_S: Final = 1
"""A worker still alive ``SHUTDOWN_TIMEOUT_S`` + this after SIGTERM is killed (the
sequence takes at most ``SHUTDOWN_TIMEOUT_S`` plus the final writes). granian itself would
wait for every idle HTTP/2 connection to close."""

DRAIN_MARGIN_S: Final = 0.5
"""The main process stops its workers ``DRAIN_S`` + this after the first SIGTERM (the
drain's last stream ends within ``DRAIN_S``). So the whole tree is gone within ``DRAIN_S``
+ this + ``workers_kill_timeout`` (3 s) + the exits, within ``DRAIN_S`` + 5 s."""

MAX_BACKPRESSURE: Final = 1_048_576

logger = logging.getLogger("qwenweb.serve")


@dataclass(frozen=True, slots=True)
class StaticMount:
    """``route`` (``/static``) served from the directory ``path`` by granian."""

    route: str
    path: Path


def granian_options(
    *,
    bind: str,
    port: int,
    workers: int,
    config: QwenwebConfig,
    fd_limit: int,
    certfile: Path | None = None,
    keyfile: Path | None = None,
    static: StaticMount | None = None,
    proxy_headers: bool = False,
) -> dict[str, Any]:
    """The keyword arguments of ``granian.Granian(...)`` for this deployment.

    Args:
        bind, port: the address to listen on.
        workers: worker processes (each with its own event loop and bus mirror).
        config: the effective settings (``REQUEST_HEADER_TIMEOUT_S``, ``SERVER_BACKLOG``).
        fd_limit: this process's ``RLIMIT_NOFILE`` soft limit (after raising it): the
            number of requests one worker may serve at once.
        certfile, keyfile: PEM certificate chain and PKCS#8 key; both or neither. With
            them granian speaks TLS and offers HTTP/2 by ALPN.
        static: where the static files are, or None (Django serves them, DEBUG only).
        proxy_headers: trust ``X-Forwarded-For`` / ``-Proto`` from 127.0.0.1 (behind a
            proxy on this machine).

    Returns a dict for ``Granian(**options)``. Never raises.
    """
    from granian.constants import HTTPModes, Interfaces, Loops, SSLProtocols
    from granian.http import HTTP1Settings, HTTP2Settings

    from sessions.ops.lifecycle import SHUTDOWN_TIMEOUT_S

    options: dict[str, Any] = {
        "target": PROXIED_APPLICATION if proxy_headers else APPLICATION,
        "factory": proxy_headers,
        "address": bind,
        "port": port,
        "interface": Interfaces.ASGI,
        "loop": Loops.uvloop,
        "http": HTTPModes.auto if certfile is not None else HTTPModes.http1,
        "websockets": True,
        "workers": workers,
        "backlog": config.server_backlog,
        "backpressure": max(1, min(fd_limit, MAX_BACKPRESSURE)),
        "http1_settings": HTTP1Settings(
            header_read_timeout=max(1, round(config.request_header_timeout_s * 1000))
        ),
        "http2_settings": HTTP2Settings(),
        "workers_kill_timeout": math.ceil(SHUTDOWN_TIMEOUT_S) + KILL_MARGIN_S,
        "log_access": False,
    }
    if certfile is not None and keyfile is not None:
        options["ssl_cert"] = certfile
        options["ssl_key"] = keyfile
        options["ssl_protocol_min"] = SSLProtocols.tls12
    if static is not None:
        options["static_path_route"] = [static.route]
        options["static_path_mount"] = [static.path]
        options["static_path_expires"] = STATIC_MAX_AGE_S
    return options


def serve(options: dict[str, Any]) -> None:
    """Run granian with ``options`` (from :func:`granian_options`) until it is stopped.

    SIGTERM/SIGINT reach granian's main process: the first one first drains the workers
    (:func:`_drain_before_stopping`), then granian stops them; in each worker the ASGI
    ``lifespan.shutdown`` runs (or joins) :func:`sessions.ops.lifecycle.shutdown` (every
    open stream ended, then the records written) before granian closes the connections.
    """
    from granian import Granian

    server = Granian(**options)
    _drain_before_stopping(server)
    # What is loaded now lives as long as the process: out of the collector's reach, the
    # workers share its pages (no copy-on-write) and the main process's exit does not walk
    # it again (about a second of CPU, within the stop's DRAIN_S + 5 s).
    gc.collect()
    gc.freeze()
    # granian calls the loader in each worker, before the application is imported; it
    # forks the workers from this (the main) thread, the one whose end the kernel watches.
    server.serve(target_loader=functools.partial(load_in_worker, os.getpid(), options["factory"]))


def load_in_worker(parent_pid: int, factory: bool, target: str) -> Any:
    """Load the ASGI application ``target`` (``module:name``; called if ``factory``) in a
    granian worker, once the worker is bound to die with ``parent_pid``, granian's main
    process (:func:`sessions.ops.parent_death.die_with_parent`: a ``kill -9`` of the main
    process must not leave the worker serving).

    Raises what importing the application raises (granian reports it and stops).
    """
    from django.utils.module_loading import import_string

    from sessions.ops.parent_death import die_with_parent

    die_with_parent(parent_pid)
    module, _, name = target.partition(":")
    application = import_string(f"{module}.{name}")
    return application() if factory else application


def _drain_before_stopping(server: Any) -> None:
    """On the first SIGTERM/SIGINT, drain the workers while they still listen, then stop.

    granian's main process stops its workers at once on SIGTERM, and a worker closes its
    listener first: ``/readyz`` could not turn 503 and new streams could not be told to
    go elsewhere. So the first signal sends :data:`sessions.ops.lifecycle.DRAIN_SIGNAL`
    to every worker (each runs the graceful drain over ``DRAIN_S``) and hands the signal
    to granian ``DRAIN_S`` + :data:`DRAIN_MARGIN_S` later; a second signal goes to granian at once
    (docs/operators.md, "Graceful drain").
    """
    import threading

    from sessions.conf import get_config
    from sessions.ops.lifecycle import DRAIN_SIGNAL

    stop_now = server.signal_handler_interrupt
    drain_s = get_config().drain_s
    draining = threading.Event()

    def interrupt(*args: Any, **kwargs: Any) -> None:
        if draining.is_set() or drain_s <= 0:
            stop_now(*args, **kwargs)
            return
        draining.set()
        for worker in list(server.wrks):
            pid = getattr(getattr(worker, "inner", None), "pid", None)
            if pid:
                with contextlib.suppress(OSError):
                    os.kill(pid, DRAIN_SIGNAL)
        timer = threading.Timer(drain_s + DRAIN_MARGIN_S, stop_now)
        timer.daemon = True
        timer.start()

    server.signal_handler_interrupt = interrupt


def proxied_application() -> Any:
    """``qwenweb.asgi.application`` behind granian's proxy-headers wrapper (factory).

    The client address comes from ``X-Forwarded-For`` and the scheme from
    ``X-Forwarded-Proto`` when the connection comes from 127.0.0.1 (the proxy).
    """
    from granian.utils.proxies import wrap_asgi_with_proxy_headers

    from qwenweb.asgi import application

    return wrap_asgi_with_proxy_headers(application, trusted_hosts="127.0.0.1")
