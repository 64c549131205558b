"""Celery tasks of curation. Thin and idempotent: one service call."""

from __future__ import annotations

from celery import shared_task
from django.db import InterfaceError, OperationalError

_TRANSIENT = (OperationalError, InterfaceError)


@shared_task(
    name="curation.leases_expire",
    autoretry_for=_TRANSIENT,
    retry_backoff=True,
    retry_backoff_max=300,
    max_retries=5,
)
def leases_expire() -> int:
    """Periodic (celery beat): end every lease past its expiry, so its units are
    deliverable again. A consumer's own pull does this for its leases too; this keeps the
    lease table honest for consumers that stopped pulling. Idempotent."""
    from .services.consume import leases_expire as expire

    return expire()
