"""Policy versions."""

from __future__ import annotations

from django.db import transaction

from ..errors import InvalidInput
from ..models import PolicyVersion


def policy_version_ensure(*, version: int) -> None:
    """Create the version row if missing. Idempotent."""
    PolicyVersion.objects.get_or_create(version=version)


@transaction.atomic
def policy_version_set(*, version: int, current: bool = True, metadata: dict | None = None) -> PolicyVersion:
    """Register a version and (by default) mark it current, unmarking the previous one.
    Idempotent. Locks the current row so concurrent switches serialise."""
    if version < 0:
        raise InvalidInput("version must be >= 0", field="version")
    pv, _ = PolicyVersion.objects.get_or_create(version=version)
    if metadata is not None:
        pv.metadata = metadata
        pv.save(update_fields=["metadata"])
    if current and not pv.is_current:
        list(PolicyVersion.objects.select_for_update().filter(is_current=True))
        PolicyVersion.objects.filter(is_current=True).update(is_current=False)
        PolicyVersion.objects.filter(version=version).update(is_current=True)
        pv.is_current = True
    return pv
