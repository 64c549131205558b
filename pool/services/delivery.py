"""Delivery stamps: a trajectory whose steps were handed out (leased, or frozen into a
snapshot) has its rewards frozen from then on (pool.models.Trajectory.delivered_at;
pool.errors.RewardDelivered, raised by the reward writers in rewards.py and trajectories.py).

Race: a reward writer locks the trajectory row (select_for_update) before it checks the stamp
and writes; ``trajectories_delivered_mark`` locks the same rows, in primary-key order (the
order every trajectory writer locks in), before it stamps them. Callers stamp BEFORE they read
what they deliver, in the same transaction: a reward that committed first is in the delivery,
one that comes after sees the stamp and is refused. Nothing is delivered with a reward that
is then silently replaced.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.utils import timezone

from ..models import Step, Trajectory

# Step ids per statement: SQLite's variable limit, and bounded statements on PostgreSQL.
CHUNK = 5000


def trajectories_delivered_mark(*, step_ids: Iterable[int]) -> int:
    """Stamp the trajectories of ``step_ids`` as delivered (those not stamped yet); returns
    how many were stamped now. Idempotent: the first delivery's time is kept. Runs in the
    caller's transaction (one is opened when there is none). Three statements per CHUNK ids."""
    ids = sorted(set(step_ids))
    now = timezone.now()
    stamped = 0
    with transaction.atomic(savepoint=False):  # inside the caller's: no savepoint round trips
        for i in range(0, len(ids), CHUNK):
            # The steps' trajectories first, then those by primary key (as one statement,
            # PostgreSQL may hash every trajectory to join them).
            of_steps = sorted(
                set(Step.objects.filter(id__any=ids[i : i + CHUNK]).values_list("trajectory_id", flat=True))
            )
            todo = list(
                Trajectory.objects.select_for_update()
                .filter(id__any=of_steps, delivered_at__isnull=True)
                .order_by("id")
                .values_list("id", flat=True)
            )
            if todo:
                stamped += Trajectory.objects.filter(id__any=todo).update(delivered_at=now)
    return stamped
