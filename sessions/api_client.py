"""Small HTTP clients for the session API, used by the terminal tools (stdlib only).

* :class:`Publisher` posts events (``POST /session/<id>/events``) over one keep-alive
  connection, each with an ``Idempotency-Key`` (a UUID4 per logical publish, the same on
  every retry of it), retrying while the server is not up yet, after a lost answer and
  after a 503: a retried publish never publishes twice.
* :func:`newest_events` pages back through a session's history (``GET /session/<id>``,
  ``before=``), newest first.
* :class:`EventStreamClient` reads ``GET /session/<id>/events`` with
  :class:`sessions.wire.SSEParser` and reconnects the way EventSource does: with
  ``Last-Event-ID`` (and the ``X-Event-Epoch`` it came from) after the server's
  ``retry`` delay, stopping for good on 204 (SC-9 ... SC-11, EB-13 of docs/protocol.md).
  It asks for a gzipped stream (EB-17) and decodes it with ``zlib.decompressobj``:
  ``http.client`` de-chunks but does not decompress.

Neither imports Django, so they work against any running server.
"""

from __future__ import annotations

import http.client
import json
import random
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from sessions.wire import DEFAULT_RETRY_MS, ServerSentEvent, SSEParser

__all__ = ["ApiCallError", "EventStreamClient", "Publisher", "StreamEnd", "newest_events"]

_BACKOFF_CAP_S: Final = 30.0
TOKEN_REFRESH_WAIT_S: Final = 10.0
"""Seconds a client with ``refresh_token`` waits, after its token was rejected, for the
source (e.g. a token file being rewritten) to give a token not yet rejected."""
_TOKEN_REFRESH_POLL_S: Final = 0.25


class ApiCallError(Exception):
    """Raised when the server answers a call with an error status (message from its body)."""

    def __init__(self, status: int, body: bytes) -> None:
        try:
            detail = json.loads(body).get("error", "")
        except (ValueError, AttributeError):
            detail = body[:200].decode("utf-8", "replace")
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status


def _connection(url: str, timeout_s: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return cls(parts.hostname, parts.port, timeout=timeout_s), path


class Publisher:
    """Publish events into one session over HTTP.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000``.
        session_id: the session.
        token: a token with the ``publish`` scope.
    """

    def __init__(self, base_url: str, session_id: str, token: str, timeout_s: float = 10.0) -> None:
        self.url = f"{base_url.rstrip('/')}/session/{session_id}/events"
        self.token = token
        self.timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None
        self._path = ""

    def publish(
        self,
        event_type: str,
        data: Any,
        *,
        attempts: int = 30,
        idempotency_key: str | None = None,
    ) -> int:
        """Publish one event; return its id.

        The request carries ``Idempotency-Key: idempotency_key`` (default a new UUID4),
        the same on every attempt, so the server publishes it once however often it is
        sent. Retries connection failures (server starting or restarting, an answer lost
        after the request was sent) one second apart, and a 503 after its
        ``Retry-After`` (at most 5 s), up to ``attempts`` tries in all. Raises
        :class:`ApiCallError` on another error status (or a 503 on the last attempt),
        ``OSError`` when the server stays unreachable.
        """
        body = json.dumps({"type": event_type, "data": data}).encode()
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Content-Type": "application/json",
            "Idempotency-Key": idempotency_key or str(uuid.uuid4()),
        }
        for attempt in range(attempts):
            try:
                if self._conn is None:
                    self._conn, self._path = _connection(self.url, self.timeout_s)
                self._conn.request("POST", self._path, body=body, headers=headers)
                response = self._conn.getresponse()
                payload = response.read()
            except (OSError, http.client.HTTPException):
                self.close()
                if attempt == attempts - 1:
                    raise
                time.sleep(1.0)
                continue
            if response.status == 503 and attempt < attempts - 1:
                time.sleep(_retry_after_s(response.getheader("Retry-After")))
                continue
            if response.status != 200:
                raise ApiCallError(response.status, payload)
            return int(json.loads(payload)["id"])
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def newest_events(
    base_url: str, session_id: str, token: str, *, max_pages: int = 20, timeout_s: float = 10.0
) -> Iterator[dict[str, Any]]:
    """Yield the session's events newest first, a snapshot page at a time (``GET
    /session/<id>``, then ``?before=<firstEventId>`` while ``hasOlder``), at most
    ``max_pages`` pages. ``token`` needs the ``read`` scope. Raises
    :class:`ApiCallError` on an error status, ``OSError`` when the server is unreachable.
    """
    conn, path = _connection(f"{base_url.rstrip('/')}/session/{session_id}", timeout_s)
    query = ""
    try:
        for _ in range(max_pages):
            conn.request("GET", path + query, headers={"Authorization": f"Bearer {token}"})
            response = conn.getresponse()
            payload = response.read()
            if response.status != 200:
                raise ApiCallError(response.status, payload)
            page = json.loads(payload)
            yield from reversed(page.get("events") or [])
            if not page.get("hasOlder") or page.get("firstEventId") is None:
                return
            query = f"?before={int(page['firstEventId'])}"
    finally:
        conn.close()


def _retry_after_s(raw: str | None) -> float:
    """A 503's ``Retry-After`` in seconds, within [0.1, 5]; 1 s when absent or not a number."""
    try:
        return min(5.0, max(0.1, float(raw or "1")))
    except ValueError:
        return 1.0


_TOKEN_CODES: Final = ("token_revoked", "token_expired")


class _RetryNow(Exception):
    """Raised inside the client: reconnect at once (a fresh token after a 401)."""


def _error_code(data: str) -> str:
    try:
        code = json.loads(data).get("data", {}).get("code", "")
    except (ValueError, AttributeError):
        return ""
    return code if isinstance(code, str) else ""


class StreamEnd(Exception):
    """Raised inside the client to stop for good (204, 4xx); ``code`` is the exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class EventStreamClient:
    """Read a session's stream and reconnect with ``Last-Event-ID`` (SC-9 ... SC-11).

    ``on_event`` gets each dispatched event; ``on_status`` gets human-readable status
    lines (connected, reconnecting in N ms, ended). :meth:`run` returns an exit status:
    0 after a 204 (session ended), ``max_events``, or ``max_connections`` of which one
    opened; 1 on a 4xx other than 401 or when no connection ever opened; 2 on 401.

    ``refresh_token`` (e.g. re-reading a token file) is asked for a new token on a 401
    and after a ``stream_error`` with code ``token_revoked`` or ``token_expired``; the
    client retries at once with it (SC-10: a token that was rejected is never sent again,
    so a refresh that returns it is asked again every 0.25 s for up to ``refresh_wait_s``,
    then stops with 2: a file rewritten just after the revocation is still picked up).
    Without it a 401 stops with 2.

    ``compressed`` (default True) sends ``Accept-Encoding: gzip``; a gzipped answer is
    decoded chunk by chunk, so every frame is dispatched as soon as its bytes arrive.
    """

    url: str
    token: str
    on_event: Callable[[ServerSentEvent], None]
    on_status: Callable[[str], None] = lambda line: None
    last_event_id: str = ""
    max_events: int | None = None
    max_connections: int | None = None
    read_timeout_s: float = 60.0
    refresh_token: Callable[[], str] | None = None
    refresh_wait_s: float = TOKEN_REFRESH_WAIT_S
    compressed: bool = True

    def __post_init__(self) -> None:
        self.retry_ms = DEFAULT_RETRY_MS
        self.epoch: str | None = None
        self.connections = 0
        self.opened = 0
        self.events_seen = 0
        self._failures = 0
        self._rejected: set[str] = set()

    def run(self) -> int:
        """Stream until the session ends, a fatal status, or a limit is reached."""
        try:
            while self.max_connections is None or self.connections < self.max_connections:
                self.connections += 1
                try:
                    self._connect_once()
                    self._failures = 0
                except _RetryNow:  # a 401 and a fresh token at hand (SC-10): at once
                    continue
                except (OSError, http.client.HTTPException) as exc:
                    self._failures += 1
                    self.on_status(f"connection failed: {exc}")
                if self.max_connections is not None and self.connections >= self.max_connections:
                    break
                delay_s = self._delay_s()
                self.on_status(
                    f"reconnecting in {delay_s * 1000:.0f} ms (cursor {self.last_event_id or '-'})"
                )
                time.sleep(delay_s)
        except StreamEnd as end:
            self.on_status(str(end))
            return end.code
        if not self.opened:
            self.on_status(f"no connection opened in {self.connections} attempt(s)")
            return 1
        return 0

    def _delay_s(self) -> float:
        """Seconds before the next attempt (SC-11): the server's ``retry`` after a stream
        that opened; after ``n`` failed attempts, uniform in ``[ceiling/2, ceiling]`` with
        ``ceiling = min(30 s, retry * 2**n)``, and never below ``retry`` (the browser
        client's rule, static/qwenweb/sse_backoff.js ``computeReconnectDelayMs``)."""
        base = self.retry_ms / 1000
        if self._failures == 0:
            return base
        ceiling: float = min(_BACKOFF_CAP_S, base * 2.0 ** min(self._failures, 10))
        jittered = ceiling * (0.5 + random.random() / 2)  # noqa: S311 - jitter, not security
        return max(base, jittered)

    def _connect_once(self) -> None:
        conn, path = _connection(self.url, self.read_timeout_s)
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "text/event-stream"}
        if self.compressed:
            headers["Accept-Encoding"] = "gzip"
        if self.last_event_id:
            headers["Last-Event-ID"] = self.last_event_id
            if self.epoch:
                headers["X-Event-Epoch"] = self.epoch
        parser: SSEParser | None = None
        try:
            conn.request("GET", path, headers=headers)
            response = conn.getresponse()
            self._check_status(response)
            self.opened += 1
            self.epoch = response.getheader("X-Event-Epoch") or self.epoch
            self.on_status(f"connected (cursor {self.last_event_id or '-'}, epoch {self.epoch})")
            parser = SSEParser(
                self._dispatch, on_retry=self._set_retry, last_event_id=self.last_event_id
            )
            encoding = (response.getheader("Content-Encoding") or "").strip().lower()
            inflate = zlib.decompressobj(zlib.MAX_WBITS | 16) if encoding == "gzip" else None
            while True:
                chunk = response.read1(65536)
                if not chunk:
                    parser.end()
                    return
                parser.feed_bytes(inflate.decompress(chunk) if inflate is not None else chunk)
        except TimeoutError:
            self.on_status("no data (not even a heartbeat) for too long")
        finally:
            conn.close()
            if parser is not None:  # an id-only block moves the cursor too (SC-6)
                self.last_event_id = parser.last_event_id

    def _renew_token(self, why: str) -> bool:
        """Take a fresh token from ``refresh_token``; False if there is none to take."""
        self._rejected.add(self.token)
        if self.refresh_token is None:
            return False
        deadline = time.monotonic() + self.refresh_wait_s
        waiting = False
        while True:
            try:
                token = self.refresh_token().strip()
            except OSError as exc:
                self.on_status(f"could not refresh the token: {exc}")
                return False
            if token and token not in self._rejected:
                break
            if time.monotonic() >= deadline:
                self.on_status(f"{why}: no new token to retry with")
                return False
            if not waiting:
                waiting = True
                self.on_status(f"{why}: waiting up to {self.refresh_wait_s:g} s for a new token")
            time.sleep(_TOKEN_REFRESH_POLL_S)
        self.token = token
        self.on_status(f"{why}: retrying with a fresh token")
        return True

    def _check_status(self, response: http.client.HTTPResponse) -> None:
        if response.status == 204:
            raise StreamEnd("session ended (204)", 0)
        content_type = (response.getheader("Content-Type") or "").split(";")[0].strip().lower()
        if response.status == 200 and content_type == "text/event-stream":
            return
        body = response.read()
        if response.status == 401:
            if self._renew_token("401"):
                raise _RetryNow
            raise StreamEnd(str(ApiCallError(401, body)), 2)
        if 400 <= response.status < 500:
            raise StreamEnd(str(ApiCallError(response.status, body)), 1)
        raise http.client.HTTPException(f"HTTP {response.status} ({content_type or 'no type'})")

    def _set_retry(self, retry_ms: int) -> None:
        self.retry_ms = retry_ms

    def _dispatch(self, event: ServerSentEvent) -> None:
        # The parser is seeded with the cursor, so synthetic frames (no id) keep it (SC-9).
        self.last_event_id = event.last_event_id
        self.events_seen += 1
        self.on_event(event)
        if event.type in ("client_evicted", "stream_error"):
            self.on_status(f"{event.type}: the server ended this connection")
            if event.type == "stream_error" and _error_code(event.data) in _TOKEN_CODES:
                self._renew_token(_error_code(event.data))
        if self.max_events is not None and self.events_seen >= self.max_events:
            raise StreamEnd(f"stopped after {self.events_seen} events", 0)
