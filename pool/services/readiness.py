"""Readiness: which steps (and prompt groups) are fit to train on, kept up to date.

A step's ``readiness`` bits (pool/flags.py) come from four facts:

* TOKENS_EXACT: set when the row is built (plan.step_row), with REWARD_FINAL where the
  write knows the branch's outcome;
* REWARD_FINAL once its branch's outcome is known and its own reward, if any, is final
  (pool/services/effective_reward.py, refreshed first), TRAJECTORY_COMPLETE and
  GROUP_COMPLETE: decided by its trajectory and group, written here by
  ``trajectories_refresh``.

Every change of those facts calls in here, inside the writer's transaction: the write
pipeline's effects (a trajectory ended: ``steps_written_settle``), rewards_apply,
trajectory_complete and the completion of groups (``groups_completed_settle``, an effect of
``GroupsCompleted``; both registered in pool/apps.py). ``readiness_sweep`` (a periodic task) abandons idle trajectories and
repairs anything a crash between commit and effect could have missed. Every function
recomputes from the source columns, so each is idempotent and safe to repeat.

A prompt group is ready (``ready_at``) when it is complete and every step of its completed
rollouts has a final reward; its group quality flags (duplicate responses, zero reward
variance) are computed at that moment, by ``groups_settle``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from .. import compiled, sql
from ..bus import GroupsCompleted, GroupsReady, StepsWritten, emit
from ..flags import Readiness
from ..lookups import Many
from ..models import PromptGroup, Step, Trajectory
from . import effective_reward
from .groups import groups_check_complete

# Ids per statement: bounded statements on every database (SQLite caps the number of
# parameters at 32,766); a chunk of trajectories is one SELECT and one UPDATE.
CHUNK = 1000
# Trajectories the sweep repairs per round; the sweep stops after MAX_SWEEP_ROUNDS rounds and
# the next run goes on, so one run stays short however far behind it is.
SWEEP_CHUNK = 2000
MAX_SWEEP_ROUNDS = 50


def steps_written_settle(written: StepsWritten) -> None:
    """The effect of stored steps on readiness: settle the trajectories the write ends, or
    that had ended (``StepsWritten.settled``). No query for a write into running
    trajectories."""
    ended = written.settled()
    if ended:
        trajectories_settle(trajectory_ids=ended)


def groups_completed_settle(event: GroupsCompleted) -> None:
    """The effect of completed groups on readiness: every rollout's steps now have their
    group (and those ending now their is_last step: ``GroupsCompleted.mark_last``); then the
    groups' own readiness."""
    trajectories_settle(
        trajectory_ids=Trajectory.objects.filter(group_id__any=Many(event.group_ids)).values_list(
            "id", flat=True
        ),
        mark_last=event.mark_last,
    )


def trajectories_settle(*, trajectory_ids: Iterable[int], mark_last: Collection[int] = ()) -> None:
    """Refresh the steps of these trajectories, then settle their complete groups.
    ``mark_last``: trajectories_refresh's. Idempotent; call inside the writer's transaction."""
    ids = set(trajectory_ids)
    if not ids:
        return
    groups = trajectories_refresh(trajectory_ids=ids, mark_last=mark_last)
    groups_settle(group_ids=groups)


def trajectories_refresh(
    *,
    trajectory_ids: Iterable[int],
    own: effective_reward.Own | None = None,
    mark_last: Collection[int] = (),
) -> set[int]:
    """Rewrite the trajectory-decided readiness bits and the reward columns of every step
    of these trajectories from their current state: one UPDATE per chunk
    (effective_reward.steps_refresh with ``bits``: sql.steps_settle; steps whose values do
    not change are not written). ``own``: new own rewards of their steps, written by the
    same statement; ``mark_last``: those of them ending now (trajectories_complete), whose
    highest step becomes their is_last step by the same statement. Returns the ids of their
    complete groups (to settle). Idempotent."""
    ids = sorted(set(trajectory_ids))
    complete_groups: set[int] = set()
    for chunk in _chunks(ids):
        # The trajectory rows are locked (in primary-key order) before any of their steps is
        # written: every writer of a trajectory's steps' rewards or readiness (rewards_apply,
        # trajectories_complete, this refresh for a group's other rollouts) locks its
        # trajectories first, so two of them never hold each other's steps (a reward task
        # and the completion that fills the group used to deadlock on PostgreSQL).
        locked = compiled.read(_locked_with_group, ids=Many(chunk))
        complete_groups.update(g for g, status in locked if status == PromptGroup.Status.COMPLETE)
        effective_reward.steps_refresh(trajectory_ids=chunk, own=own, bits=True, mark_last=mark_last)
    return complete_groups


def _locked_with_group(*, ids: Many):
    """The build of the refresh's lock of its trajectories, with their groups' status
    (pool/compiled.py)."""
    return (
        Trajectory.objects.select_for_update(of=("self",))
        .filter(id__any=ids)
        .order_by("id")
        .values_list("group_id", "group__status")
    )


def rewards_settle(
    *, rewarded: Iterable[int], refresh: Iterable[int], own: effective_reward.Own | None = None
) -> None:
    """Readiness after rewards (rewards_apply). ``refresh``: trajectories whose reward
    changed, or with a step whose reward went back to pending, are recomputed whole.
    ``rewarded``: in the others only the reward columns of their steps can change (an
    outcome or a process reward, the branch's other steps, the REWARD_FINAL bits:
    effective_reward.steps_refresh). ``own``: the steps' new own rewards, written with
    them (every one of their trajectories is in ``rewarded`` or ``refresh``). The complete
    groups of all of them are settled."""
    refresh = set(refresh)
    groups = trajectories_refresh(trajectory_ids=refresh, own=own)
    rest = sorted(set(rewarded) - refresh)
    effective_reward.steps_refresh(trajectory_ids=rest, own=own)
    for chunk in _chunks(rest):
        groups.update(
            Trajectory.objects.filter(
                id__any=Many(chunk), group__status=PromptGroup.Status.COMPLETE
            ).values_list("group_id", flat=True)
        )
    groups_settle(group_ids=groups)


def groups_settle(*, group_ids: Iterable[int]) -> None:
    """Set or clear ``ready_at`` of these groups, and their group quality flags, from their
    current state. Idempotent."""
    ids = list(set(group_ids))
    now = timezone.now()
    for chunk in _chunks(ids):
        rows = PromptGroup.objects.filter(
            id__any=Many(chunk), status=PromptGroup.Status.COMPLETE
        ).values_list("id", "task_id", "task_counted_at")
        complete, uncounted = set(), set()
        for gid, task_id, counted_at in rows:
            complete.add(gid)
            if task_id is not None and counted_at is None:
                uncounted.add(gid)
        waiting = set(
            Step.objects.filter(
                trajectory__group_id__any=Many(complete), trajectory__status=Trajectory.Status.COMPLETED
            )
            .annotate(bit=F("readiness").bitand(int(Readiness.REWARD_FINAL)))
            .filter(bit=0)
            .values_list("trajectory__group_id", flat=True)
            .distinct()
        )
        ready = complete - waiting
        if ready:
            # before ready_at: who is new is told by it
            emit(GroupsReady(group_ids=frozenset(ready), uncounted=frozenset(uncounted & ready)))
        PromptGroup.objects.filter(id__any=Many(ready), ready_at__isnull=True).update(ready_at=now)
        PromptGroup.objects.filter(id__any=Many(set(chunk) - ready), ready_at__isnull=False).update(
            ready_at=None
        )
        _group_quality(ready)


def _group_quality(group_ids: set[int]) -> None:
    """Duplicate responses across a group's completed rollouts, and zero reward variance
    (every rollout rewarded the same: no GRPO advantage): one statement per chunk
    (sql.groups_quality), only steps whose flags change written."""
    for chunk in _chunks(sorted(group_ids)):
        sql.groups_quality(chunk)


def readiness_sweep(*, now=None) -> dict[str, int]:
    """The periodic repair (task pool.readiness_sweep). Idempotent, bounded per run:

    1. abandon running trajectories idle longer than CLAW_TRAJECTORY_IDLE_TIMEOUT_SECONDS,
       so no group waits forever for them;
    2. complete open groups whose rollouts have all ended;
    3. refresh trajectories whose steps' bits disagree with their state;
    4. settle complete groups that are not ready yet.

    Returns counts of what it changed."""
    now = now or timezone.now()
    out = {"abandoned": 0, "groups_completed": 0, "trajectories_refreshed": 0, "groups_settled": 0}
    cutoff = now - timedelta(seconds=settings.CLAW_TRAJECTORY_IDLE_TIMEOUT_SECONDS)
    idle = list(
        Trajectory.objects.filter(status=Trajectory.Status.RUNNING, updated_at__lt=cutoff)
        .order_by("id")
        .values_list("id", flat=True)[:SWEEP_CHUNK]
    )
    if idle:
        with transaction.atomic():
            # Re-checked under the UPDATE: a step appended since the read keeps it running.
            n = Trajectory.objects.filter(
                id__in=idle, status=Trajectory.Status.RUNNING, updated_at__lt=cutoff
            ).update(status=Trajectory.Status.ABANDONED, completed_at=now, updated_at=now)
            out["abandoned"] = n
            groups = set(
                Trajectory.objects.filter(id__in=idle, group__isnull=False).values_list("group_id", flat=True)
            )
            trajectories_settle(trajectory_ids=idle)
            out["groups_completed"] += len(groups_check_complete(group_ids=groups))
    with transaction.atomic():
        open_groups = (
            PromptGroup.objects.filter(status=PromptGroup.Status.OPEN, expected_rollouts__isnull=False)
            .order_by("id")
            .values_list("id", flat=True)[:SWEEP_CHUNK]
        )
        out["groups_completed"] += len(groups_check_complete(group_ids=list(open_groups)))
    for _ in range(MAX_SWEEP_ROUNDS):
        stale = _stale_trajectories()
        if not stale:
            break
        with transaction.atomic():
            trajectories_settle(trajectory_ids=stale)
        out["trajectories_refreshed"] += len(stale)
    unsettled = list(
        PromptGroup.objects.filter(status=PromptGroup.Status.COMPLETE, ready_at__isnull=True)
        .order_by("id")
        .values_list("id", flat=True)[:SWEEP_CHUNK]
    )
    if unsettled:
        with transaction.atomic():
            groups_settle(group_ids=unsettled)
        out["groups_settled"] = PromptGroup.objects.filter(id__in=unsettled, ready_at__isnull=False).count()
    return out


def _stale_trajectories() -> list[int]:
    """Trajectories with a step whose trajectory-decided bits are wrong. Only completed
    trajectories' bits matter (no step of another is ready, whatever its bits say), so only
    they are checked, plus a completion bit on a trajectory that is not completed."""
    completed = Q(trajectory__status=Trajectory.Status.COMPLETED)
    # The bit follows the branch's outcome (effective_reward.py) and the own reward's status;
    # a trajectory reward always supplies an outcome.
    final = Q(outcome_reward__isnull=False) & (
        Q(reward__isnull=True) | Q(reward_status=Step.RewardStatus.FINAL)
    )
    wrong = (
        Q(complete_bit=0)
        | (final & Q(reward_bit=0))
        | (~final & ~Q(reward_bit=0))
        | (Q(outcome_reward__isnull=True) & Q(trajectory__reward__isnull=False))
        | (
            (Q(trajectory__group__isnull=True) | Q(trajectory__group__status=PromptGroup.Status.COMPLETE))
            & Q(group_bit=0)
        )
    )
    return list(
        Step.objects.annotate(
            complete_bit=F("readiness").bitand(int(Readiness.TRAJECTORY_COMPLETE)),
            reward_bit=F("readiness").bitand(int(Readiness.REWARD_FINAL)),
            group_bit=F("readiness").bitand(int(Readiness.GROUP_COMPLETE)),
        )
        .filter((completed & wrong) | (~completed & ~Q(complete_bit=0)))
        .values_list("trajectory_id", flat=True)
        .distinct()[:SWEEP_CHUNK]
    )


def _chunks(ids: list[int]) -> Iterator[list[int]]:
    for i in range(0, len(ids), CHUNK):
        yield ids[i : i + CHUNK]
