"""Late rewards, for a step or a trajectory, audited as RewardEvents."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from .. import live
from ..deadlocks import retry_on_deadlock
from ..errors import InvalidInput, NotFound
from ..ingest import backends, rules
from ..models import RewardEvent, Step, Trajectory
from .readiness import rewards_settle


@dataclass(slots=True)
class RewardIn:
    reward: float
    step_uid: str | None = None
    trajectory_uid: str | None = None
    source: str = Step.RewardSource.ENV
    final: bool = True
    metadata: dict = field(default_factory=dict)
    field_prefix: str = ""


@retry_on_deadlock
@transaction.atomic
def rewards_apply(*, rewards: list[RewardIn], source_id: int | None = None) -> list[RewardEvent]:
    """Apply rewards atomically (all or none). Each change is recorded as a RewardEvent.
    Re-applying the same reward with the same status writes nothing (idempotent)."""
    for r in rewards:
        p = r.field_prefix
        rules.check_reward(r.reward, f"{p}reward")
        if (r.step_uid is None) == (r.trajectory_uid is None):
            raise InvalidInput("give exactly one of step_uid or trajectory_uid", field=f"{p}step_uid")
        if r.source not in Step.RewardSource.values:
            raise InvalidInput(f"source must be one of {Step.RewardSource.values}", field=f"{p}source")
    step_uids = [r.step_uid for r in rewards if r.step_uid]
    traj_uids = [r.trajectory_uid for r in rewards if r.trajectory_uid]
    # Lock the trajectories (those named and those of the steps named) in primary-key
    # order, then the steps: every writer of a trajectory's steps locks its trajectory
    # first (pool/services/readiness.py), so concurrent reward writers, completions and
    # readiness refreshes cannot deadlock. Read only the reward columns of the steps, as
    # tuples (model instances cost ~70 us each here).
    trajs = {
        t.uid: t
        for t in Trajectory.objects.select_for_update()
        .filter(
            Q(uid__in=traj_uids) | Q(id__in=Step.objects.filter(uid__in=step_uids).values("trajectory_id"))
        )
        .only("id", "uid", "reward", "reward_source")
        .order_by("id")
    }
    steps = {
        row[1]: _StepReward(*row)
        for row in Step.objects.select_for_update()
        .filter(uid__in=step_uids)
        .order_by("id")
        .values_list("id", "uid", "trajectory_id", "reward", "reward_status", "reward_source")
    }
    events: list[RewardEvent] = []
    changed_steps: dict[int, _StepReward] = {}
    changed_trajs: dict[int, Trajectory] = {}
    for r in rewards:
        p = r.field_prefix
        status = Step.RewardStatus.FINAL if r.final else Step.RewardStatus.PENDING
        if r.step_uid:
            step = steps.get(r.step_uid)
            if step is None:
                raise NotFound(f"step {r.step_uid!r} does not exist", field=f"{p}step_uid")
            if step.reward == r.reward and step.reward_status == status and step.reward_source == r.source:
                continue
            events.append(RewardEvent(step_id=step.id, old_reward=step.reward, **_audit(r, source_id)))
            step.reward, step.reward_status, step.reward_source = r.reward, status, r.source
            changed_steps[step.id] = step
        else:
            traj = trajs.get(r.trajectory_uid or "")
            if traj is None:
                raise NotFound(f"trajectory {r.trajectory_uid!r} does not exist", field=f"{p}trajectory_uid")
            if traj.reward == r.reward:
                continue
            events.append(RewardEvent(trajectory_id=traj.id, old_reward=traj.reward, **_audit(r, source_id)))
            traj.reward, traj.reward_source = r.reward, r.source
            changed_trajs[traj.id] = traj
    # One statement per table (not per row), then the audit rows.
    now = timezone.now()
    rows = [(st.id, st.reward, st.reward_status, st.reward_source) for st in changed_steps.values()]
    for start in range(0, len(rows), 1000):  # 4 parameters a row on SQLite: within its limit
        backends.steps_reward_set(rows[start : start + 1000])
    for traj in changed_trajs.values():
        traj.updated_at = now
    Trajectory.objects.bulk_update(
        changed_trajs.values(), ["reward", "reward_source", "updated_at"], batch_size=500
    )
    backends.rows_insert(events)
    # Effective rewards and readiness follow (pool/services/effective_reward.py): a step
    # reward reaches its branch's unrewarded steps, a trajectory reward every step without one.
    rewards_settle(
        rewarded={st.trajectory_id for st in changed_steps.values()},
        refresh=set(changed_trajs)
        | {st.trajectory_id for st in changed_steps.values() if st.reward_status != Step.RewardStatus.FINAL},
    )
    if events:
        live.publish("rewards", {"count": len(events)})
    return events


@dataclass(slots=True)
class _StepReward:
    """The reward columns of a locked step row."""

    id: int
    uid: str
    trajectory_id: int
    reward: float | None
    reward_status: str
    reward_source: str | None


def _audit(r: RewardIn, source_id: int | None) -> dict:
    """The RewardEvent fields of ``r`` that a step's and a trajectory's audit row share."""
    return {
        "new_reward": r.reward,
        "reward_source": r.source,
        "final": r.final,
        "source_id": source_id,
        "metadata": r.metadata,
    }
