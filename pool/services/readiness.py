"""Readiness: which steps (and prompt groups) are fit to train on, kept up to date.

A step's ``readiness`` bits (pool/flags.py) come from four facts:

* TOKENS_EXACT and the step's own final reward: set when the row is built (plan.step_row);
* REWARD_FINAL by a trajectory reward, TRAJECTORY_COMPLETE and GROUP_COMPLETE: decided by
  its trajectory and group, written here by ``trajectories_refresh``.

Every change of those facts calls in here, inside the writer's transaction: the write
pipeline's effects (a trajectory ended), rewards_apply, trajectory_complete and
groups_check_complete. ``readiness_sweep`` (a periodic task) abandons idle trajectories and
repairs anything a crash between commit and effect could have missed. Every function
recomputes from the source columns, so each is idempotent and safe to repeat.

A prompt group is ready (``ready_at``) when it is complete and every step of its completed
rollouts has a final reward; its group quality flags (duplicate responses, zero reward
variance) are computed at that moment, by ``groups_settle``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from ..flags import GROUP_QUALITY, Quality, Readiness
from ..models import PromptGroup, Step, Trajectory

# Ids per UPDATE ... WHERE id IN (...): bounded statements on every database (SQLite caps
# the number of parameters), about 10 ms per chunk on PostgreSQL.
CHUNK = 500
# Trajectories the sweep repairs per round; the sweep stops after MAX_SWEEP_ROUNDS rounds and
# the next run goes on, so one run stays short however far behind it is.
SWEEP_CHUNK = 2000
MAX_SWEEP_ROUNDS = 50
_ALL_QUALITY = sum(int(q) for q in Quality)


def trajectories_settle(*, trajectory_ids: Iterable[int]) -> None:
    """Refresh the steps of these trajectories, then settle their complete groups.
    Idempotent; call inside the writer's transaction."""
    ids = set(trajectory_ids)
    if not ids:
        return
    groups = trajectories_refresh(trajectory_ids=ids)
    groups_settle(group_ids=groups)


def trajectories_refresh(*, trajectory_ids: Iterable[int]) -> set[int]:
    """Rewrite the trajectory-decided readiness bits of every step of these trajectories
    from their current state (one UPDATE per distinct state, not per row). Returns the ids
    of their complete groups (to settle). Idempotent."""
    ids = list(set(trajectory_ids))
    by_bits: dict[int, list[int]] = defaultdict(list)
    complete_groups: set[int] = set()
    for chunk in _chunks(ids):
        rows = Trajectory.objects.filter(id__in=chunk).values_list(
            "id", "status", "reward", "group_id", "group__status"
        )
        for tid, status, reward, group_id, group_status in rows:
            bits = 0
            if reward is not None:
                bits |= Readiness.REWARD_FINAL
            if status == Trajectory.Status.COMPLETED:
                bits |= Readiness.TRAJECTORY_COMPLETE
            if group_id is None or group_status == PromptGroup.Status.COMPLETE:
                bits |= Readiness.GROUP_COMPLETE
            if group_id is not None and group_status == PromptGroup.Status.COMPLETE:
                complete_groups.add(group_id)
            by_bits[int(bits)].append(tid)
    own_reward = Case(
        When(reward_status=Step.RewardStatus.FINAL, then=Value(int(Readiness.REWARD_FINAL))), default=Value(0)
    )
    for bits, tids in by_bits.items():
        for chunk in _chunks(tids):
            Step.objects.filter(trajectory_id__in=chunk).update(
                readiness=F("readiness")
                .bitand(int(Readiness.TOKENS_EXACT))
                .bitor(Value(bits))
                .bitor(own_reward)
            )
    return complete_groups


def groups_settle(*, group_ids: Iterable[int]) -> None:
    """Set or clear ``ready_at`` of these groups, and their group quality flags, from their
    current state. Idempotent."""
    ids = list(set(group_ids))
    now = timezone.now()
    for chunk in _chunks(ids):
        complete = set(
            PromptGroup.objects.filter(id__in=chunk, status=PromptGroup.Status.COMPLETE).values_list(
                "id", flat=True
            )
        )
        waiting = set(
            Step.objects.filter(
                trajectory__group_id__in=complete, trajectory__status=Trajectory.Status.COMPLETED
            )
            .annotate(bit=F("readiness").bitand(int(Readiness.REWARD_FINAL)))
            .filter(bit=0)
            .values_list("trajectory__group_id", flat=True)
            .distinct()
        )
        ready = complete - waiting
        PromptGroup.objects.filter(id__in=ready, ready_at__isnull=True).update(ready_at=now)
        PromptGroup.objects.filter(id__in=set(chunk) - ready, ready_at__isnull=False).update(ready_at=None)
        _group_quality(ready)


def _group_quality(group_ids: set[int]) -> None:
    """Duplicate responses across a group's completed rollouts, and zero reward variance
    (every rollout rewarded the same: no GRPO advantage)."""
    if not group_ids:
        return
    members: dict[int, dict[int, float | None]] = defaultdict(dict)  # group -> trajectory -> reward
    for tid, gid, reward in Trajectory.objects.filter(
        group_id__in=group_ids, status=Trajectory.Status.COMPLETED
    ).values_list("id", "group_id", "reward"):
        members[gid][tid] = reward
    by_response: dict[tuple[int, bytes], set[int]] = defaultdict(set)  # (group, hash) -> trajectories
    steps_of: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    last_reward: dict[int, float | None] = {}
    for sid, tid, gid, rhash, is_last, reward in Step.objects.filter(
        trajectory__group_id__in=group_ids, trajectory__status=Trajectory.Status.COMPLETED
    ).values_list("id", "trajectory_id", "trajectory__group_id", "response_hash", "is_last", "reward"):
        if rhash is not None:
            key = (gid, bytes(rhash))
            by_response[key].add(tid)
            steps_of[key].append(sid)
        if is_last:
            last_reward[tid] = reward
    duplicate = [sid for key, tids in by_response.items() if len(tids) > 1 for sid in steps_of[key]]
    flat = []
    for gid, rewards in members.items():
        values = [r if r is not None else last_reward.get(tid) for tid, r in rewards.items()]
        if len(values) > 1 and None not in values and max(values) - min(values) <= 1e-12:  # type: ignore[type-var,operator]
            flat.append(gid)
    in_groups = Step.objects.filter(trajectory__group_id__in=group_ids)
    in_groups.update(quality_flags=F("quality_flags").bitand(_ALL_QUALITY & ~GROUP_QUALITY))
    for chunk in _chunks(duplicate):
        Step.objects.filter(id__in=chunk).update(
            quality_flags=F("quality_flags").bitor(int(Quality.DUPLICATE))
        )
    if flat:
        Step.objects.filter(trajectory__group_id__in=flat).update(
            quality_flags=F("quality_flags").bitor(int(Quality.ZERO_VARIANCE))
        )


def readiness_sweep(*, now=None) -> dict[str, int]:
    """The periodic repair (task pool.readiness_sweep). Idempotent, bounded per run:

    1. abandon running trajectories idle longer than CLAW_TRAJECTORY_IDLE_TIMEOUT_SECONDS,
       so no group waits forever for them;
    2. complete open groups whose rollouts have all ended;
    3. refresh trajectories whose steps' bits disagree with their state;
    4. settle complete groups that are not ready yet.

    Returns counts of what it changed."""
    from .groups import groups_check_complete

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
    wrong = (
        Q(complete_bit=0)
        | (Q(trajectory__reward__isnull=False) & Q(reward_bit=0))
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
