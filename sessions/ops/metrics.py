"""Prometheus metrics: one more listener of :data:`sessions.hooks.hooks` (docs/operators.md).

What is counted, and where it comes from
    - per frame (the hot path): the stream's observer (:class:`StreamMeter`) adds to
      plain integers of this process (frames, bytes, ``stream_error`` codes) and times a
      sample of the live deliveries (about :data:`LATENCY_SAMPLES_PER_FLUSH` per flush
      interval). Nothing on that path touches ``prometheus_client``.
    - per publish: :meth:`Metrics.event_published`, one integer add (announced by the
      backend that accepted the event, so under Redis each event counts once, in the
      process that published it, not in every mirror).
    - per bus: slow-client warnings, evictions, resyncs and replayed events are read from
      each loaded bus's own counters (``EventBus.stats()``) as differences since the last
      look; a bus unloaded in between is looked at one last time (its object is kept until
      then), so nothing is lost.
    - per connection: ``qwenweb_subscribers`` goes up and down when a stream opens and
      ends (one gauge update per connection, not per frame).

    :meth:`Metrics.flush` hands what accumulated to ``prometheus_client``: every
    ``METRICS_FLUSH_INTERVAL_S`` seconds on the server loop, and before each scrape of
    this process. No metric has a per-session or per-subscriber label.

Several processes
    With ``PROMETHEUS_MULTIPROC_DIR`` set (before the process starts) ``prometheus_client``
    keeps the values in files there and :func:`render` reads all of them: counters and
    histograms are summed over processes, the gauges are summed over *live* processes.
    The files of a process that is gone are removed at the next scrape
    (:func:`prometheus_client.multiprocess.mark_process_dead` for each pid in the
    directory that no longer runs) and at a clean exit of the process itself.

Concurrency: every listener and observer method runs on the server's event loop, never
awaits and never raises; :func:`render` runs on the loop too (it reads small files).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import logging
import os
import re
import time
from collections.abc import Iterable, Sequence
from typing import Final

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from sessions.backends import get_backend
from sessions.bus import EventBus, Frame
from sessions.hooks import ConnectionInfo, ConnectionObserver, Listener

__all__ = [
    "CONTENT_TYPE_LATEST",
    "Families",
    "Metrics",
    "StreamMeter",
    "families",
    "metrics",
    "multiprocess_dir",
    "remove_dead_processes",
    "remove_files_of_dead_processes",
    "render",
]

logger = logging.getLogger("qwenweb.metrics")

LATENCY_SAMPLES_PER_FLUSH: Final = 1000
"""About how many live deliveries per flush interval are timed: one in every 2**k, with k
set at each flush from the last interval's rate (an observation costs about 1 µs, a
delivery about 100 ns without it)."""

MAX_LATENCY_SAMPLES: Final = 2 * LATENCY_SAMPLES_PER_FLUSH
"""Delivery latencies kept between two flushes. A burst after a quiet interval reaches it
within the interval: every other sample is then dropped and one delivery in 2**(k+1) is
timed from there on, so a flush never observes more than this many (a burst of 128,000
deliveries used to time 50,000 and spend ~50 ms of the loop in one flush)."""

LATENCY_BUCKETS_S: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
#: Writes per event log commit (group commit: a burst shares one).
COMMIT_BATCH_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 10_000)

_PID_FILE: Final = re.compile(r"_(\d+)\.db$")


def multiprocess_dir() -> str | None:
    """The directory of ``prometheus_client``'s multiprocess mode, or None (one process)."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class Families:
    """The process's metric objects, in a registry of their own (module docstring).

    Built on first use (:func:`families`), not at import: in multiprocess mode every
    metric object writes a file for its process, and a process that never serves (the
    parent of granian's workers, a management command) must leave none.
    """

    def __init__(self) -> None:
        registry = self.registry = CollectorRegistry(auto_describe=True)
        self.subscribers = Gauge(
            "qwenweb_subscribers", "Open event streams.", registry=registry,
            multiprocess_mode="livesum",
        )  # fmt: skip
        self.websocket_subscribers = Gauge(
            "qwenweb_websocket_subscribers",
            "Open WebSocket subscriptions (also counted in qwenweb_subscribers).",
            registry=registry, multiprocess_mode="livesum",
        )  # fmt: skip
        self.sessions_loaded = Gauge(
            "qwenweb_sessions_loaded", "Sessions with a bus loaded in memory.",
            registry=registry, multiprocess_mode="livesum",
        )  # fmt: skip
        self.published = Counter(
            "qwenweb_events_published", "Events accepted by POST .../events.", registry=registry
        )
        self.frames = Counter(
            "qwenweb_frames_sent", "Frames written to subscribers (all types).", registry=registry
        )
        self.bytes = Counter(
            "qwenweb_bytes_sent", "Stream body bytes written (frames, retry, heartbeats).",
            registry=registry,
        )  # fmt: skip
        self.warnings = Counter(
            "qwenweb_slow_client_warnings", "slow_client_warning frames queued.", registry=registry
        )
        self.evictions = Counter(
            "qwenweb_evictions", "Subscribers evicted (client_evicted).", ["reason"],
            registry=registry,
        )  # fmt: skip
        self.resyncs = Counter(
            "qwenweb_resyncs", "Reconnects answered state_resync_required.", ["reason"],
            registry=registry,
        )  # fmt: skip
        self.replayed = Counter(
            "qwenweb_replayed_events", "Events replayed from the ring to resuming clients.",
            registry=registry,
        )  # fmt: skip
        self.stream_errors = Counter(
            "qwenweb_stream_errors", "stream_error frames written, by code.", ["code"],
            registry=registry,
        )  # fmt: skip
        self.rejected = Counter(
            "qwenweb_rejected_requests", "Requests answered with a JSON error, by code.",
            ["code"], registry=registry,
        )  # fmt: skip
        self.backend_unavailable = Counter(
            "qwenweb_backend_unavailable",
            "Requests refused and streams ended because the event store (Redis) was unreachable.",
            registry=registry,
        )
        self.backend_link = Counter(
            "qwenweb_backend_link_changes",
            "This process's reader lost the event store (lost), got it back (reattached), "
            "and of those, on another primary (failover: a Sentinel promotion).",
            ["event"],
            registry=registry,
        )
        self.latency = Histogram(
            "qwenweb_delivery_latency_seconds",
            "Live event accepted by this process's bus -> its bytes handed to the server.",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        # A durable store on this machine's disk (the durable backend's event log).
        self.commit_batch = Histogram(
            "qwenweb_event_log_commit_batch_size", "Writes per event log commit.",
            buckets=COMMIT_BATCH_BUCKETS, registry=registry,
        )  # fmt: skip
        self.commit_latency = Histogram(
            "qwenweb_event_log_commit_seconds", "Event log commit latency (one transaction).",
            buckets=LATENCY_BUCKETS_S, registry=registry,
        )  # fmt: skip
        self.log_bytes = Gauge(
            "qwenweb_event_log_bytes", "Bytes of the event log's files (database + WAL).",
            registry=registry, multiprocess_mode="livesum",
        )  # fmt: skip
        self.log_rows = Gauge(
            "qwenweb_event_log_rows", "Events held in the event log.",
            registry=registry, multiprocess_mode="livesum",
        )  # fmt: skip
        # Declare the labelled families' usual children: a scrape lists them at 0.
        for reason in ("queue_overflow", "queue_bytes_overflow", "writer_idle_timeout"):
            self.evictions.labels(reason=reason)
        for reason in ("epoch_reset", "ring_evicted"):
            self.resyncs.labels(reason=reason)
        for event in ("lost", "reattached", "failover"):
            self.backend_link.labels(event=event)


@functools.cache
def families() -> Families:
    """The process's :class:`Families` (built on the first call)."""
    return Families()


class _Totals:
    """What accumulated since the last flush (plain ints: the per-frame path)."""

    __slots__ = (
        "backend_unavailable",
        "bytes",
        "frames",
        "latencies",
        "live",
        "mask",
        "published",
        "stream_errors",
    )

    def __init__(self) -> None:
        self.frames = 0
        self.bytes = 0
        self.published = 0
        self.backend_unavailable = 0
        self.latencies: list[float] = []
        self.live = 0  # live deliveries since the last flush
        self.mask = 0  # time the deliveries whose count has these bits clear
        self.stream_errors: dict[str, int] = {}

    def thin(self) -> None:
        """Keep every other latency sample and time half as many deliveries from now on
        (the interval's samples stay one in every 2**k deliveries)."""
        del self.latencies[1::2]
        self.mask = (self.mask << 1) | 1


class StreamMeter(ConnectionObserver):
    """The observer of one stream: adds to the process's totals; never awaits or raises.

    Real events written before ``replay_complete`` / ``state_resync_required`` of a
    resumed stream are replay, not live: they are not sampled for the latency.
    """

    __slots__ = ("_closed", "_replaying", "_totals", "_websocket")

    def __init__(self, totals: _Totals, resumed: bool, *, websocket: bool = False) -> None:
        self._totals = totals
        self._replaying = resumed
        self._closed = False
        self._websocket = websocket

    def frames_written(
        self,
        frames: Sequence[Frame],
        wires: Sequence[bytes],
        payloads: Sequence[bytes],
        nbytes: int,
    ) -> None:
        totals = self._totals
        totals.frames += len(frames)
        totals.bytes += nbytes
        for frame in frames:
            if frame.id is not None:
                if not self._replaying:
                    live = totals.live = totals.live + 1
                    if not live & totals.mask:
                        totals.latencies.append(time.monotonic() - frame.accepted_at)
                        if len(totals.latencies) >= MAX_LATENCY_SAMPLES:
                            totals.thin()
            elif frame.type == "stream_error":
                code = _stream_error_code(frame)
                totals.stream_errors[code] = totals.stream_errors.get(code, 0) + 1
                if code == "backend_unavailable":
                    totals.backend_unavailable += 1
            elif frame.type in ("replay_complete", "state_resync_required"):
                self._replaying = False

    def bytes_written(self, nbytes: int) -> None:
        self._totals.bytes += nbytes

    def closed(self, reason: str, detail: str = "") -> None:
        if not self._closed:
            self._closed = True
            families().subscribers.dec()
            if self._websocket:
                families().websocket_subscribers.dec()


def _stream_error_code(frame: Frame) -> str:
    data = frame.get("data")
    code = data.get("code") if isinstance(data, dict) else None
    return code if isinstance(code, str) and code.isidentifier() and len(code) <= 40 else "internal"


class _BusSample:
    __slots__ = ("evictions", "replayed", "resyncs", "warnings")

    def __init__(self) -> None:
        self.warnings = 0
        self.replayed = 0
        self.evictions: dict[str, int] = {}
        self.resyncs: dict[str, int] = {}


class Metrics(Listener):
    """The metrics listener (module docstring); its state is its own (tests build one)."""

    def __init__(self) -> None:
        self._totals = _Totals()
        self._buses: dict[int, tuple[EventBus, _BusSample]] = {}
        self._loops: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- hooks ------------------------------------------------------------------------

    def connection_opened(self, info: ConnectionInfo) -> ConnectionObserver:
        families().subscribers.inc()
        websocket = info.transport == "ws"
        if websocket:
            families().websocket_subscribers.inc()
        return StreamMeter(self._totals, info.resumed_from is not None, websocket=websocket)

    def event_published(self, session_id: str) -> None:
        self._totals.published += 1

    def request_rejected(self, status: int, code: str) -> None:
        families().rejected.labels(code=code).inc()
        if code == "backend_unavailable":
            self._totals.backend_unavailable += 1

    def backend_link(self, event: str) -> None:
        families().backend_link.labels(event=event).inc()

    def loop_attached(self, loop: asyncio.AbstractEventLoop) -> None:
        """Flush every ``METRICS_FLUSH_INTERVAL_S`` on ``loop`` (idempotent per loop)."""
        if id(loop) in self._loops:
            return
        self._loops.add(id(loop))
        task = loop.create_task(self._flush_forever(), name="qwenweb-metrics")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush_forever(self) -> None:
        interval_s = get_backend().config.metrics_flush_interval_s
        while True:
            await asyncio.sleep(interval_s)
            self.flush()

    # -- flushing ---------------------------------------------------------------------

    def flush(self) -> None:
        """Hand what accumulated to ``prometheus_client`` (on the loop). Never raises."""
        try:
            self._flush_totals()
            self._flush_buses()
            self._flush_store()
        except Exception:
            logger.exception("metrics_flush_failed")

    def _flush_totals(self) -> None:
        totals = self._totals
        frames, nbytes, published = totals.frames, totals.bytes, totals.published
        latencies, errors = totals.latencies, totals.stream_errors
        unavailable = totals.backend_unavailable
        totals.frames = totals.bytes = totals.published = totals.backend_unavailable = 0
        every = max(1, totals.live // LATENCY_SAMPLES_PER_FLUSH)
        totals.mask = (1 << (every.bit_length() - 1)) - 1  # a power of two, at most `every`
        totals.live = 0
        totals.latencies, totals.stream_errors = [], {}
        metric = families()
        if frames:
            metric.frames.inc(frames)
        if nbytes:
            metric.bytes.inc(nbytes)
        if published:
            metric.published.inc(published)
        if unavailable:
            metric.backend_unavailable.inc(unavailable)
        for code, count in errors.items():
            metric.stream_errors.labels(code=code).inc(count)
        for seconds in latencies:
            metric.latency.observe(seconds)

    def _flush_store(self) -> None:
        figures = get_backend().store_figures()
        if figures is None:
            return
        metric = families()
        for size in figures.batch_sizes:
            metric.commit_batch.observe(size)
        for seconds in figures.commit_latencies_s:
            metric.commit_latency.observe(seconds)
        metric.log_bytes.set(figures.file_bytes)
        metric.log_rows.set(figures.rows)

    def _flush_buses(self) -> None:
        backend = get_backend()
        loaded = {id(live.bus): live.bus for live in backend.registry.values()}
        families().sessions_loaded.set(len(loaded))
        for key, (bus, sample) in list(self._buses.items()):
            if key not in loaded or loaded[key] is not bus:
                _count_bus(bus, sample)  # its last counts; then it is forgotten
                del self._buses[key]
        for key, bus in loaded.items():
            entry = self._buses.get(key)
            if entry is None:
                entry = self._buses[key] = (bus, _BusSample())
            _count_bus(bus, entry[1])

    def forget(self) -> None:
        """Drop the accumulated counts and the buses seen (tests)."""
        self._totals = _Totals()
        self._buses.clear()


def _count_bus(bus: EventBus, sample: _BusSample) -> None:
    stats = bus.stats()
    metric = families()
    if stats.slow_client_warnings > sample.warnings:
        metric.warnings.inc(stats.slow_client_warnings - sample.warnings)
        sample.warnings = stats.slow_client_warnings
    if stats.replayed_frames > sample.replayed:
        metric.replayed.inc(stats.replayed_frames - sample.replayed)
        sample.replayed = stats.replayed_frames
    _count_reasons(metric.evictions, stats.evictions.items(), sample.evictions)
    _count_reasons(metric.resyncs, stats.resyncs.items(), sample.resyncs)


def _count_reasons(counter: Counter, now: Iterable[tuple[str, int]], seen: dict[str, int]) -> None:
    for reason, count in now:
        before = seen.get(reason, 0)
        if count > before:
            counter.labels(reason=reason).inc(count - before)
            seen[reason] = count


metrics = Metrics()
"""The process's metrics listener (connected by ``sessions.apps`` unless ``METRICS`` is off)."""


def render() -> tuple[bytes, str]:
    """Return the Prometheus text exposition of every process (body, content type).

    Flushes this process first. In multiprocess mode, first removes the files of
    processes that no longer run. Never raises for a readable directory.
    """
    metrics.flush()
    directory = multiprocess_dir()
    if directory is None:
        return generate_latest(families().registry), CONTENT_TYPE_LATEST
    remove_dead_processes(directory)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    return generate_latest(registry), CONTENT_TYPE_LATEST


def remove_dead_processes(directory: str) -> list[int]:
    """Mark every pid with files in ``directory`` that no longer runs as dead; return them.

    Their live gauges (``qwenweb_subscribers``, ``qwenweb_sessions_loaded``) leave the
    sums; their counters stay (a counter never goes down). Never raises.
    """
    pids: set[int] = set()
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        match = _PID_FILE.search(name)
        if match and name.startswith("gauge_live"):
            pids.add(int(match.group(1)))
    dead = [pid for pid in sorted(pids) if not _running(pid)]
    for pid in dead:
        _mark_dead(pid, directory)
    return dead


def remove_files_of_dead_processes(directory: str) -> list[int]:
    """Delete every file in ``directory`` of a pid that no longer runs; return those pids.

    For a server's start (``python -m qwenweb.serve``): the counters of a previous run's
    processes leave the sums (Prometheus sees a counter reset). Never raises.
    """
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    dead: set[int] = set()
    for name in names:
        match = _PID_FILE.search(name)
        if match and not _running(int(match.group(1))):
            dead.add(int(match.group(1)))
            with contextlib.suppress(OSError):
                os.remove(os.path.join(directory, name))
    return sorted(dead)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _mark_dead(pid: int, directory: str) -> None:
    try:
        multiprocess.mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]
    except OSError:
        logger.debug("mark_process_dead failed pid=%d", pid, exc_info=True)


def _at_exit() -> None:
    directory = multiprocess_dir()
    if directory is not None:
        _mark_dead(os.getpid(), directory)


atexit.register(_at_exit)
