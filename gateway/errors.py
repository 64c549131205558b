"""One error shape for the whole API, modelled on OpenAI's so every client can read it:

    {"error": {"type": "invalid_request_error", "code": "invalid", "message": "...",
               "param": "steps[3].prompt_ids[17]"}}

``param`` names the offending field.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from pool.errors import PoolError

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


def api_exception_handler(exc, context):
    if isinstance(exc, PoolError):
        return Response(
            error_body(exc.status_code, exc.message, param=exc.field, code=exc.code), status=exc.status_code
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = exception_handler(exc, context)
    if response is None:
        return None
    param, message = _first_detail(exc.detail if isinstance(exc, exceptions.APIException) else str(exc))
    code = exc.default_code if isinstance(exc, exceptions.APIException) else "error"
    if isinstance(exc, exceptions.ValidationError):
        code = "invalid"
    response.data = error_body(response.status_code, message, param=param, code=code)
    if response.status_code == status.HTTP_401_UNAUTHORIZED:
        response["WWW-Authenticate"] = 'Bearer realm="claw"'
    return response


def _first_detail(detail: Any, path: str = "") -> tuple[str | None, str]:
    """Flatten DRF's nested error detail to (field path, message) of the first error."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            if key == "non_field_errors":
                return _first_detail(value, path)
            if path and (isinstance(key, int) or str(key).isdigit()):
                sub = f"{path}[{key}]"  # DRF keys list items by index: "rewards[0].reward"
            else:
                sub = f"{path}.{key}" if path else str(key)
            return _first_detail(value, sub)
    if isinstance(detail, list):
        if not detail:
            return (path or None, "invalid")
        # List of errors for one field, or a list of per-item dicts.
        for i, item in enumerate(detail):
            if isinstance(item, dict | list) and item:
                return _first_detail(item, f"{path}[{i}]")
            if not isinstance(item, dict | list):
                return (path or None, str(item))
        return (path or None, "invalid")
    return (path or None, str(detail))
