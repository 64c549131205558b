"""The audit log: one row per key action (pool.models.AuditEvent)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from ..models import AuditEvent


def audit_record(
    *, action: str, target: str, actor: str = "", details: dict[str, Any] | None = None
) -> AuditEvent:
    """Record ``action`` on ``target``. Called inside the action's own transaction, so the row
    commits or rolls back with it. Not idempotent: each call is one more row."""
    assert transaction.get_connection().in_atomic_block, "audit_record runs inside the action's transaction"
    return AuditEvent.objects.create(
        action=action, target=target[:200], actor=actor[:160], details=details or {}
    )
