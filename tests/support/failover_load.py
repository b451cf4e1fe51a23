"""Load around Sentinel failovers: a keyed publisher, resuming readers, a readiness probe.

The publisher posts at ``rate_per_s`` events per second from four threads, each event with
its own ``Idempotency-Key`` (also its ``data``), retrying every 503 or lost connection with
the same key until it is acknowledged. Each reader is an SSE client that resumes with
``Last-Event-ID`` and ``X-Event-Epoch`` whenever its stream ends, and checks every frame
as it arrives: an event whose id does not follow its cursor without a
``state_resync_required`` before it is a *silent gap*; an id it already holds in that
epoch is a *duplicate*. Every loop is bounded by the caller's stop event and deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from tests.support.server import RawSSEClient, RemoteSession, ServerProcess

PUBLISH_THREADS = 4
#: A publish is given up (a failure of the test) after this long of refusals.
PUBLISH_GIVE_UP_S = 60.0


@dataclass
class Acked:
    key: str
    event_id: int
    epoch: str
    acked_at: float
    refused_s: float  # from its first refusal to its acknowledgement (0: none)


@dataclass
class Publisher:
    servers: tuple[ServerProcess, ...]
    session: RemoteSession
    rate_per_s: float
    acked: list[Acked] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    codes: dict[str, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for index in range(PUBLISH_THREADS):
            thread = threading.Thread(target=self._run, args=(index,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def finish(self, timeout_s: float = PUBLISH_GIVE_UP_S + 20) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout_s)
            assert not thread.is_alive(), "a publisher thread did not stop"

    def _run(self, index: int) -> None:
        interval = PUBLISH_THREADS / self.rate_per_s
        next_at = time.monotonic()
        n = 0
        while not self.stop.is_set():
            key = f"p{index}-{n}"
            server = self.servers[(index + n) % len(self.servers)]
            self._publish(server, key)
            n += 1
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the publish rate, not a wait for a cause
            else:
                next_at = time.monotonic()

    def _publish(self, server: ServerProcess, key: str) -> None:
        first_refusal: float | None = None
        deadline = time.monotonic() + PUBLISH_GIVE_UP_S
        while time.monotonic() < deadline:
            status, body, _ = post_note(server, self.session, key, timeout_s=10)
            if status == 200:
                now = time.monotonic()
                refused = now - first_refusal if first_refusal is not None else 0.0
                with self._lock:
                    self.acked.append(Acked(key, int(body["id"]), str(body["epoch"]), now, refused))
                return
            code = str(body.get("code", status)) if isinstance(body, dict) else str(status)
            with self._lock:
                self.codes[code] = self.codes.get(code, 0) + 1
            if status not in (503, 0):
                self.failures.append(f"{key}: {status} {body}")
                return
            if first_refusal is None:
                first_refusal = time.monotonic()
            time.sleep(0.05)  # the client's retry pause
        self.failures.append(f"{key}: still refused after {PUBLISH_GIVE_UP_S} s")


def post_note(
    server: ServerProcess, session: RemoteSession, key: str, *, timeout_s: float = 15.0
) -> tuple[int, Any, dict[str, str]]:
    """POST a ``note`` carrying ``key`` as its data and its ``Idempotency-Key``; return
    the status, the JSON body (``{}`` when it is not JSON) and the headers (lower-case
    names). A refused, reset or timed-out connection is status 0 (retried like a 503)."""
    request = urllib.request.Request(
        f"{server.base_url}{session.events_path}",
        data=json.dumps({"type": "note", "data": key}).encode(),
        method="POST",
        headers={
            "Content-Type": "application/json",
            "Authorization": f"Bearer {session.publish_token}",
            "Idempotency-Key": key,
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status, raw, headers = response.status, response.read(), response.headers
    except urllib.error.HTTPError as exc:
        with exc:  # its socket, closed now rather than by the garbage collector
            status, raw, headers = exc.code, exc.read(), exc.headers
    except OSError:
        return 0, {}, {}
    try:
        body = json.loads(raw)
    except ValueError:
        body = {}
    return status, body, {k.lower(): v for k, v in headers.items()}


@dataclass
class Reader:
    server: ServerProcess
    session: RemoteSession
    cursor: int | None = 0  # from the start: every acknowledged event is expected
    epoch: str | None = None
    received: dict[str, int] = field(default_factory=dict)  # key -> times received
    held: set[tuple[str, int]] = field(default_factory=set)
    resyncs: list[tuple[float, object]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    streams: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Read (and resume) until ``stop`` is set."""
        while not stop.is_set():
            headers = [
                ("Accept", "text/event-stream"),
                ("Authorization", f"Bearer {self.session.read_token}"),
            ]
            if self.cursor is not None:
                headers.append(("Last-Event-ID", str(self.cursor)))
                if self.epoch is not None:
                    headers.append(("X-Event-Epoch", self.epoch))
            client = RawSSEClient(self.server.port, self.session.events_path, headers)
            try:
                await client.connect(timeout_s=15)
            except (OSError, TimeoutError):
                await asyncio.sleep(0.2)
                continue
            try:
                if client.status != 200:
                    await asyncio.sleep(0.2)  # 503 while Redis is away: the client's retry
                    continue
                self.streams += 1
                self.epoch = client.response_headers.get("x-event-epoch", self.epoch)
                await self._read(client, stop)
            finally:
                client.close()

    async def _read(self, client: RawSSEClient, stop: asyncio.Event) -> None:
        taken = 0
        resynced = False
        while not stop.is_set() and not client.ended:
            with contextlib.suppress(TimeoutError):
                await client.read_until(partial(_more_than, taken), timeout_s=0.5)
            for event in client.events[taken:]:
                resynced = self._take(event.type, json.loads(event.data), resynced)
            taken = len(client.events)

    def _take(self, event_type: str, frame: dict[str, object], resynced: bool) -> bool:
        if event_type == "state_resync_required":
            self.resyncs.append((time.monotonic(), frame.get("data")))
            return True
        event_id = frame.get("id")
        if not isinstance(event_id, int):
            return resynced
        key = str(frame.get("data"))
        if (str(self.epoch), event_id) in self.held:
            if not resynced:  # after a resync the replay may repeat what the client holds
                self.violations.append(f"duplicate id {event_id} ({key})")
            return resynced
        if not resynced and self.cursor is not None and event_id != self.cursor + 1:
            self.violations.append(f"silent gap: {self.cursor} -> {event_id}")
        self.held.add((str(self.epoch), event_id))
        self.received[key] = self.received.get(key, 0) + 1
        self.cursor = event_id
        return resynced


def _more_than(count: int, events: list[object]) -> bool:
    return len(events) > count


@dataclass
class ReadyProbe:
    """Polls each server's ``/readyz`` every 0.2 s: ``(monotonic time, status)`` lists."""

    servers: tuple[ServerProcess, ...]
    seen: dict[int, list[tuple[float, int]]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def finish(self) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(20)

    def _run(self) -> None:
        while not self.stop.is_set():
            for server in self.servers:
                try:
                    with urllib.request.urlopen(f"{server.base_url}/readyz", timeout=5) as r:
                        status = r.status
                except urllib.error.HTTPError as exc:
                    status = exc.code
                except OSError:
                    status = 0
                self.seen.setdefault(server.port, []).append((time.monotonic(), status))
            self.stop.wait(0.2)

    def statuses(self, server: ServerProcess, start: float, end: float) -> list[int]:
        return [s for t, s in self.seen.get(server.port, []) if start <= t <= end]
