"""API keys: creation (clear key returned once), rotation, revocation (each one written to
the audit log) and verification (hash compare)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from .. import compiled
from ..errors import Conflict, InvalidInput, NotFound
from ..models import ApiKey, AuditEvent, Scope, Source
from .audit import audit_record

KEY_PREFIX = "claw"


@dataclass(frozen=True, slots=True)
class VerifiedKey:
    key_id: int
    source_id: int
    source_name: str
    scopes: frozenset[str]
    extra_source_ids: frozenset[int] = frozenset()  # ApiKey.extra_source_ids

    def has_scope(self, scope: str) -> bool:
        return Scope.ADMIN in self.scopes or scope in self.scopes

    @property
    def source_ids(self) -> frozenset[int]:
        """The key's sources: its own and those granted to it."""
        return self.extra_source_ids | {self.source_id}

    @property
    def write_sources(self) -> frozenset[int] | None:
        """The sources it writes into (pool/tenancy.py); None for an admin key: any."""
        return None if Scope.ADMIN in self.scopes else self.source_ids

    @property
    def read_sources(self) -> frozenset[int] | None:
        """The sources it reads; None for a read or admin key: any."""
        return None if Scope.ADMIN in self.scopes or Scope.READ in self.scopes else self.source_ids


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@transaction.atomic
def api_key_create(
    *,
    name: str,
    scopes: list[str],
    source_name: str | None = None,
    source_kind: str = Source.Kind.AGENT,
    extra_sources: list[str] | None = None,
    actor: str = "",
) -> tuple[ApiKey, str]:
    """Create a key (and its Source on first sight). Returns (row, clear key). Not idempotent:
    each call mints a new key. ``extra_sources``: names of existing sources the key may also
    write and read as its own (pool/tenancy.py); InvalidInput for an unknown one. Audited
    (api_key.create)."""
    bad = [s for s in scopes if s not in Scope.values]
    if not scopes or bad:
        raise InvalidInput(
            f"scopes must be a non-empty subset of {sorted(Scope.values)}; got {bad or scopes}",
            field="scopes",
        )
    extra = sorted(set(extra_sources or ()))
    granted = list(Source.objects.filter(name__in=extra))
    unknown = sorted(set(extra) - {g.name for g in granted})
    if unknown:
        raise InvalidInput(f"unknown sources {unknown}", field="extra_sources")
    source, _ = Source.objects.get_or_create(name=source_name or name, defaults={"kind": source_kind})
    key, clear = _mint(source=source, name=name, scopes=scopes, extra=sorted(g.id for g in granted))
    details: dict = {"name": name, "source": source.name, "scopes": key.scopes}
    if extra:
        details["extra_sources"] = extra
    audit_record(action=AuditEvent.Action.API_KEY_CREATE, target=key.prefix, actor=actor, details=details)
    return key, clear


@transaction.atomic
def api_key_rotate(*, prefix: str, actor: str = "") -> tuple[ApiKey, str]:
    """Replace the live key ``prefix`` by a new one with the same name, source and scopes, and
    revoke the old one, in one transaction. Returns (new row, new clear key). NotFound for an
    unknown prefix, Conflict for a revoked key (not idempotent: rotating twice mints twice).
    The old key stops working at once in this process, within CLAW_API_KEY_CACHE_SECONDS in
    others; capability URLs it issued end with it."""
    old = ApiKey.objects.select_for_update().select_related("source").filter(prefix=prefix).first()
    if old is None:
        raise NotFound(f"no API key with prefix {prefix!r}", field="prefix")
    if old.revoked_at is not None:
        raise Conflict(f"API key {prefix!r} is revoked; create a new one instead", field="prefix")
    new, clear = _mint(
        source=old.source, name=old.name, scopes=list(old.scopes), extra=list(old.extra_source_ids)
    )
    old.revoked_at = timezone.now()
    old.save(update_fields=["revoked_at"])
    audit_record(
        action=AuditEvent.Action.API_KEY_ROTATE,
        target=prefix,
        actor=actor,
        details={"new_prefix": new.prefix, "name": old.name, "source": old.source.name},
    )
    transaction.on_commit(_cache.clear)
    return new, clear


@transaction.atomic
def api_key_revoke(*, prefix: str, actor: str = "") -> ApiKey:
    """Revoke the key ``prefix``. Idempotent: a revoked key stays revoked (no new audit row).
    NotFound for an unknown prefix. Takes effect as api_key_rotate's old key does."""
    key = ApiKey.objects.select_for_update().filter(prefix=prefix).first()
    if key is None:
        raise NotFound(f"no API key with prefix {prefix!r}", field="prefix")
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
        audit_record(
            action=AuditEvent.Action.API_KEY_REVOKE, target=prefix, actor=actor, details={"name": key.name}
        )
        transaction.on_commit(_cache.clear)
    return key


def _mint(*, source: Source, name: str, scopes: list[str], extra: Sequence[int] = ()) -> tuple[ApiKey, str]:
    prefix = secrets.token_hex(6)
    clear = f"{KEY_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    key = ApiKey.objects.create(
        source=source,
        name=name,
        prefix=prefix,
        key_hash=_hash(clear),
        scopes=sorted(set(scopes)),
        extra_source_ids=list(extra),
    )
    return key, clear


# Verified keys are cached briefly per process: one DB read per key per window instead of one
# per request (the gateway's hot path). Revocation takes effect within the window.
# A plain dict, not cachetools.TTLCache: the event loop reads it while request threads write
# it, and each dict get/set is atomic, so no lock is needed (a lost race costs one extra DB
# read). TTLCache is not thread-safe (reads reorder it; its timer keeps a shared counter):
# under the lock it needs, a hit costs ~13x more (bench.key_cache). Full at _MAX_CACHED, it is
# emptied rather than evicted entry by entry: the window refills it.
_cache: dict[str, tuple[float, VerifiedKey | None]] = {}
_MAX_CACHED = 10_000
MISS = object()  # api_key_cached: "not in the cache", as opposed to a cached "invalid key"


def api_key_cached(clear: str) -> VerifiedKey | None | object:
    """The cached verdict for ``clear`` (a VerifiedKey, or None for an invalid key), or MISS.
    No I/O: async callers check this before paying a thread hop for api_key_verify."""
    hit = _cache.get(clear)
    if hit is not None and hit[0] > time.monotonic():
        return hit[1]
    return MISS


def api_key_verify(clear: str) -> VerifiedKey | None:
    """Return the key's identity if ``clear`` is a live key, else None. Read-only."""
    cached = api_key_cached(clear)
    if cached is not MISS:
        return cached  # type: ignore[return-value]
    result = _verify_uncached(clear)
    ttl = settings.CLAW_API_KEY_CACHE_SECONDS
    if ttl > 0:
        if len(_cache) >= _MAX_CACHED:
            _cache.clear()
        _cache[clear] = (time.monotonic() + ttl, result)
    return result


def _verify_uncached(clear: str) -> VerifiedKey | None:
    parts = clear.split("_")
    if len(parts) < 3 or parts[0] != KEY_PREFIX:
        return None
    rows = compiled.read(_live_key, prefix=parts[1])
    if not rows:
        return None
    key_id, key_hash, scopes, extra_source_ids, source_id, source_name = rows[0]
    if not hmac.compare_digest(key_hash, _hash(clear)):
        return None
    return VerifiedKey(
        key_id=key_id,
        source_id=source_id,
        source_name=source_name,
        scopes=frozenset(scopes),
        extra_source_ids=frozenset(extra_source_ids or ()),
    )


def _live_key(*, prefix: str):
    """The build of the live key's read by its prefix (pool/compiled.py: every request whose
    key is not cached makes it)."""
    return (
        ApiKey.objects.filter(prefix=prefix, revoked_at__isnull=True)
        .order_by("id")
        .values_list("id", "key_hash", "scopes", "extra_source_ids", "source_id", "source__name")[:1]
    )
