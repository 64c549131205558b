"""Operations endpoints beside /healthz: /readyz (may this process take traffic?) and
/metrics (Prometheus). See the README, "Production"."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from claw_site import metrics
from pool.models import Scope
from pool.services.api_keys import api_key_verify

from .auth import bearer_token
from .errors import error_body
from .observability import dependencies_check, pool_metric_families

# What a load balancer should wait before probing again after a 503.
READYZ_RETRY_AFTER_S = 5


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    """200 {"database": "ok", "redis": "ok"|"not configured"} when every configured
    dependency answers; else 503 with Retry-After and ``failed`` naming what did not.
    Unauthenticated (like /healthz): it names dependencies, never addresses or errors' text."""
    checks = dependencies_check()
    failed = [name for name, state in checks.items() if state not in ("ok", "not configured")]
    if not failed:
        return JsonResponse(checks)
    resp = JsonResponse({**checks, "failed": failed}, status=503)
    resp["Retry-After"] = str(READYZ_RETRY_AFTER_S)
    return resp


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Prometheus text format. Needs ``Authorization: Bearer <CLAW_METRICS_TOKEN>`` (a scrape
    token, when set), an admin-scope API key, or a staff session."""
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
