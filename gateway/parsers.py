"""Request parsing: orjson for speed, a hard body limit (413), clear errors for bad JSON."""

from __future__ import annotations

import json

import orjson
from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import BaseParser


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "request body too large"
    default_code = "payload_too_large"


def read_limited(stream, content_length: int | None) -> bytes:
    limit = settings.CLAW_MAX_BODY_BYTES
    if content_length is not None and content_length > limit:
        raise PayloadTooLarge(f"request body is {content_length} bytes; the limit is {limit}")
    data = stream.read(limit + 1) if stream is not None else b""
    if len(data) > limit:
        raise PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
    return data


def loads(data: bytes):
    """Parse JSON. Non-standard NaN/Infinity literals are parsed (so the field validator can
    name the field that holds them); anything else malformed is a ParseError."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        try:
            return json.loads(data, parse_constant=float)
        except (ValueError, UnicodeDecodeError):
            raise ParseError(f"malformed JSON: {exc}") from None


class _LimitedBodyParser(BaseParser):
    """Reads the whole body within CLAW_MAX_BODY_BYTES and hands it to ``decode``."""

    def decode(self, data: bytes):
        raise NotImplementedError

    def parse(self, stream, media_type=None, parser_context=None):
        request = (parser_context or {}).get("request")
        length = None
        if request is not None:
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0) or None
            except ValueError:
                length = None
        return self.decode(read_limited(stream, length))


class FastJSONParser(_LimitedBodyParser):
    media_type = "application/json"

    def decode(self, data: bytes):
        if not data:
            raise ParseError("empty body; expected JSON")
        return loads(data)


class StepBatchParser(_LimitedBodyParser):
    """application/json -> list[StepIn], decoded and validated in one pass
    (gateway.validation.parse_step_batch_json)."""

    media_type = "application/json"

    def decode(self, data: bytes):
        from .validation import parse_step_batch_json

        return parse_step_batch_json(data)


class StepBatchMsgpackParser(_LimitedBodyParser):
    """application/msgpack -> list[StepIn]; token arrays may be packed int32 bins."""

    media_type = "application/msgpack"

    def decode(self, data: bytes):
        from .validation import parse_step_batch_msgpack

        return parse_step_batch_msgpack(data)
