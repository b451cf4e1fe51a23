"""ASGI entry point: the event stream is routed in front of Django (EB-22).

``GET /ws`` (a WebSocket) goes to :class:`sessions.transport.websocket.WebSocketRoute`.
``GET /session/<id>/events`` goes to :class:`sessions.transport.stream.SessionEventsRoute`, a plain
async handler that pins no OS thread while it streams (Django's ``ASGIHandler`` keeps one
thread per in-flight request for as long as its response streams). Everything else,
including ``POST`` to the same path, goes to Django (:class:`sessions.transport.routes.Routes`
matches HTTP paths with Django's patterns, :class:`~sessions.transport.routes.ScopeTypes`
the scope types; Channels' ``URLRouter`` routes the WebSocket). The ASGI ``lifespan`` scope goes to
:data:`sessions.ops.lifecycle.lifespan_app`. ``/healthz``, ``/readyz`` and ``/metrics`` are
answered first, by :class:`sessions.ops.probes.ProbeApplication`, before Django's
``ALLOWED_HOSTS`` check: probes and scrapers send an IP as the Host.
"""

import gc
import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "qwenweb.settings")
django_application: Any = get_asgi_application()

# Imported after Django is set up: they use models and settings.
from channels.routing import URLRouter  # noqa: E402
from django.urls import get_resolver, path  # noqa: E402

from sessions.ops.lifecycle import lifespan_app  # noqa: E402
from sessions.ops.probes import ProbeApplication  # noqa: E402
from sessions.transport.body_deadline import BodyDeadline  # noqa: E402
from sessions.transport.cookies import JoinCookieHeaders  # noqa: E402
from sessions.transport.routes import Routes, ScopeTypes  # noqa: E402
from sessions.transport.stream import SessionEventsRoute  # noqa: E402
from sessions.transport.websocket import WebSocketRoute  # noqa: E402

# Typed loosely: django-stubs' path() only knows Django views, not ASGI applications.
stream_application: Any = SessionEventsRoute(django_application)
websocket_application: Any = WebSocketRoute()

router = ScopeTypes(
    {
        # Startup attaches the server loop, shutdown ends the streams and flushes the
        # records (sessions.ops.lifecycle.LifespanApp).
        "lifespan": lifespan_app,
        # GET /ws: many sessions over one WebSocket (sessions.transport.websocket).
        "websocket": URLRouter([path("ws", websocket_application)]),
        "http": ProbeApplication(
            Routes(
                [path("session/<str:session_id>/events", stream_application)],
                fallback=django_application,
            )
        ),
    }
)

# HTTP/2 clients may split their cookies into several headers: join them first
# (sessions.transport.cookies). A request body late past its bound is answered 408
# (sessions.transport.body_deadline).
application = JoinCookieHeaders(BodyDeadline(router))

# What is loaded by now (Django, the URLconf and the views it imports) lives as long as
# the process: freeze it out of the cyclic collector's reach. A full collection, which any
# request allocating many containers triggers (a publish body of 50,000 "{}" did), then
# walks only what requests made: 1 ms instead of 80 ms holding the GIL, the event loop's
# too (issue 26). Python's docs recommend gc.freeze() for such long-lived objects.
get_resolver().url_patterns  # noqa: B018 (imports the views now, to freeze them too)
gc.collect()
gc.freeze()
