"""One error shape for the whole API, modelled on OpenAI's so every client can read it:

    {"error": {"type": "invalid_request_error", "code": "invalid", "message": "...",
               "param": "steps[3].prompt_ids[17]"}}

``param`` names the offending field. This module is the shape alone and the plain Django
answer of it (no DRF import: the JSON body reader and the proxy doors use it while DRF's
settings are still loading); DRF's exception handler that maps every error of the REST API
to it is claw_kit/web/exception_handler.py.
"""

from __future__ import annotations

from typing import Any

import orjson
from django.http import HttpResponse

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


def error_body(
    status_code: int, message: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "type": _TYPES.get(status_code, "api_error"),
            "code": code or "error",
            "message": message,
            "param": param,
        }
    }


class ClientError(Exception):
    """An error the client can act on, raised below the web layer (the pool's domain errors
    derive from it): ``status_code``, ``code`` and ``field`` (the offending input, e.g.
    ``steps[3].step_index``) become the error body."""

    status_code = 400
    code = "invalid"

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class HttpError(Exception):
    """Raised by request-handling code outside DRF to answer ``status`` with the error body."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


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
