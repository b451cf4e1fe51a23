"""What the API accepts: JSON bodies and published events, checked field by field.

Every refusal is a 4xx :class:`~sessions.errors.ApiError` naming the field or the limit
(docs/protocol.md, "Errors and limits").
"""

from __future__ import annotations

import json
import sys
from typing import Any, Final

import orjson
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest

from sessions.backends.idempotency import (
    MAX_KEY_LENGTH,
    IdempotencyKey,
    is_valid_key,
    request_digest,
)
from sessions.conf import get_config
from sessions.errors import ApiError
from sessions.wire import sanitize_for_log
from sessions.wire.json_numbers import (
    ExactIntegers,
    LongIntegersError,
    finite_float,
    has_long_digit_run,
)

__all__ = [
    "MAX_DATA_DEPTH",
    "MAX_TITLE_LENGTH",
    "MAX_TYPE_LENGTH",
    "RESERVED_TYPES",
    "idempotency_key",
    "parse_json",
    "parse_json_body",
    "read_body",
    "refuse_unknown_fields",
    "validate_publish_body",
]

MAX_DATA_DEPTH: Final = 64
MAX_TYPE_LENGTH: Final = 200
MAX_TITLE_LENGTH: Final = 200
_PUBLISH_FIELDS: Final = frozenset({"type", "data", "_meta", "originatorClientId"})
#: Types the bus and the route make up (synthetic frames) or the server publishes itself:
#: a publisher may not forge them, since clients act on them (SC-12).
RESERVED_TYPES: Final = frozenset(
    {
        "slow_client_warning",
        "client_evicted",
        "state_resync_required",
        "replay_complete",
        "stream_error",
        "history_truncated",
        "session_closed",
    }
)


def read_body(request: HttpRequest) -> bytes:
    """Return the request's body as received.

    Raises ``ApiError`` 413 above ``PUBLISH_MAX_BODY_BYTES`` (declared or chunked), 400
    when ``Content-Length`` is not a number.
    """
    limit = get_config().publish_max_body_bytes
    too_large = ApiError(413, "body_too_large", f"body exceeds {limit} bytes", limit=limit)
    try:
        declared = int(request.headers.get("Content-Length") or 0)
    except ValueError:
        raise ApiError(400, "invalid_request", "Content-Length is not a number") from None
    if declared > limit:
        raise too_large
    try:
        body = request.body
    except RequestDataTooBig:
        raise too_large from None
    if len(body) > limit:
        raise too_large
    return body


def parse_json(body: bytes, *, required: bool) -> Any:
    """Return the JSON value of ``body``; ``{}`` when empty and not ``required``.

    Raises ``ApiError`` 400 when it is not JSON (NaN, Infinity and numbers no float holds,
    like ``1e400``, are not JSON). Integers beyond 64 bits keep their exact value (orjson
    would read them as floats): a body with a run of 19 digits is read again by ``json``,
    its long integers bounded in all (``sessions.wire.json_numbers``; 400 past it). CPU in
    proportion to the number of values and bytes: call it through
    ``sessions.web.offload.off_loop_if_heavy`` for a body that may be large.
    """
    if not body.strip():
        if required:
            raise ApiError(400, "invalid_json", "a JSON object body is required", field="")
        return {}
    long_digits = has_long_digit_run(body)  # (sessions.wire.json_numbers)
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        # 309+ digits overflow orjson's double ("infinity"): json reads them exactly.
        if not (long_digits and "infinity" in str(exc)):
            raise ApiError(400, "invalid_json", _json_problem(body, exc), field="") from None
    if long_digits:
        try:
            parsed = json.loads(
                body,
                parse_constant=_reject_constant,
                parse_float=finite_float,
                parse_int=ExactIntegers(),
            )
        except ValueError as exc:  # (json's own error is a ValueError too)
            raise ApiError(400, "invalid_json", _long_number_problem(exc), field="") from None
    return parsed


def _long_number_problem(exc: ValueError) -> str:
    """Say why a body with long numbers is refused (Python's cap on an integer's digits,
    ``sys.get_int_max_str_digits()``, or JSON that only orjson's overflow hid)."""
    if isinstance(exc, LongIntegersError):
        return str(exc)
    if "digits" in str(exc):
        return (
            "body is not valid JSON: an integer has more than "
            f"{sys.get_int_max_str_digits()} digits"
        )
    return f"body is not valid JSON: {exc}"


def parse_json_body(request: HttpRequest, *, required: bool) -> Any:
    """Return the request's JSON body (:func:`read_body`, then :func:`parse_json`)."""
    return parse_json(read_body(request), required=required)


def _json_problem(body: bytes, exc: orjson.JSONDecodeError) -> str:
    """Say in words why ``body`` is not JSON (orjson's own message where it is clear)."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as bad:
        return f"body is not valid UTF-8 (byte {bad.start})"
    if "recursion" in str(exc) or "depth" in str(exc):
        return f"body is nested deeper than {MAX_DATA_DEPTH} levels"
    return f"body is not valid JSON: {exc}"


def refuse_unknown_fields(body: dict[str, Any], known: frozenset[str], code: str) -> None:
    """Raise a 400 ``code`` naming the first unknown key of ``body`` (so a typo is never
    silently dropped)."""
    unknown = sorted(sanitize_for_log(key, 40) for key in set(body) - known)
    if unknown:
        raise ApiError(400, code, f"unknown field(s): {', '.join(unknown[:5])}", field=unknown[0])


def _reject_constant(name: str) -> Any:
    raise ApiError(400, "invalid_json", f"body is not valid JSON: {name} is not allowed", field="")


def _json_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether a container of parsed JSON ``value`` sits deeper than ``limit`` (``value``
    itself is at depth 1). Walks one level at a time with list operations, about ten
    times faster than a stack of (item, depth) pairs: 60 ms for 700,000 values."""
    level: list[Any] = [value]
    for _ in range(limit):
        below: list[Any] = []
        for item in level:
            if isinstance(item, dict):
                below.extend(item.values())
            elif isinstance(item, list):
                below.extend(item)
        if not below:
            return False
        level = below
    return any(isinstance(item, dict | list) for item in level)


def validate_publish_body(body: Any) -> dict[str, Any]:
    """Return the event to publish from a request body, or raise a 400 ``ApiError``.

    Shape: ``{"type": str (1..200 chars, no CR/LF/NUL), "data": any JSON (nesting <= 64),
    "_meta": object (optional), "originatorClientId": str (optional)}``; other keys are
    refused so a typo is not silently dropped. The error names the field.
    """
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_event", "body must be a JSON object", field="")
    refuse_unknown_fields(body, _PUBLISH_FIELDS, "invalid_event")
    event_type = body.get("type")
    if not isinstance(event_type, str) or not event_type:
        raise ApiError(400, "invalid_event", "type must be a non-empty string", field="type")
    if len(event_type) > MAX_TYPE_LENGTH or any(ch in event_type for ch in "\r\n\0"):
        raise ApiError(
            400,
            "invalid_event",
            f"type must be at most {MAX_TYPE_LENGTH} characters without CR, LF or NUL",
            field="type",
        )
    if event_type in RESERVED_TYPES:
        raise ApiError(
            400,
            "invalid_event",
            f"type {event_type!r} is reserved for frames the server makes",
            field="type",
        )
    if "_meta" in body and not isinstance(body["_meta"], dict):
        raise ApiError(400, "invalid_event", "_meta must be an object", field="_meta")
    originator = body.get("originatorClientId")
    if originator is not None and (not isinstance(originator, str) or len(originator) > 200):
        raise ApiError(
            400,
            "invalid_event",
            "originatorClientId must be a string of at most 200 characters",
            field="originatorClientId",
        )
    if _json_depth_exceeds(body.get("data"), MAX_DATA_DEPTH) or _json_depth_exceeds(
        body.get("_meta"), MAX_DATA_DEPTH
    ):
        raise ApiError(
            400,
            "invalid_event",
            f"data is nested deeper than {MAX_DATA_DEPTH} levels",
            field="data",
        )
    return body


def idempotency_key(request: HttpRequest, kind: str) -> IdempotencyKey | None:
    """Return the request's ``Idempotency-Key`` with the digest of the request, or None.

    ``kind`` names the endpoint (``"events"``: the digest covers the body as received;
    ``"close"``: the body is ignored). Read before the body is validated, so a bad key is
    refused whatever the body.

    Raises:
        ApiError: 400 ``invalid_idempotency_key`` (``header: "Idempotency-Key"``) when the
            value is empty, longer than 128 characters, not printable ASCII, or holds a
            comma (two headers, which Django joins with one).
    """
    raw = request.headers.get("Idempotency-Key")
    if raw is None:
        return None
    # Two Idempotency-Key headers reach Django joined by a comma: refused, never one key.
    if not is_valid_key(raw) or "," in raw:
        raise ApiError(
            400,
            "invalid_idempotency_key",
            "Idempotency-Key must be one header of 1 to "
            f"{MAX_KEY_LENGTH} printable ASCII characters without a comma",
            header="Idempotency-Key",
            log_extra=f" value={sanitize_for_log(raw, 60)!r}",
        )
    body = request.body if kind == "events" else b""
    return IdempotencyKey(raw, request_digest(kind, body))
