"""Settings for qwenweb under the bench: the project's settings plus the bench routes.

Started with ``DJANGO_SETTINGS_MODULE=bench.qwenweb_bench_settings`` under the unchanged
entry points (``python -m qwenweb.serve`` and ``uvicorn qwenweb.asgi:application``):
``qwenweb.asgi`` keeps routing ``GET /session/<id>/events`` to the stream handler, and
everything else reaches Django with :mod:`bench.qwenweb_urls`, which adds the bench routes
in front of the project's URLs.
"""

from qwenweb.settings import *  # noqa: F403

ROOT_URLCONF = "bench.qwenweb_urls"
