"""Operations endpoints beside /healthz: /readyz (may this process take traffic?) and
/metrics (Prometheus). See docs/operations.md, "Production"."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

from claw_kit import metrics
from claw_kit.web.errors import error_body
from pool.access.auth import bearer_token
from pool.models import Scope
from pool.services.api_keys import api_key_verify

from .observability import dependencies_check, pool_metric_families

# What a load balancer should wait before probing again after a 503.
READYZ_RETRY_AFTER_S = 5


def readyz(request: HttpRequest) -> JsonResponse:
    """200 {"database": "ok", "redis": "ok"|"not configured"} when every configured
    dependency answers; else 503 with Retry-After and ``failed`` naming what did not.
    Unauthenticated (like /healthz): it names dependencies, never addresses or errors' text."""
    if request.method not in ("GET", "HEAD"):
        return _method_not_allowed(request)
    checks = dependencies_check()
    failed = [name for name, state in checks.items() if state not in ("ok", "not configured")]
    if not failed:
        return JsonResponse(checks)
    resp = JsonResponse({**checks, "failed": failed}, status=503)
    resp["Retry-After"] = str(READYZ_RETRY_AFTER_S)
    return resp


def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus text format. Needs ``Authorization: Bearer <CLAW_METRICS_TOKEN>`` (a scrape
    token, when set), an admin-scope API key, or a staff session."""
    if request.method not in ("GET", "HEAD"):
        return _method_not_allowed(request)
    denied = _metrics_denied(request)
    if denied is not None:
        return denied
    body = metrics.exposition(metrics.FamiliesCollector(pool_metric_families()))
    return HttpResponse(body, content_type=metrics.CONTENT_TYPE)


def _metrics_denied(request: HttpRequest) -> JsonResponse | None:
    header = request.META.get("HTTP_AUTHORIZATION")
    if not header:
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated and user.is_staff:
            return None
        resp = JsonResponse(
            error_body(
                401, "send 'Authorization: Bearer <metrics token or admin API key>'", code="not_authenticated"
            ),
            status=401,
        )
        resp["WWW-Authenticate"] = 'Bearer realm="claw"'
        return resp
    token = bearer_token(header) or ""
    expected = settings.CLAW_METRICS_TOKEN
    if expected and hmac.compare_digest(token.encode(), expected.encode()):
        return None
    key = api_key_verify(token) if token else None
    if key is None:
        resp = JsonResponse(
            error_body(401, "invalid metrics token or API key", code="authentication_failed"), status=401
        )
        resp["WWW-Authenticate"] = 'Bearer realm="claw"'
        return resp
    if not key.has_scope(Scope.ADMIN):
        return JsonResponse(
            error_body(403, "/metrics needs an admin-scope API key", code="permission_denied"), status=403
        )
    return None


# Machine paths answer errors in JSON (the API's shape); the pages keep Django's HTML pages.
JSON_PREFIXES = ("/api/", "/v1/", "/t/", "/compat/", "/metrics", "/readyz", "/healthz")


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """settings handler404 (claw_site/urls.py): a JSON 404 for API and gateway paths, such as
    an unknown route or an id that does not fit its route (``leases/not-a-uuid/ack``)."""
    if request.path.startswith(JSON_PREFIXES):
        return JsonResponse(
            error_body(404, f"no such endpoint: {request.path}", code="not_found"), status=404
        )
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    """settings handler500 (claw_site/urls.py, gateway/proxy/routes.py): an unhandled error is
    a JSON 500 in the door's shape for API and gateway paths, the site's own page
    (templates/500.html) elsewhere; neither says more than that it happened (no settings, no
    routes, no traceback: those go to the log)."""
    if request.path.startswith(JSON_PREFIXES):
        message = "internal error; the server logged it"
        if request.path.endswith(("/v1/messages", "/v1/messages/count_tokens")):
            from gateway.proxy.doors.anthropic import error_body as anthropic_error_body

            return JsonResponse(anthropic_error_body(500, message), status=500)
        body = error_body(500, message, code="internal_error")
        return JsonResponse(body, status=500)
    return defaults.server_error(request)


def _method_not_allowed(request: HttpRequest) -> JsonResponse:
    resp = JsonResponse(
        error_body(405, f'method "{request.method}" not allowed', code="method_not_allowed"), status=405
    )
    resp["Allow"] = "GET, HEAD"
    return resp
