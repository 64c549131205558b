"""API-key checks for the async gateway endpoints (scope ``ingest``).

The key lookup (pool.services.api_keys.api_key_verify) runs on a database thread; verified
keys are then cached on the event loop's side for CLAW_API_KEY_CACHE_SECONDS, so a warm
request needs no thread hop for auth. Revocation takes effect within that window.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.http import HttpRequest

from pool.models import Scope
from pool.services.api_keys import VerifiedKey, api_key_verify

from ..auth import bearer_token
from .db import run_db
from .errors import ProxyError

_cache: dict[str, tuple[float, VerifiedKey | None]] = {}
_MAX_CACHED = 10_000


async def require_key(request: HttpRequest, scope: str = Scope.INGEST) -> VerifiedKey:
    """The request's verified key; raises ProxyError 401 (missing/invalid) or 403 (scope)."""
    token = bearer_token(request.META.get("HTTP_AUTHORIZATION"))
    if token is None:
        raise ProxyError(401, "missing API key: send 'Authorization: Bearer <api key>'", code="invalid_api_key")
    now = time.monotonic()
    hit = _cache.get(token)
    if hit is not None and hit[0] > now:
        key = hit[1]
    else:
        key = await run_db(api_key_verify, token)
        ttl = settings.CLAW_API_KEY_CACHE_SECONDS
        if ttl > 0:
            if len(_cache) >= _MAX_CACHED:
                _cache.clear()
            _cache[token] = (now + ttl, key)
    if key is None:
        raise ProxyError(401, "invalid or revoked API key", code="invalid_api_key")
    if not key.has_scope(scope):
        raise ProxyError(403, f"this API key lacks the '{scope}' scope", code="permission_denied")
    return key
