"""Late rewards, for a step or a trajectory, audited as RewardEvents."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from .. import compiled, sql
from ..bus import RewardsSet, StepsWritten, emit
from ..deadlocks import retry_on_deadlock
from ..errors import InvalidInput, NotFound, RewardDelivered
from ..ingest import rules
from ..lookups import Many
from ..models import RewardEvent, Step, Trajectory
from ..tenancy import OWN, allowed
from ..tenancy import q as of_sources
from . import effective_reward
from .readiness import rewards_settle

# Step.RewardSource.values builds a new list on every read (130 ms in 5 batches of 1,000).
_SOURCES = frozenset(Step.RewardSource.values)


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
def rewards_apply(
    *, rewards: list[RewardIn], source_id: int | None = None, sources: object = OWN
) -> list[RewardEvent]:
    """Apply rewards atomically (all or none). Each change is recorded as a RewardEvent.
    Re-applying the same reward with the same status writes nothing (idempotent). A step or
    trajectory outside ``sources`` (pool/tenancy.py) is NotFound, like an unknown one. A
    change to a trajectory (or a step of one) whose steps were already delivered (leased or
    in a snapshot: pool/services/delivery.py) raises RewardDelivered (409) naming the item,
    and nothing of the call is written."""
    mine = allowed(source_id, sources)
    for r in rewards:
        p = r.field_prefix
        rules.check_reward(r.reward, f"{p}reward")
        if (r.step_uid is None) == (r.trajectory_uid is None):
            raise InvalidInput("give exactly one of step_uid or trajectory_uid", field=f"{p}step_uid")
        if r.source not in _SOURCES:
            raise InvalidInput(f"source must be one of {Step.RewardSource.values}", field=f"{p}source")
    step_uids = [r.step_uid for r in rewards if r.step_uid]
    traj_uids = [r.trajectory_uid for r in rewards if r.trajectory_uid]
    # Lock the trajectories (those named and those of the steps named) in primary-key
    # order: every writer of a trajectory's steps' rewards or readiness locks its trajectory
    # first (pool/services/readiness.py), so concurrent reward writers, completions and
    # readiness refreshes cannot deadlock, and the steps' reward columns read after the lock
    # stay as read until this transaction ends. The steps themselves are not locked (that
    # wrote a row lock into each of them before the UPDATE rewrites them anyway). Read only
    # the reward columns of the steps, as tuples (model instances cost ~70 us each here).
    # The named steps' trajectories are read first, unlocked (a step never changes
    # trajectory), so the lock below is by uid and primary key lists: as a subquery inside
    # the OR, PostgreSQL hashed every trajectory (~30 ms of a 1,000-reward batch).
    of_steps = (
        set(Step.objects.filter(uid__any=Many(step_uids)).values_list("trajectory_id", flat=True))
        if step_uids
        else set()
    )
    trajs = {
        t.uid: t
        for t in Trajectory.objects.select_for_update()
        .filter(Q(uid__any=Many(traj_uids)) | Q(id__any=Many(of_steps)))
        .filter(of_sources("source_id", mine))
        .only("id", "uid", "reward", "reward_source", "delivered_at")
        .order_by("id")
    }
    steps = {
        row[1]: _StepReward(*row)
        for row in Step.objects.filter(
            uid__any=Many(step_uids), trajectory_id__any=Many([t.id for t in trajs.values()])
        ).values_list("id", "uid", "trajectory_id", "reward", "reward_status", "reward_source")
    }
    delivered = {t.id: t.delivered_at for t in trajs.values()}
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
            reward_check_undelivered(
                delivered.get(step.trajectory_id), f"step {r.step_uid!r}", f"{p}step_uid"
            )
            events.append(_event(step_id=step.id, old_reward=step.reward, **_audit(r, source_id)))
            step.reward, step.reward_status, step.reward_source = r.reward, status, r.source
            changed_steps[step.id] = step
        else:
            traj = trajs.get(r.trajectory_uid or "")
            if traj is None:
                raise NotFound(f"trajectory {r.trajectory_uid!r} does not exist", field=f"{p}trajectory_uid")
            if traj.reward == r.reward:
                continue
            reward_check_undelivered(traj.delivered_at, f"trajectory {traj.uid!r}", f"{p}trajectory_uid")
            events.append(_event(trajectory_id=traj.id, old_reward=traj.reward, **_audit(r, source_id)))
            traj.reward, traj.reward_source = r.reward, r.source
            changed_trajs[traj.id] = traj
    # One statement per table (not per row), then the audit rows; the steps' own rewards
    # are written with their other reward columns, by the refresh below.
    now = timezone.now()
    for traj in changed_trajs.values():
        traj.updated_at = now
    Trajectory.objects.bulk_update(
        changed_trajs.values(), ["reward", "reward_source", "updated_at"], batch_size=500
    )
    sql.rows_insert(events)
    # The steps' rewards and readiness follow (pool/services/effective_reward.py): an
    # outcome reaches its branch's unrewarded steps, a trajectory reward every branch without
    # an outcome of its own, a process reward no other step.
    rewards_settle(
        rewarded={st.trajectory_id for st in changed_steps.values()},
        refresh=set(changed_trajs)
        | {st.trajectory_id for st in changed_steps.values() if st.reward_status != Step.RewardStatus.FINAL},
        own={st.id: (st.reward, st.reward_status, st.reward_source) for st in changed_steps.values()},
    )
    if events:
        touched = frozenset(changed_trajs) | {st.trajectory_id for st in changed_steps.values()}
        emit(RewardsSet(count=len(events), trajectory_ids=touched))
    return events


def reward_check_undelivered(delivered_at, what: str, field: str) -> None:
    """RewardDelivered when ``delivered_at`` is set: the change would rewrite what a consumer
    or a snapshot already holds."""
    if delivered_at is not None:
        raise RewardDelivered(
            f"{what} was already delivered (leased or in a snapshot) at {delivered_at.isoformat()}; "
            "its rewards can no longer change",
            field=field,
        )


def steps_written_rewards(written: StepsWritten) -> None:
    """The effect of stored steps on rewards (registered in pool/apps.py): outcome rewards,
    then the effective rewards of the branches a final reward reaches. No query for a write
    without a rewarded step (every proxied call)."""
    done = _outcome_rewards(written)
    _effective_rewards(written, done=done)


def _outcome_rewards(written: StepsWritten) -> set[int]:
    """A trajectory ended by a last step with a final reward of its own, but without a
    reward itself, takes that reward as the trajectory's (audited, through rewards_apply)
    when some of its steps have no final reward: the outcome reward of Claw-R1's flows,
    which put the score on the last step only. Without it the earlier steps would never be
    ready, nor the group. Two lookups by primary key, only for a write that holds such a last step; a
    trajectory whose every step is rewarded (W-ingest) is left as it is. Returns the
    trajectories it rewarded (their effective rewards are refreshed)."""
    # A trajectory this write created holds no step but the write's own (its row is not
    # visible to other writers before the commit): when each of them has a final reward,
    # none waits for the outcome, and no query is needed (W-ingest's whole trajectories).
    waiting = {s.trajectory_id for s in written.steps if not s.reward_final}
    last = [
        s.id
        for s in written.steps
        if s.is_last
        and s.reward_final
        and (s.trajectory_id in waiting or not written.trajectories[s.trajectory_id].created)
    ]
    if not last:
        return set()
    # Two lookups by primary key, so the plan starts from the few steps written whatever
    # the statistics say: as one join, a freshly filled pool (its statistics not analysed
    # yet) had PostgreSQL scan every trajectory once per batch (5.8 ms of a 9.6 ms W-ingest
    # batch at 600 trajectories, growing with the pool).
    rewarded: dict[int, tuple[float, str | None, str]] = {}
    for tid, reward, src, uid in compiled.read(_rewarded_last, ids=Many(last)):
        rewarded.setdefault(tid, (reward, src, uid))  # a trajectory's first such step
    if not rewarded:
        return set()
    rows = [(t, *rewarded[tid], tid) for tid, t in compiled.read(_waiting_for_outcome, ids=Many(rewarded))]
    if rows:
        rewards_apply(
            rewards=[
                RewardIn(
                    trajectory_uid=t,
                    reward=float(r),  # type: ignore[arg-type]  # the query keeps reward__isnull=False
                    source=src or Step.RewardSource.ENV,
                    metadata={"from_last_step": uid},
                )
                for t, r, src, uid, _tid in rows
            ],
            source_id=written.source_id,
            sources=None,  # the write that made them was the writer's
        )
    return {row[4] for row in rows}


# The builds of _outcome_rewards' two reads (pool/compiled.py: a batch that ends trajectories
# begun by an earlier one makes both).
def _rewarded_last(*, ids: Many):
    return (
        Step.objects.filter(id__any=ids, reward__isnull=False)
        .order_by("id")
        .values_list("trajectory_id", "reward", "reward_source", "uid")
    )


def _waiting_for_outcome(*, ids: Many):
    """Trajectories without a reward of their own, a step of which waits for one; not a
    delivered one: its rewards are frozen (pool/services/delivery.py)."""
    unrewarded = Step.objects.filter(trajectory_id=OuterRef("id")).exclude(
        reward_status=Step.RewardStatus.FINAL
    )
    return (
        Trajectory.objects.filter(id__any=ids, reward__isnull=True, delivered_at__isnull=True)
        .filter(Exists(unrewarded))
        .order_by("id")
        .values_list("id", "uid")
    )


def _effective_rewards(written: StepsWritten, *, done: set[int]) -> None:
    """A final reward written on a step becomes the effective reward of the steps of its
    branch that have none (pool/services/effective_reward.py): refreshed for the
    trajectories where such steps may exist (the write holds one, or the trajectory had
    steps before it), unless readiness settles them anyway. No query for a write without a
    rewarded step (every proxied call), nor for a batch whose trajectories it creates with
    every step rewarded (W-ingest). ``done``: trajectories the outcome rewards refreshed."""
    rewarded = {s.trajectory_id for s in written.steps if s.reward_final}
    if not rewarded:
        return
    unrewarded = {s.trajectory_id for s in written.steps if not s.reward_final}
    settled = written.settled()
    refresh = {
        tid
        for tid in rewarded
        if tid not in settled
        and tid not in done
        and (tid in unrewarded or not written.trajectories[tid].created)
    }
    if refresh:
        effective_reward.steps_refresh(trajectory_ids=refresh)


@dataclass(slots=True)
class _StepReward:
    """The reward columns of a locked step row."""

    id: int
    uid: str
    trajectory_id: int
    reward: float | None
    reward_status: str
    reward_source: str | None


def _event(**values) -> RewardEvent:
    """An unsaved RewardEvent without Model.__init__ (~70 us a row in a 1,000-reward batch,
    pyinstrument): sql.new_instance."""
    return sql.new_instance(RewardEvent, values)  # type: ignore[return-value]


def _audit(r: RewardIn, source_id: int | None) -> dict:
    """The RewardEvent fields of ``r`` that a step's and a trajectory's audit row share."""
    return {
        "new_reward": r.reward,
        "reward_source": r.source,
        "final": r.final,
        "source_id": source_id,
        "metadata": r.metadata,
    }
