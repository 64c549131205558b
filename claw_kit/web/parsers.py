"""DRF request parsers over the site's one body reader (claw_kit/web/body.py)."""

from __future__ import annotations

from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import BaseParser

from . import body


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "request body too large"
    default_code = "payload_too_large"


def _drf(exc: body.BodyError) -> APIException:
    return PayloadTooLarge(exc.message) if exc.status == 413 else ParseError(exc.message)


class LimitedBodyParser(BaseParser):
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
        try:
            return self.decode(body.read_limited(stream, length))
        except body.BodyError as exc:
            raise _drf(exc) from None


class FastJSONParser(LimitedBodyParser):
    media_type = "application/json"

    def decode(self, data: bytes):
        if not data:
            raise ParseError("empty body; expected JSON")
        return body.loads(data)
