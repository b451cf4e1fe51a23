"""Routes for django-eventstream under the bench (see ``eventstream_settings``).

- ``GET /events/<channel>``: django-eventstream's SSE view.
- ``POST /bench/session[?nostore=1]``: a new channel name; ``{"channel", "token", "path"}``.
- ``POST /bench/burst?channel=&n=&size=&rate=``: ``send_event`` ``n`` times in this process,
  on a worker thread (``send_event`` is synchronous and writes to the database).
- ``GET /bench/ping``: readiness.
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import django_eventstream
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import URLPattern, URLResolver, include, path
from django.views.decorators.csrf import csrf_exempt
from django_eventstream.channelmanager import DefaultChannelManager

from bench.common import burst_params, run_burst_sync


class BenchChannelManager(DefaultChannelManager):  # type: ignore[misc]
    """Anyone may read; channels named ``nostore-*`` are not stored (unreliable)."""

    def is_channel_reliable(self, channel: str) -> bool:
        return not channel.startswith("nostore-")


@csrf_exempt
async def bench_session(request: HttpRequest) -> HttpResponse:
    prefix = "nostore-" if request.GET.get("nostore") else "bench-"
    channel = prefix + secrets.token_hex(8)
    return JsonResponse({"channel": channel, "token": "", "path": f"/events/{channel}"})


def _burst_thread(channel: str, n: int, size: int, rate: float) -> dict[str, Any]:
    def publish(data: dict[str, Any]) -> bool:
        django_eventstream.send_event(channel, "bench", data)
        return True

    try:
        return run_burst_sync(publish, n, size, rate)
    finally:
        connection.close()


@csrf_exempt
async def bench_burst(request: HttpRequest) -> HttpResponse:
    n, size, rate, _batch = burst_params(request.GET.dict())
    result = await asyncio.to_thread(_burst_thread, request.GET["channel"], n, size, rate)
    return JsonResponse(result)


async def bench_ping(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


urlpatterns: list[URLPattern | URLResolver] = [
    path("bench/session", bench_session),
    path("bench/burst", bench_burst),
    path("bench/ping", bench_ping),
    path("events/<channel>", include(django_eventstream.urls), {"format-channels": ["{channel}"]}),
]
