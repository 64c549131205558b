"""Bearer API keys and scope permissions.

``Authorization: Bearer claw_<prefix>_<secret>``. A key authenticates as its Source; staff
users signed in to the admin (session) get every scope. Missing/wrong key -> 401, a key
without the needed scope -> 403.
"""

from __future__ import annotations

from dataclasses import dataclass

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions

from ..models import Scope
from ..services.api_keys import VerifiedKey, api_key_verify


@dataclass(frozen=True)
class KeyPrincipal:
    """request.user for API-key requests."""

    key: VerifiedKey
    is_authenticated: bool = True
    is_staff: bool = False
    is_active: bool = True

    @property
    def source_id(self) -> int:
        return self.key.source_id

    def __str__(self) -> str:
        return f"key:{self.key.source_name}"


def bearer_token(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


class ApiKeyAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        header = request.META.get("HTTP_AUTHORIZATION")
        if not header:
            return None
        token = bearer_token(header)
        if token is None:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <api key>'")
        key = api_key_verify(token)
        if key is None:
            raise exceptions.AuthenticationFailed("invalid or revoked API key")
        return (KeyPrincipal(key=key), key)

    def authenticate_header(self, request):
        return 'Bearer realm="claw"'


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """Documents ApiKeyAuthentication in the OpenAPI schema (registered on import)."""

    target_class = ApiKeyAuthentication
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key: `Authorization: Bearer claw_<prefix>_<secret>` "
            "(scopes: ingest, consume, read, policy, admin).",
        }


def principal_has_scope(user, scope: str) -> bool:
    if isinstance(user, KeyPrincipal):
        return user.key.has_scope(scope)
    return bool(user is not None and getattr(user, "is_authenticated", False) and user.is_staff)


def user_id_of(request) -> int | None:
    """The signed-in operator's id (session auth), or None for API keys."""
    user = getattr(request, "user", None)
    if user is None or isinstance(user, KeyPrincipal) or not getattr(user, "is_authenticated", False):
        return None
    return user.pk


def key_id_of(request) -> int | None:
    """The id of the request's API key, or None for an operator session."""
    user = getattr(request, "user", None)
    return user.key.key_id if isinstance(user, KeyPrincipal) else None


def source_id_of(request) -> int | None:
    """The key's own source (stamped on what it creates), or None for an operator session."""
    user = getattr(request, "user", None)
    return user.source_id if isinstance(user, KeyPrincipal) else None


def write_sources_of(request) -> frozenset[int] | None:
    """The sources the request may write into (pool/tenancy.py): the key's own and granted
    sources, or None (any) for an admin key or a staff session."""
    user = getattr(request, "user", None)
    return user.key.write_sources if isinstance(user, KeyPrincipal) else None


def read_sources_of(request) -> frozenset[int] | None:
    """The sources the request may read: the key's, or None (any) for a read or admin key
    and a staff session."""
    user = getattr(request, "user", None)
    return user.key.read_sources if isinstance(user, KeyPrincipal) else None


def served_sources_of(request) -> frozenset[int] | None:
    """The sources whose rows the request may read as datasets serve them (a dataset's
    preview, the dataset catalogue, snapshots): None (any) for a consume key, as its pulls
    are (consumption is not filtered by source: a trainer is served every source's units a
    dataset admits), else ``read_sources_of``."""
    user = getattr(request, "user", None)
    if isinstance(user, KeyPrincipal) and user.key.has_scope(Scope.CONSUME):
        return None
    return read_sources_of(request)


class ScopePermission(permissions.BasePermission):
    """Grants a request whose key holds any of ``scopes`` (admin keys and staff sessions hold
    them all); anonymous requests are 401, others 403."""

    scopes: tuple[str, ...] = ()

    def has_permission(self, request, view):
        user = request.user
        if user is None or not getattr(user, "is_authenticated", False):
            raise exceptions.NotAuthenticated("missing API key: send 'Authorization: Bearer <api key>'")
        if any(principal_has_scope(user, scope) for scope in self.scopes):
            return True
        wanted = " or ".join(repr(str(s)) for s in self.scopes)
        if isinstance(user, KeyPrincipal):
            self.message = f"this API key lacks the {wanted} scope"
        else:  # a signed-in account: sessions get every scope with staff access only
            self.message = f"this account lacks the {wanted} scope: it needs staff access, or use an API key"
        return False


class IngestScope(ScopePermission):
    scopes = (Scope.INGEST,)


class ReadScope(ScopePermission):
    """Reads are open to read, ingest and consume keys (a writer may read back its data)."""

    scopes = (Scope.READ, Scope.INGEST, Scope.CONSUME)


class ConsumeScope(ScopePermission):
    """Pulling batches under leases: trainers (consume keys)."""

    scopes = (Scope.CONSUME,)


class PolicyWriteScope(ScopePermission):
    """Policy versions are published by trainers: keys with the ``policy`` scope (trainer keys
    are created with consume + policy), admin keys and operators. Neither ingest nor consume
    implies it."""

    scopes = (Scope.POLICY,)
