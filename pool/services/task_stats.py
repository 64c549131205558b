"""Task statistics: the one effect of the write pipeline that keeps them (pool/apps.py).

When is a rollout counted? When its group becomes *ready* (``GroupsReady``: complete, and
every step of its completed rollouts has a final reward). Every reward path ends there: a
reward on the steps at submission, a trajectory reward through ``/rewards``, the outcome
reward of a last step (pool/services/rewards.py) and computed rewards (the reward task) all
go through ``rewards_apply`` or the readiness settle, which emit ``GroupsReady`` for the
groups they make ready, and which of them name a task not counted yet (``uncounted``, read
with the groups): without one the effect runs no statement. ``GroupsReady`` can repeat for
a group (each settle of a ready group), so the effect first *claims* its groups with one
conditional UPDATE ... RETURNING (``task_counted_at`` from NULL): a group is counted exactly
once, by whichever transaction claims it (a concurrent claim waits on the row and then finds
it counted), and the claim commits or rolls back with the counts. A reward changed after the
group was counted does not recount it.

A rollout's reward is its trajectory's reward, else its last step's (as the group quality
flags read it: pool/services/readiness.py). Per task, one UPDATE with F() expressions adds
the group's counts (no read-modify-write: concurrent groups of one task serialise on the
row lock and both sums land):

* all time: rollouts attempted, completed, failed (failed or abandoned), rewarded, reward
  sum and sum of squares (mean and variance exact and incremental), passes (reward >= the
  set's ``pass_threshold``), groups (``seen``), informative groups (rewards not all equal),
  the last policy version seen;
* the recent window: ``recent_rewarded`` and ``recent_passes`` decay by
  0.5 ** ((v - last_policy_version) / window) before a group of policy version v adds to
  them (``TaskSet.window``: the half-life in policy versions); a group older than the last
  version seen adds without decay. The recent pass rate is smoothed by a Beta(1, 1) prior,
  (recent_passes + 1) / (recent_rewarded + 2), and the sampler's informative score is
  p(1 - p), both stored in the same UPDATE so the sampler reads them from an index.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from django.db.models import F, FloatField, Value
from django.db.models.functions import Coalesce, Greatest, NullIf, Power
from django.utils import timezone

from ..bus import GroupsReady
from ..models import Step, Task, TaskSet, Trajectory
from ..sql import groups_task_claim

FAILED = (Trajectory.Status.FAILED, Trajectory.Status.ABANDONED)
FLAT = 1e-12  # rewards within this of each other are "all equal" (as ZERO_VARIANCE reads them)


@dataclass(slots=True)
class TaskDelta:
    attempted: int = 0
    completed: int = 0
    failed: int = 0
    rewarded: int = 0
    reward_sum: float = 0.0
    reward_sumsq: float = 0.0
    passes: int = 0
    seen: int = 0
    informative: int = 0
    version: int | None = None


def groups_ready_task_stats(event: GroupsReady) -> None:
    """The effect of ready groups on their tasks' statistics (module docstring). Idempotent:
    a group already counted is skipped. No statement when none of them is uncounted."""
    if not event.uncounted:
        return
    now = timezone.now()
    claimed = groups_task_claim(sorted(event.uncounted), now)
    if not claimed:
        return
    deltas = _deltas(claimed)
    _apply(deltas, now)


def group_rewards(group_ids) -> dict[int, list[tuple[str, float | None, int | None]]]:
    """Per group, its rollouts as (status, reward, policy version): the trajectory's reward,
    else its last step's."""
    rollouts = list(
        Trajectory.objects.filter(group_id__in=group_ids).values_list(
            "id", "group_id", "status", "reward", "policy_version_id"
        )
    )
    need = [tid for tid, _g, status, reward, _v in rollouts if reward is None]
    last: dict[int, tuple[int, float | None]] = {}
    if need:
        for tid, idx, reward in Step.objects.filter(trajectory_id__in=need).values_list(
            "trajectory_id", "step_index", "reward"
        ):
            if tid not in last or idx > last[tid][0]:
                last[tid] = (idx, reward)
    out: dict[int, list] = defaultdict(list)
    for tid, gid, status, reward, version in rollouts:
        if reward is None and tid in last:
            reward = last[tid][1]
        out[gid].append((status, reward, version))
    return out


def _deltas(claimed: dict[int, int]) -> dict[int, TaskDelta]:
    sets = dict(Task.objects.filter(id__in=set(claimed.values())).values_list("id", "set_name"))
    thresholds = dict(
        TaskSet.objects.filter(name__in=set(sets.values())).values_list("name", "pass_threshold")
    )
    deltas: dict[int, TaskDelta] = defaultdict(TaskDelta)
    for gid, rollouts in group_rewards(list(claimed)).items():
        tid = claimed[gid]
        threshold = thresholds.get(sets.get(tid, ""), TaskSet.DEFAULT_PASS_THRESHOLD)
        d = deltas[tid]
        d.seen += 1
        rewards = []
        for status, reward, version in rollouts:
            d.attempted += 1
            if status == Trajectory.Status.COMPLETED:
                d.completed += 1
                if reward is not None:
                    rewards.append(reward)
            elif status in FAILED:
                d.failed += 1
            if version is not None and (d.version is None or version > d.version):
                d.version = version
        d.rewarded += len(rewards)
        d.reward_sum += sum(rewards)
        d.reward_sumsq += sum(r * r for r in rewards)
        d.passes += sum(1 for r in rewards if r >= threshold)
        if len(rewards) > 1 and max(rewards) - min(rewards) > FLAT:
            d.informative += 1
    for tid in claimed.values():  # a group whose rollouts are all gone still counts as seen
        deltas[tid]
    return deltas


def _apply(deltas: dict[int, TaskDelta], now) -> None:
    """One UPDATE per task, in primary-key order (concurrent writers lock tasks in one order)."""
    windows = dict(
        TaskSet.objects.filter(
            name__in=set(Task.objects.filter(id__in=list(deltas)).values_list("set_name", flat=True))
        ).values_list("name", "window")
    )
    set_of = dict(Task.objects.filter(id__in=list(deltas)).values_list("id", "set_name"))
    for tid in sorted(deltas):
        d = deltas[tid]
        window = max(1, windows.get(set_of.get(tid, ""), TaskSet.DEFAULT_WINDOW))
        if d.version is None:
            decay = Value(1.0)
        else:
            v = Value(d.version)
            gap = Greatest(v - Coalesce(F("last_policy_version"), v), Value(0))
            decay = Power(Value(0.5), gap * Value(1.0 / window), output_field=FloatField())
        new_rewarded = F("recent_rewarded") * decay + Value(float(d.rewarded))
        new_passes = F("recent_passes") * decay + Value(float(d.passes))
        p = (new_passes + Value(1.0)) / (new_rewarded + Value(2.0))
        changes = dict(
            attempted=F("attempted") + d.attempted,
            completed=F("completed") + d.completed,
            failed=F("failed") + d.failed,
            rewarded=F("rewarded") + d.rewarded,
            reward_sum=F("reward_sum") + Value(d.reward_sum),
            reward_sumsq=F("reward_sumsq") + Value(d.reward_sumsq),
            passes=F("passes") + d.passes,
            pass_rate=(F("passes") + Value(float(d.passes)))
            / NullIf(F("rewarded") + Value(float(d.rewarded)), Value(0.0), output_field=FloatField()),
            seen=F("seen") + d.seen,
            informative_groups=F("informative_groups") + d.informative,
            recent_rewarded=new_rewarded,
            recent_passes=new_passes,
            recent_pass_rate=p,
            score=p * (Value(1.0) - p),
            last_seen_at=Value(now),
        )
        if d.version is not None:
            changes["last_policy_version"] = Greatest(
                Coalesce(F("last_policy_version"), Value(d.version)), Value(d.version)
            )
        Task.objects.filter(id=tid).update(**changes)
