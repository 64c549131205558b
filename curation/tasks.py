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


@shared_task(
    name="curation.snapshot_build",
    acks_late=True,  # a worker killed mid-build: the task is redelivered and rebuilds
    autoretry_for=_TRANSIENT,
    retry_backoff=True,
    retry_backoff_max=300,
    max_retries=5,
    # Its pool process killed (settings: task_retry_on_worker_lost): rebuild 10 s later, not
    # Celery's default 3 minutes.
    default_retry_delay=10,
)
def snapshot_build(snapshot_id: str) -> None:
    """Build a snapshot's files. Idempotent: a done or vanished snapshot is left alone, and
    an interrupted build is redone from scratch with the same content. A build whose worker
    or pool process dies is run again (redelivery or retry); after max_retries the snapshot
    stays "building"."""
    from .services.snapshots import snapshot_build as build

    build(snapshot_id=snapshot_id)
