"""API-key checks for the async gateway endpoints (scope ``ingest``).

The key lookup (pool.services.api_keys.api_key_verify) runs on a database thread only when
its per-process cache (CLAW_API_KEY_CACHE_SECONDS) has no verdict: a warm request needs no
thread hop for auth. Revocation takes effect within that window.
"""

from __future__ import annotations

from django.http import HttpRequest

from pool.models import Scope
from pool.services.api_keys import MISS, VerifiedKey, api_key_cached, api_key_verify

from ..auth import bearer_token
from .db import run_db
from .errors import ProxyError


async def require_key(request: HttpRequest, scope: str = Scope.INGEST) -> VerifiedKey:
    """The request's verified key; raises ProxyError 401 (missing/invalid) or 403 (scope)."""
    token = bearer_token(request.META.get("HTTP_AUTHORIZATION"))
    if token is None:
        raise ProxyError(
            401, "missing API key: send 'Authorization: Bearer <api key>'", code="invalid_api_key"
        )
    cached = api_key_cached(token)
    key = await run_db(api_key_verify, token) if cached is MISS else cached
    if not isinstance(key, VerifiedKey):
        raise ProxyError(401, "invalid or revoked API key", code="invalid_api_key")
    if not key.has_scope(scope):
        raise ProxyError(403, f"this API key lacks the '{scope}' scope", code="permission_denied")
    return key
