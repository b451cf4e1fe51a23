"""Settings for django-eventstream under the bench: the project's settings, its own routes.

django-eventstream 5 is served the way its README says: its view included in ``urls.py``
(``path("events/<channel>", include(django_eventstream.urls), {"format-channels":
["{channel}"]})``) behind Django's ``ASGIHandler`` under daphne, with
``DjangoModelStorage`` so that a listener that overflows (more than 10 pending events)
re-reads from the database instead of losing events. Channels named ``nostore-*`` are
unreliable (no storage), to show what happens without it.
"""

from qwenweb.settings import *  # noqa: F403

ROOT_URLCONF = "bench.eventstream_urls"
ASGI_APPLICATION = "bench.eventstream_asgi.application"
EVENTSTREAM_STORAGE_CLASS = "django_eventstream.storage.DjangoModelStorage"
EVENTSTREAM_CHANNELMANAGER_CLASS = "bench.eventstream_urls.BenchChannelManager"
