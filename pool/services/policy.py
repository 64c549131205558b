"""Policy versions."""

from __future__ import annotations

from django.db import connection, transaction

from ..errors import InvalidInput
from ..models import PolicyVersion

# Advisory lock key for "switch the current policy version" (arbitrary, fixed).
_SWITCH_LOCK = 0x436C6177_5056


@transaction.atomic
def policy_version_set(*, version: int, current: bool = True, metadata: dict | None = None) -> PolicyVersion:
    """Register a version and (by default) mark it current, unmarking the previous one.
    Idempotent. Concurrent switches serialise on a transaction-scoped lock (PostgreSQL;
    SQLite writers are serialised already), so the one-current constraint never fires."""
    if version < 0:
        raise InvalidInput("version must be >= 0", field="version")
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [_SWITCH_LOCK])
    pv, _ = PolicyVersion.objects.get_or_create(version=version)
    if metadata is not None:
        pv.metadata = metadata
        pv.save(update_fields=["metadata"])
    if current and not pv.is_current:
        PolicyVersion.objects.filter(is_current=True).update(is_current=False)
        PolicyVersion.objects.filter(version=version).update(is_current=True)
        pv.is_current = True
    return pv
