"""Celery tasks of the pool. Thin and idempotent: ids in, one service call.

Enqueued with transaction.on_commit by the services that make them necessary. Database
hiccups (a lost connection, a failover) are retried with exponential backoff; any other
error is the service's to record.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.db import InterfaceError, OperationalError, transaction

log = logging.getLogger(__name__)

_TRANSIENT = (OperationalError, InterfaceError)


@shared_task(
    name="pool.group_merge",
    autoretry_for=_TRANSIENT,
    retry_backoff=True,
    retry_backoff_max=300,
    max_retries=5,
)
def group_merge(group_id: int) -> None:
    """Compute (or refresh) the prefix-tree merge of a complete prompt group. Idempotent: an
    unchanged input is skipped; a vanished group is ignored."""
    from .services.merge import group_merge_compute

    if group_merge_compute(group_id=group_id) is None:
        log.info("group_merge: group %s no longer exists", group_id)


@shared_task(
    name="pool.steps_merge",
    autoretry_for=_TRANSIENT,
    retry_backoff=True,
    retry_backoff_max=300,
    max_retries=5,
)
def steps_merge(key: str, step_ids: list[int]) -> None:
    """Merge the content of a batch or snapshot on demand, stored under ``key``. Idempotent:
    an unchanged input is skipped; if some of the steps are gone, nothing is stored."""
    from .errors import NotFound
    from .services.merge import steps_merge_compute

    try:
        steps_merge_compute(key=key, step_ids=step_ids)
    except NotFound as exc:
        log.warning("steps_merge %s skipped: %s", key, exc.message)


@shared_task(
    name="pool.trajectory_rewards_compute",
    autoretry_for=_TRANSIENT,
    retry_backoff=True,
    retry_backoff_max=300,
    max_retries=5,
)
def trajectory_rewards_compute(trajectory_id: int) -> dict[str, int]:
    """Compute the reward of a completed trajectory whose data source names a reward
    function (pool/services/reward_compute.py). Idempotent: a rewarded, running or vanished
    trajectory is skipped; a failing function is recorded as a RewardFailure, not raised."""
    from .services.reward_compute import trajectory_rewards_compute as compute

    return compute(trajectory_id=trajectory_id)


@shared_task(
    name="pool.group_rewards_compute",
    autoretry_for=_TRANSIENT,
    retry_backoff=True,
    retry_backoff_max=300,
    max_retries=5,
)
def group_rewards_compute(group_id: int) -> dict[str, int]:
    """Compute the rewards of a complete group's unrewarded rollouts (a group function such
    as the LLM judge scores them together). Idempotent, like trajectory_rewards_compute."""
    from .services.reward_compute import group_rewards_compute as compute

    return compute(group_id=group_id)


def enqueue_on_commit(task, *args) -> None:
    """Enqueue ``task(*args)`` once the caller's transaction commits, through the outbox.

    The task is stored (``OutboxTask``) in the caller's transaction, so it is durable exactly
    when the write is. After the commit it is published and its row deleted. Follow-up work
    never fails or stalls the write that caused it: the callback is ``robust`` and publishing
    does not retry inline, so a broker that is down costs one refused connection; the row
    stays and this process's background relay sends it when the broker is back
    (pool/services/outbox.py).
    """
    from .models import OutboxTask
    from .services import outbox

    row = OutboxTask.objects.create(name=task.name, args=list(args))

    def publish() -> None:
        if not outbox.publish(task.name, list(args), row.id):
            outbox.relay_soon()

    transaction.on_commit(publish, robust=True)


@shared_task(
    name="pool.outbox_relay",
    autoretry_for=_TRANSIENT,
    retry_backoff=True,
    retry_backoff_max=300,
    max_retries=5,
)
def outbox_relay() -> dict[str, int]:
    """Periodic (celery beat): send the tasks a process could not publish and left behind
    (its broker was down and it stopped before the broker came back)."""
    from .services.outbox import outbox_relay as relay

    return relay()


@shared_task(
    name="pool.readiness_sweep",
    autoretry_for=_TRANSIENT,
    retry_backoff=True,
    retry_backoff_max=300,
    max_retries=5,
)
def readiness_sweep() -> dict[str, int]:
    """Periodic (celery beat): abandon idle trajectories, complete groups, repair readiness
    an effect missed. Idempotent and bounded per run (pool/services/readiness.py)."""
    from .services.readiness import readiness_sweep as sweep

    return sweep()
