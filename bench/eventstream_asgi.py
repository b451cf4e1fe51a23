"""ASGI application for django-eventstream under daphne: plain Django, as its docs say."""

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.eventstream_settings")
application: Any = get_asgi_application()
