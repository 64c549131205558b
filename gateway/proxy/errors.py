"""OpenAI-shaped error responses of the gateway endpoints (see gateway/errors.py)."""

from __future__ import annotations

import orjson
from django.http import HttpResponse

from ..errors import error_body


class ProxyError(Exception):
    """Raised by gateway code to answer ``status`` with an OpenAI error body."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


class DoorInputError(Exception):
    """A request field a door cannot translate: answered 400 naming ``param``."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


def error_response(
    status: int, message: str, *, code: str | None = None, param: str | None = None
) -> HttpResponse:
    """``{"error": {"type", "code", "message", "param"}}`` with ``status``."""
    body = error_body(status, message, param=param, code=code)
    if status >= 500:
        body["error"]["type"] = "upstream_error" if status in (502, 504) else "api_error"
    response = HttpResponse(orjson.dumps(body), status=status, content_type="application/json")
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="claw"'
    return response
