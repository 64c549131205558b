"""Project-wide middleware.

``JsonNotFoundMiddleware``: an unmatched API path is the JSON 404 of claw_site/ops.py
(handler404) with DEBUG on too, where Django would answer its debug page listing every route.

``DatabaseUnavailableMiddleware``: when the database is down or restarting, a request that
needed it is answered ``503`` with ``Retry-After`` in the API's error shape, not a 500 page.
Django hands a broken connection back (it is closed at the end of the request, and the
psycopg pool discards it), so the app recovers by itself once the server is back. The
gateway's own lean path answers the same way (gateway/proxy/views.py)."""

from __future__ import annotations

from django.db import InterfaceError, OperationalError
from django.http import JsonResponse
from django.utils.deprecation import MiddlewareMixin

from claw_kit.web.errors import error_body

RETRY_AFTER_SECONDS = 5


class DatabaseUnavailableMiddleware(MiddlewareMixin):
    def process_exception(self, request, exception):
        if not isinstance(exception, OperationalError | InterfaceError):
            return None
        response = JsonResponse(
            error_body(
                503,
                "the database is unavailable; retry shortly",
                code="database_unavailable",
            ),
            status=503,
        )
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response


class JsonNotFoundMiddleware(MiddlewareMixin):
    def process_response(self, request, response):
        if response.status_code != 404 or response.get("Content-Type", "").startswith("application/json"):
            return response
        from .ops import JSON_PREFIXES, not_found

        if request.path.startswith(JSON_PREFIXES):
            return not_found(request)
        return response
