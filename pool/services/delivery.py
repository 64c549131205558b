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

from .. import compiled
from ..lookups import Many
from ..models import Step, Trajectory

# Step ids per statement: SQLite's variable limit, and bounded statements on PostgreSQL.
CHUNK = 5000


def trajectories_delivered_mark(*, step_ids: Iterable[int]) -> set[int]:
    """Stamp the trajectories of ``step_ids`` as delivered (those not stamped yet; the first
    delivery's time is kept), holding every one of them locked to the end of the caller's
    transaction (one is opened when there is none). Returns the ids of those steps still in
    the pool once their trajectories are locked: the caller delivers those alone.

    Race with retention (curation/services/retention.py): a pass locks a unit's trajectories
    before it reads what pins the unit (the leases' deliveries, the snapshots' step ids) and
    removes it. A delivery that locked them first has committed its pin by the time the pass
    reads; one that waits on the pass finds the rows gone, and its steps are not returned.
    Idempotent. A read per CHUNK steps, a lock and a stamp per CHUNK trajectories."""
    ids = sorted(set(step_ids))
    now = timezone.now()
    of_step: dict[int, int] = {}
    with transaction.atomic(savepoint=False):  # inside the caller's: no savepoint round trips
        # The steps' trajectories first, then those by primary key (as one statement,
        # PostgreSQL may hash every trajectory to join them), locked in one primary-key order
        # across chunks (the order every trajectory writer locks in).
        for i in range(0, len(ids), CHUNK):
            of_step.update(compiled.read(_trajectories_of, ids=Many(ids[i : i + CHUNK])))
        trajectories = sorted(set(of_step.values()))
        alive: set[int] = set()
        for i in range(0, len(trajectories), CHUNK):
            locked = compiled.read(_locked, ids=Many(trajectories[i : i + CHUNK]))
            alive.update(t for t, _at in locked)
            todo = [t for t, at in locked if at is None]
            if todo:
                Trajectory.objects.filter(id__any=Many(todo)).update(delivered_at=now)
    return {s for s, t in of_step.items() if t in alive}


# The builds of the two reads above (pool/compiled.py: compiled once, a pull makes both).
def _trajectories_of(*, ids: Many):
    return Step.objects.filter(id__any=ids).values_list("id", "trajectory_id")


def _locked(*, ids: Many):
    return (
        Trajectory.objects.select_for_update()
        .filter(id__any=ids)
        .order_by("id")
        .values_list("id", "delivered_at")
    )
