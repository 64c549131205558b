"""DRF's exception handler: every error of the REST API in the one shape of
claw_kit/web/errors.py, ``param`` naming the offending field (settings: EXCEPTION_HANDLER)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler

from .errors import ClientError, error_body


def api_exception_handler(exc, context):
    if isinstance(exc, ClientError):
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
