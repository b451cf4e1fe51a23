"""Bench routes for qwenweb in front of the project's URLs (see ``qwenweb_bench_settings``).

- ``POST /bench/session``: a new session; ``{"channel", "token", "path", "publish_token"}``
  (``token``: a read token).
- ``POST /bench/burst?channel=&n=&size=&rate=&batch=``: publish ``n`` bench events through
  ``MemoryBackend.publish_nowait`` on the server's event loop (in-process, no HTTP per
  event; with another backend ``Backend.publish``, e.g. one Redis round-trip each);
  answers when the last one is published, with the publish timings.
- ``GET /bench/ping``: readiness.
- ``POST /bench/tracemalloc?action=mark|report``: only when the server was started with
  ``BENCH_TRACEMALLOC=1`` (``bench.memprofile``): snapshot, then the top allocation sites
  grown since the mark.
"""

from __future__ import annotations

import os
import tracemalloc
from typing import Any

from channels.db import database_sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import URLPattern, URLResolver, path
from django.views.decorators.csrf import csrf_exempt

from bench.common import burst_params, run_burst
from qwenweb.urls import urlpatterns as project_urlpatterns
from sessions.auth import issue_token
from sessions.backends import get_backend
from sessions.backends.memory import MemoryBackend
from sessions.models import AgentSession


def _create_row() -> str:
    return str(AgentSession.objects.create(title="bench").pk)


@csrf_exempt
async def bench_session(request: HttpRequest) -> HttpResponse:
    session_id = await database_sync_to_async(_create_row)()
    await get_backend().get_live_session(session_id)  # build the bus now, not on the first stream
    return JsonResponse(
        {
            "channel": session_id,
            "token": issue_token(session_id, ["read"], "bench"),
            "publish_token": issue_token(session_id, ["publish"], "bench"),
            "path": f"/session/{session_id}/events",
        }
    )


@csrf_exempt
async def bench_burst(request: HttpRequest) -> HttpResponse:
    n, size, rate, batch = burst_params(request.GET.dict())
    backend = get_backend()
    live = await backend.get_live_session(request.GET["channel"])

    async def publish_shared(data: dict[str, Any]) -> bool:
        return await backend.publish(live, {"type": "bench", "data": data}) is not None

    if isinstance(backend, MemoryBackend):
        memory = backend

        def publish(data: dict[str, Any]) -> bool:
            return memory.publish_nowait(live, {"type": "bench", "data": data}) is not None

        return JsonResponse(await run_burst(publish, n, size, rate, batch))
    return JsonResponse(await run_burst(publish_shared, n, size, rate, batch))


async def bench_ping(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True})


_marks: list[tracemalloc.Snapshot] = []


@csrf_exempt
async def bench_tracemalloc(request: HttpRequest) -> HttpResponse:
    if os.environ.get("BENCH_TRACEMALLOC") != "1":
        return JsonResponse({"error": "start the server with BENCH_TRACEMALLOC=1"}, status=404)
    if not tracemalloc.is_tracing():
        tracemalloc.start(int(request.GET.get("frames", "1")))
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap*>"),  # code, not streams
        ]
    )
    if request.GET.get("action") == "mark" or not _marks:
        _marks[:] = [snapshot]
        return JsonResponse({"marked": True})
    group = "filename" if request.GET.get("group") == "filename" else "lineno"
    stats = snapshot.compare_to(_marks[0], group)
    top = [
        {"where": str(stat.traceback[0]), "size_diff": stat.size_diff, "count": stat.count_diff}
        for stat in stats[: int(request.GET.get("top", "30"))]
    ]
    total = sum(stat.size_diff for stat in stats)
    return JsonResponse({"total_diff": total, "top": top})


urlpatterns: list[URLPattern | URLResolver] = [
    path("bench/session", bench_session),
    path("bench/burst", bench_burst),
    path("bench/ping", bench_ping),
    path("bench/tracemalloc", bench_tracemalloc),
    *project_urlpatterns,
]
