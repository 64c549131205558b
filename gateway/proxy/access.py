"""Who may call the async gateway endpoints (scope ``ingest``).

Three credentials, in order of precedence:

* a trajectory token in the path (a capability URL, ``.../c/<token>/<trajectory>/...``):
  it alone authorises calls on its own trajectory, and any Authorization header is ignored
  (agents send ``Bearer not-needed``); pool.services.capabilities checks it on every call;
* an API key in the path (a gateway URL, ``/compat/claw-r1/k/<key>/...``);
* ``Authorization: Bearer <key>``, else ``x-api-key: <key>`` (Anthropic's clients).

The key lookup (pool.services.api_keys.api_key_verify) runs on a database thread only when
its per-process cache (CLAW_API_KEY_CACHE_SECONDS) has no verdict: a warm request needs no
thread hop for auth. Revocation takes effect within that window.
"""

from __future__ import annotations

from django.http import HttpRequest

from claw_kit.web.errors import HttpError
from pool.access.auth import bearer_token
from pool.errors import PoolError
from pool.models import Scope
from pool.services.api_keys import MISS, VerifiedKey, api_key_cached, api_key_verify
from pool.services.capabilities import trajectory_capability_verify

from .db import run_db


async def authorise(
    request: HttpRequest,
    *,
    api_key: str | None = None,
    capability: str | None = None,
    trajectory_uid: str | None = None,
) -> VerifiedKey:
    """The caller's identity for an ingest call on ``trajectory_uid`` (see the module
    docstring for the credentials); raises HttpError 401 or 403."""
    if capability is not None:
        if trajectory_uid is None:  # pragma: no cover - every capability route names it
            raise HttpError(400, "a capability URL names its trajectory", code="invalid_uid")
        try:
            return await run_db(trajectory_capability_verify, token=capability, trajectory_uid=trajectory_uid)
        except PoolError as e:
            raise HttpError(e.status_code, e.message, code=e.code, param=e.field) from None
    return await require_key(request, token=api_key)


async def require_key(
    request: HttpRequest, scope: str = Scope.INGEST, *, token: str | None = None
) -> VerifiedKey:
    """The request's verified key: ``token`` (a key taken from the URL path) if given, else
    the Bearer header's; raises HttpError 401 (missing/invalid) or 403 (scope)."""
    in_path = token is not None
    if token is None:
        # Anthropic's clients send their key as x-api-key; every endpoint takes either.
        token = bearer_token(request.META.get("HTTP_AUTHORIZATION")) or request.META.get("HTTP_X_API_KEY")
    if token is None:
        raise HttpError(
            401,
            "missing API key: send 'Authorization: Bearer <api key>' or 'x-api-key: <api key>'",
            code="invalid_api_key",
        )
    cached = api_key_cached(token)
    key = await run_db(api_key_verify, token) if cached is MISS else cached
    if not isinstance(key, VerifiedKey):
        where = " in the gateway URL" if in_path else ""
        raise HttpError(401, f"invalid or revoked API key{where}", code="invalid_api_key")
    if not key.has_scope(scope):
        raise HttpError(403, f"this API key lacks the '{scope}' scope", code="permission_denied")
    return key
