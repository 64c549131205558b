"""The one JSON body reader of the site: size limit, parsing, error wording.

Every door reads request bodies here: the REST API's parsers (claw_kit/web/parsers.py), the
OpenAI-compatible endpoints (gateway/proxy/views.py) and the Claw-R1 layer
(gateway/compat/claw_r1.py). Errors are BodyError (an HttpError: 400 ``invalid_json`` or
413 ``payload_too_large``); the DRF parsers turn it into their own exceptions.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from django.conf import settings

from .errors import HttpError
from .guard import shape_problem


class BodyError(HttpError):
    """A body that is too large or not the JSON expected."""


def check_length(content_length: int | None) -> None:
    """413 before reading when the declared length is over CLAW_MAX_BODY_BYTES."""
    limit = settings.CLAW_MAX_BODY_BYTES
    if content_length is not None and content_length > limit:
        raise BodyError(
            413, f"request body is {content_length} bytes; the limit is {limit}", code="payload_too_large"
        )


def read_limited(stream: Any, content_length: int | None) -> bytes:
    """The body of a request stream, at most CLAW_MAX_BODY_BYTES (413 beyond)."""
    check_length(content_length)
    limit = settings.CLAW_MAX_BODY_BYTES
    data = stream.read(limit + 1) if stream is not None else b""
    if len(data) > limit:
        raise BodyError(413, f"request body exceeds the limit of {limit} bytes", code="payload_too_large")
    return data


def loads(data: bytes, *, lenient: bool = True) -> Any:
    """Parse JSON; anything malformed is a 400, and so is a value outside the guard's shape
    limits (claw_kit/web/guard.py: depth, keys, items). ``lenient``: non-standard
    NaN/Infinity literals are parsed (so the REST API's validators can name the field that
    holds them); bodies relayed as they are (OpenAI calls) are strict JSON."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if not lenient or "depth" in str(exc):
            raise BodyError(400, f"malformed JSON body: {exc}", code="invalid_json") from None
        try:
            # UTF-8 only (json.loads alone would guess UTF-16/32), and no lone surrogates
            # ("\ud800" parses, but is no text: PostgreSQL's jsonb refuses it, a 500 later).
            parsed = json.loads(data.decode("utf-8"), parse_constant=float)
            _check_text(parsed)
        except (ValueError, UnicodeError, RecursionError):
            raise BodyError(400, f"malformed JSON body: {exc}", code="invalid_json") from None
    check_shape(parsed)
    return parsed


def check_shape(value: Any, path: str = "") -> None:
    """400 ``invalid_json`` naming the first container beyond the guard's limits."""
    found = shape_problem(value, path)
    if found:
        at, reason = found
        raise BodyError(400, f"{at or 'the body'}: {reason}", code="invalid_json", param=at or None)


def _check_text(value: Any) -> None:
    """Raise UnicodeEncodeError if any string (key or value) in ``value`` holds a lone
    surrogate. Only on the stdlib fallback above, which is rare (malformed or NaN bodies)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii():
                item.encode("utf-8")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def json_object(data: bytes, *, empty_ok: bool = False, lenient: bool = False) -> dict[str, Any]:
    """A JSON object body. ``empty_ok``: an empty body (or ``null``) reads as ``{}``;
    ``lenient``: see ``loads``."""
    if not data.strip():
        if empty_ok:
            return {}
        raise BodyError(400, "empty body; expected a JSON object", code="invalid_json")
    body = loads(data, lenient=lenient)
    if body is None and empty_ok:
        return {}
    if not isinstance(body, dict):
        raise BodyError(400, "the body must be a JSON object", code="invalid_json")
    return body
