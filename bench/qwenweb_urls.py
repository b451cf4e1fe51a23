"""Bench routes for qwenweb in front of the project's URLs (see ``qwenweb_bench_settings``).

- ``POST /bench/session[?scope=read,publish]``: a new session; ``{"channel", "token",
  "path", "publish_token"}`` (``token`` of those scopes, default read; ``publish_token``:
  a publish token).
- ``POST /bench/burst?channel=&n=&size=&rate=&batch=``: publish ``n`` bench events through
  ``MemoryBackend.publish_nowait`` on the server's event loop (in-process, no HTTP per
  event; with another backend ``Backend.publish``, e.g. one Redis round-trip each);
  answers when the last one is published, with the publish timings. ``&shape=token``:
  each event is a one-word ``agent_message_chunk`` (``session_update``) carrying ``seq`` and
  ``t``, about 200 bytes on the wire (``size`` is then ignored; bench.compression).
- ``POST /bench/sessions?n=&group=``: ``n`` new sessions (buses built) remembered as
  ``group``; ``{"streams": [[path, read token], ...]}``.
- ``POST /bench/paced?group=&rate=&duration_s=&min=&max=``: publish ``rate`` events/s
  into every session of ``group`` for ``duration_s`` seconds, ``min``..``max`` bytes each
  (:func:`bench.common.run_paced_sessions`, in-process like ``/bench/burst``); answers
  when done, with its counts.
- ``GET /bench/ping``: readiness.
- ``POST /bench/tracemalloc?action=mark|report``: only when the server was started with
  ``BENCH_TRACEMALLOC=1`` (``bench.memprofile``): snapshot, then the top allocation sites
  grown since the mark.
- ``POST /bench/malloc_trim``: call glibc's ``malloc_trim(0)`` in the serving process
  (``bench.rss_after_close``); ``{"trimmed": bool}`` (``null`` where there is no glibc).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import tracemalloc
from typing import Any

from channels.db import database_sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import URLPattern, URLResolver, path
from django.views.decorators.csrf import csrf_exempt

from bench.common import burst_params, run_burst, run_paced_sessions
from qwenweb.urls import urlpatterns as project_urlpatterns
from sessions.auth import issue_token
from sessions.backends import get_backend
from sessions.backends.memory import MemoryBackend
from sessions.models import AgentSession
from sessions.scripted_agent import document_text, split_tokens


def _create_row() -> str:
    return str(AgentSession.objects.create(title="bench").pk)


@csrf_exempt
async def bench_session(request: HttpRequest) -> HttpResponse:
    session_id = await database_sync_to_async(_create_row)()
    await get_backend().get_live_session(session_id)  # build the bus now, not on the first stream
    return JsonResponse(
        {
            "channel": session_id,
            "token": issue_token(session_id, request.GET.get("scope", "read").split(","), "bench"),
            "publish_token": issue_token(session_id, ["publish"], "bench"),
            "path": f"/session/{session_id}/events",
        }
    )


_WORDS = split_tokens(document_text()[1][1])  # the Zen of Python, word by word


def _bench_event(data: dict[str, Any]) -> dict[str, Any]:
    return {"type": "bench", "data": data}


def _token_event(data: dict[str, Any]) -> dict[str, Any]:
    word = _WORDS[data["seq"] % len(_WORDS)]
    return {
        "type": "session_update",
        "data": {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": word},
            "seq": data["seq"],
            "t": data["t"],
        },
    }


@csrf_exempt
async def bench_burst(request: HttpRequest) -> HttpResponse:
    n, size, rate, batch = burst_params(request.GET.dict())
    backend = get_backend()
    live = await backend.get_live_session(request.GET["channel"])

    shape = _token_event if request.GET.get("shape") == "token" else _bench_event

    async def publish_shared(data: dict[str, Any]) -> bool:
        return await backend.publish(live, shape(data)) is not None

    if isinstance(backend, MemoryBackend):
        memory = backend

        def publish(data: dict[str, Any]) -> bool:
            return memory.publish_nowait(live, shape(data)) is not None

        return JsonResponse(await run_burst(publish, n, size, rate, batch))
    return JsonResponse(await run_burst(publish_shared, n, size, rate, batch))


_groups: dict[str, list[str]] = {}


def _create_rows(n: int) -> list[str]:
    rows = AgentSession.objects.bulk_create([AgentSession(title="bench") for _ in range(n)])
    return [str(row.pk) for row in rows]


@csrf_exempt
async def bench_sessions(request: HttpRequest) -> HttpResponse:
    n = int(request.GET.get("n", "1"))
    if not 1 <= n <= 20_000:
        return JsonResponse({"error": "n must be in [1, 20000]"}, status=400)
    ids = await database_sync_to_async(_create_rows)(n)
    backend = get_backend()
    for session_id in ids:
        await backend.get_live_session(session_id)
    _groups[request.GET.get("group", "default")] = ids
    return JsonResponse(
        {
            "streams": [
                [f"/session/{sid}/events", issue_token(sid, ["read"], "bench")] for sid in ids
            ]
        }
    )


def _publish_token(backend: MemoryBackend, live: Any, data: dict[str, Any]) -> bool:
    return backend.publish_nowait(live, {"type": "token", "data": data}) is not None


@csrf_exempt
async def bench_paced(request: HttpRequest) -> HttpResponse:
    query = request.GET
    backend = get_backend()
    lives = [await backend.get_live_session(sid) for sid in _groups[query.get("group", "default")]]
    if not isinstance(backend, MemoryBackend):
        return JsonResponse({"error": "the memory backend only"}, status=400)
    publishers = [functools.partial(_publish_token, backend, live) for live in lives]
    sizes = (int(query.get("min", "40")), int(query.get("max", "120")))
    rate, duration_s = float(query.get("rate", "10")), float(query.get("duration_s", "30"))
    return JsonResponse(await run_paced_sessions(publishers, rate, duration_s, sizes))


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


@csrf_exempt
async def bench_malloc_trim(request: HttpRequest) -> HttpResponse:
    # Bench only: does glibc hand back freed pages when asked? (docs/capacity.md §5)
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        trim = None
    return JsonResponse({"trimmed": None if trim is None else bool(trim(0))})


urlpatterns: list[URLPattern | URLResolver] = [
    path("bench/session", bench_session),
    path("bench/burst", bench_burst),
    path("bench/sessions", bench_sessions),
    path("bench/paced", bench_paced),
    path("bench/ping", bench_ping),
    path("bench/tracemalloc", bench_tracemalloc),
    path("bench/malloc_trim", bench_malloc_trim),
    *project_urlpatterns,
]
