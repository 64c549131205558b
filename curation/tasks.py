"""Celery tasks of curation. Thin and idempotent: one service call.

Services never import tasks: a service emits an event (curation/events.py) and the
enqueueing is an effect of it, defined here and registered in curation/apps.py. The retry
settings are the pool's (pool.tasks.RETRY).
"""

from __future__ import annotations

from celery import shared_task

from pool.tasks import RETRY, enqueue_on_commit

from .events import DatasetVersionCurrent, SnapshotRequested
from .services import consume, counts, lineage, retention, snapshots


@shared_task(name="curation.leases_expire", **RETRY)
def leases_expire() -> int:
    """Periodic (celery beat): end every lease past its expiry, so its units are
    deliverable again. A consumer's own pull does this for its leases too; this keeps the
    lease table honest for consumers that stopped pulling. Idempotent."""
    return consume.leases_expire()


@shared_task(name="curation.checkpoints_index", **RETRY)
def checkpoints_index() -> int:
    """Periodic (celery beat): index the steps behind training runs' new checkpoints
    (services.lineage.checkpoint_index), a bounded number per run. Idempotent: a reader
    that needs a checkpoint's steps indexes it first, and either may run first."""
    return lineage.checkpoints_index_pending()


@shared_task(
    name="curation.snapshot_build",
    acks_late=True,  # a worker killed mid-build: the task is redelivered and rebuilds
    # Its pool process killed (settings: task_retry_on_worker_lost): rebuild 10 s later, not
    # Celery's default 3 minutes.
    default_retry_delay=10,
    **RETRY,
)
def snapshot_build(snapshot_id: str) -> None:
    """Build a snapshot's files. Idempotent: a done or vanished snapshot is left alone, and
    an interrupted build is redone from scratch with the same content. A build whose worker
    or pool process dies is run again (redelivery or retry); after max_retries the snapshot
    stays "building"."""
    snapshots.snapshot_build(snapshot_id=snapshot_id)


@shared_task(name="curation.retention_sweep", acks_late=True, **RETRY)
def retention_sweep() -> dict:
    """Periodic (celery beat, CLAW_RETENTION_SECONDS): every enabled retention policy.
    Idempotent, chunk by chunk (a pass killed midway is taken up by the next)."""
    return retention.retention_sweep().as_dict()


@shared_task(name="curation.dataset_count_build", acks_late=True, **RETRY)
def dataset_count_build(version_id: int) -> None:
    """Build the count of a dataset's new current version (services/counts.py). Idempotent:
    a built count is folded, a version no longer current is left alone."""
    counts.dataset_count_build(version_id)


@shared_task(name="curation.dataset_counts_sweep", **RETRY)
def dataset_counts_sweep() -> int:
    """Periodic (celery beat): every current version's count created, built and folded;
    older versions' counts dropped. Idempotent."""
    return counts.dataset_counts_sweep()


# --- effects (registered in curation/apps.py) ---------------------------------------------------
def snapshot_build_enqueue(event: SnapshotRequested) -> None:
    """A requested snapshot's build, after the commit (through the pool's outbox)."""
    enqueue_on_commit(snapshot_build, event.snapshot_id)


def dataset_count_enqueue(event: DatasetVersionCurrent) -> None:
    """A new current version's count, built after the commit (through the pool's outbox)."""
    enqueue_on_commit(dataset_count_build, event.version_id)
