"""Celery tasks of the pool. Thin and idempotent: ids in, one service call.

Tasks import services; services never import tasks. A service emits an event
(the bus, pool/bus.py) and the enqueueing of the tasks it makes necessary is an effect of
that event, defined here and registered in pool/apps.py: it stores an outbox row in the
write's transaction and publishes the task after the commit (``enqueue_on_commit``).
Database hiccups (a lost connection, a failover) are retried with exponential backoff
(``RETRY``, shared with curation/tasks.py); any other error is the service's to record.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task
from django.db import InterfaceError, OperationalError, transaction

from .bus import GroupMergeRequested, GroupsCompleted, StepsMergeRequested, TrajectoriesEnded
from .errors import NotFound
from .models import OutboxTask
from .services import counters, merge, outbox, readiness, reward_compute

log = logging.getLogger(__name__)

# Complete groups per message of their follow-up tasks (groups_merge, groups_rewards_compute).
FOLLOW_UP_CHUNK = 16

# The retry settings of every task (here and in curation/tasks.py): transient database
# errors only, backoff doubling up to 5 minutes, five tries.
RETRY: dict[str, Any] = {
    "autoretry_for": (OperationalError, InterfaceError),
    "retry_backoff": True,
    "retry_backoff_max": 300,
    "max_retries": 5,
}


@shared_task(name="pool.group_merge", **RETRY)
def group_merge(group_id: int) -> None:
    """Compute (or refresh) the prefix-tree merge of a complete prompt group. Idempotent: an
    unchanged input is skipped; a vanished group is ignored."""
    _merge_group(group_id)


def _merge_group(group_id: int) -> None:
    if merge.group_merge_compute(group_id=group_id) is None:
        log.info("group_merge: group %s no longer exists", group_id)


@shared_task(name="pool.groups_merge", **RETRY)
def groups_merge(group_ids: list[int]) -> None:
    """``group_merge`` of each of these complete groups, in order: what a write that
    completed them enqueues (one message per ``FOLLOW_UP_CHUNK`` groups). Idempotent."""
    for group_id in group_ids:
        _merge_group(group_id)


@shared_task(name="pool.steps_merge", **RETRY)
def steps_merge(key: str, step_ids: list[int]) -> None:
    """Merge the content of a batch or snapshot on demand, stored under ``key``. Idempotent:
    an unchanged input is skipped; if some of the steps are gone, nothing is stored."""
    try:
        merge.steps_merge_compute(key=key, step_ids=step_ids)
    except NotFound as exc:
        log.warning("steps_merge %s skipped: %s", key, exc.message)


@shared_task(name="pool.trajectory_rewards_compute", **RETRY)
def trajectory_rewards_compute(trajectory_id: int) -> dict[str, int]:
    """Compute the reward of a completed trajectory whose data source names a reward
    function (pool/services/reward_compute.py). Idempotent: a rewarded, running or vanished
    trajectory is skipped; a failing function is recorded as a RewardFailure, not raised."""
    return reward_compute.trajectory_rewards_compute(trajectory_id=trajectory_id)


@shared_task(name="pool.group_rewards_compute", **RETRY)
def group_rewards_compute(group_id: int) -> dict[str, int]:
    """Compute the rewards of a complete group's unrewarded rollouts (a group function such
    as the LLM judge scores them together). Idempotent, like trajectory_rewards_compute.
    Writes enqueue ``groups_rewards_compute``; this one serves messages sent before it."""
    return reward_compute.group_rewards_compute(group_id=group_id)


@shared_task(name="pool.groups_rewards_compute", **RETRY)
def groups_rewards_compute(group_ids: list[int]) -> list[dict[str, int]]:
    """``group_rewards_compute`` of each of these complete groups, in order (one message per
    ``FOLLOW_UP_CHUNK`` groups). Idempotent. Returns each group's counts."""
    return [reward_compute.group_rewards_compute(group_id=group_id) for group_id in group_ids]


@shared_task(name="pool.outbox_relay", **RETRY)
def outbox_relay() -> dict[str, int]:
    """Periodic (celery beat): send the tasks a process could not publish and left behind
    (its broker was down and it stopped before the broker came back)."""
    return outbox.outbox_relay()


@shared_task(name="pool.counters_compact", **RETRY)
def counters_compact() -> dict[str, int]:
    """Periodic (celery beat): fold the pool's counter rows, one per counter and source
    (pool/services/counters.py). Idempotent."""
    return counters.counters_compact()


@shared_task(name="pool.readiness_sweep", **RETRY)
def readiness_sweep() -> dict[str, int]:
    """Periodic (celery beat): abandon idle trajectories, complete groups, repair readiness
    an effect missed. Idempotent and bounded per run (pool/services/readiness.py)."""
    return readiness.readiness_sweep()


def enqueue_on_commit(task: Any, *args: Any) -> None:
    """Enqueue ``task(*args)`` once the caller's transaction commits, through the outbox
    (``enqueue_many_on_commit`` of one task)."""
    enqueue_many_on_commit([(task, list(args))])


def enqueue_many_on_commit(calls: list[tuple[Any, list]]) -> None:
    """Enqueue each ``(task, args)`` once the caller's transaction commits, through the outbox.

    The tasks are stored (``OutboxTask``, one INSERT for all) in the caller's transaction, so
    they are durable exactly when the write is. After the commit they are published in order
    over one broker connection, and the rows of those sent are deleted by one statement (a
    write completing 31 groups used to cost 62 INSERTs, then 62 DELETEs each its own
    transaction: half of bench.curation's readiness time). Follow-up work never fails or
    stalls the write that caused it: the callback is ``robust``, publishing does not retry
    inline and stops at the first refusal, so a broker that is down costs one refused
    connection; the rows stay and this process's background relay sends them when the broker
    is back (pool/services/outbox.py).
    """
    if not calls:
        return
    rows = OutboxTask.objects.bulk_create(
        [OutboxTask(name=task.name, args=list(args)) for task, args in calls]
    )

    def publish() -> None:
        if not outbox.publish_many([(row.name, row.args, row.id) for row in rows]):
            outbox.relay_soon()

    transaction.on_commit(publish, robust=True)


# --- effects: the tasks that follow a write (registered in pool/apps.py) -------------------------
def groups_completed_enqueue(event: GroupsCompleted) -> None:
    """Complete groups' prefix-tree merges and computed rewards: one message of each task per
    ``FOLLOW_UP_CHUNK`` groups (a readiness batch completing 31 groups published 62 messages,
    ~25 ms of its ~220 ms; now 4), small enough that several workers still share a batch."""
    ids = list(event.group_ids)
    chunks = [ids[i : i + FOLLOW_UP_CHUNK] for i in range(0, len(ids), FOLLOW_UP_CHUNK)]
    enqueue_many_on_commit(
        [(task, [chunk]) for chunk in chunks for task in (groups_merge, groups_rewards_compute)]
    )


def trajectories_ended_enqueue(event: TrajectoriesEnded) -> None:
    """The computed reward of an ended trajectory without one (the task decides whether its
    data source names a reward function)."""
    enqueue_many_on_commit(
        [(trajectory_rewards_compute, [t.id]) for t in event.trajectories if t.reward_pending]
    )


def group_merge_enqueue(event: GroupMergeRequested) -> None:
    enqueue_on_commit(group_merge, event.group_id)


def steps_merge_enqueue(event: StepsMergeRequested) -> None:
    enqueue_on_commit(steps_merge, event.key, list(event.step_ids))
