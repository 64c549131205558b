"""Late rewards, for a step or a trajectory, audited as RewardEvents."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

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
    # Lock in primary-key order so concurrent reward writers cannot deadlock; load only the
    # reward columns (not the token blobs).
    steps = {
        s.uid: s
        for s in Step.objects.select_for_update()
        .filter(uid__in=step_uids)
        .only("id", "uid", "trajectory_id", "reward", "reward_status", "reward_source")
        .order_by("id")
    }
    trajs = {
        t.uid: t
        for t in Trajectory.objects.select_for_update()
        .filter(uid__in=traj_uids)
        .only("id", "uid", "reward")
        .order_by("id")
    }
    events: list[RewardEvent] = []
    changed_steps: dict[int, Step] = {}
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
            events.append(RewardEvent(step=step, old_reward=step.reward, **_audit(r, source_id)))
            step.reward, step.reward_status, step.reward_source = r.reward, status, r.source
            changed_steps[step.id] = step
        else:
            traj = trajs.get(r.trajectory_uid or "")
            if traj is None:
                raise NotFound(f"trajectory {r.trajectory_uid!r} does not exist", field=f"{p}trajectory_uid")
            if traj.reward == r.reward:
                continue
            events.append(RewardEvent(trajectory=traj, old_reward=traj.reward, **_audit(r, source_id)))
            traj.reward = r.reward
            changed_trajs[traj.id] = traj
    # One statement per table (not per row), then the audit rows.
    now = timezone.now()
    for chunk in _chunks(list(changed_steps.values())):
        backends.steps_reward_set([(st.id, st.reward, st.reward_status, st.reward_source) for st in chunk])
    for traj in changed_trajs.values():
        traj.updated_at = now
    Trajectory.objects.bulk_update(changed_trajs.values(), ["reward", "updated_at"], batch_size=500)
    RewardEvent.objects.bulk_create(events, batch_size=1000)
    # Readiness follows: a final step reward set its own bit in the statement above; a
    # trajectory reward, or a reward back to pending, needs its trajectory recomputed.
    rewards_settle(
        rewarded={st.trajectory_id for st in changed_steps.values()},
        refresh=set(changed_trajs)
        | {st.trajectory_id for st in changed_steps.values() if st.reward_status != Step.RewardStatus.FINAL},
    )
    return events


def _chunks(rows: list[Step], size: int = 1000):
    # 4 parameters a row: within SQLite's 32,766 per statement.
    for i in range(0, len(rows), size):
        yield rows[i : i + size]


def _audit(r: RewardIn, source_id: int | None) -> dict:
    """The RewardEvent fields of ``r`` that a step's and a trajectory's audit row share."""
    return {
        "new_reward": r.reward,
        "reward_source": r.source,
        "final": r.final,
        "source_id": source_id,
        "metadata": r.metadata,
    }
