"""One error shape for the whole API, modelled on OpenAI's so every client can read it:

    {"error": {"type": "invalid_request_error", "code": "invalid", "message": "...",
               "param": "steps[3].prompt_ids[17]"}}

``param`` names the offending field. This module is the shape alone (no DRF import: the
JSON body reader and the proxy's errors use it while DRF's settings are still loading);
DRF's exception handler that maps every error to it is gateway/exception_handler.py.
"""

from __future__ import annotations

from typing import Any

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
