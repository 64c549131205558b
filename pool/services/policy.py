"""Policy versions: registering them, and moving the current one (bounded, audited)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connection, transaction

from ..errors import Conflict, InvalidInput
from ..models import AuditEvent, PolicyVersion
from .audit import audit_record

# Advisory lock key for "switch the current policy version" (arbitrary, fixed).
_SWITCH_LOCK = 0x436C6177_5056


@transaction.atomic
def policy_version_set(
    *,
    version: int,
    current: bool = True,
    metadata: dict | None = None,
    force: bool = False,
    actor: str = "",
    details: dict[str, Any] | None = None,
) -> PolicyVersion:
    """Register a version and (by default) mark it current, unmarking the previous one.
    Idempotent. Concurrent switches serialise on a transaction-scoped lock (PostgreSQL;
    SQLite writers are serialised already), so the one-current constraint never fires.

    The current version only moves forward, by at most ``CLAW_POLICY_MAX_STEP`` over the
    current one (over 0 when there is none): a jump further, or any move back, raises
    Conflict naming ``version`` unless ``force`` (who may force is the caller's check: the
    API lets admins only). Every change of the current version is audited
    (``policy.current``: actor, from, to, forced, plus ``details``)."""
    if version < 0:
        raise InvalidInput("version must be >= 0", field="version")
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [_SWITCH_LOCK])
    was = PolicyVersion.objects.filter(is_current=True).values_list("version", flat=True).first()
    if current and version != was and not force:
        _check_step(was, version)
    pv, _ = PolicyVersion.objects.get_or_create(version=version)
    if metadata is not None:
        pv.metadata = metadata
        pv.save(update_fields=["metadata"])
    if current and not pv.is_current:
        PolicyVersion.objects.filter(is_current=True).update(is_current=False)
        PolicyVersion.objects.filter(version=version).update(is_current=True)
        pv.is_current = True
        audit_record(
            action=AuditEvent.Action.POLICY_CURRENT,
            target=str(version),
            actor=actor,
            details={**(details or {}), "from": was, "to": version, "forced": bool(force)},
        )
    return pv


def _check_step(was: int | None, version: int) -> None:
    step = settings.CLAW_POLICY_MAX_STEP
    base = was if was is not None else 0
    if was is not None and version < was:
        raise Conflict(
            f"version {version} is behind the current version {was}: moving back needs "
            '"force": true (admins only)',
            field="version",
        )
    if version - base > step:
        raise Conflict(
            f"version {version} is more than CLAW_POLICY_MAX_STEP={step} above "
            f"{'the current version ' + str(was) if was is not None else '0 (no current version yet)'}: "
            'a jump this far needs "force": true (admins only)',
            field="version",
        )
