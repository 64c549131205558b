"""Trajectories: explicit creation (through the pipeline's trajectory_ensure), registration
and completion (with an optional final reward)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from .. import sql
from ..bus import EndedTrajectory, StepsWritten, TrajectoriesEnded, UnitsChanged, emit
from ..deadlocks import retry_on_deadlock
from ..errors import Conflict, InvalidInput, NotFound
from ..ingest import rules
from ..ingest.claim import Tail, recent
from ..ingest.pipeline import TrajectorySpec, policy_versions_ensure, trajectory_ensure
from ..lookups import Many
from ..models import Channel, RewardEvent, Step, Trajectory
from ..tenancy import OWN, allowed
from ..tenancy import q as of_sources
from .groups import groups_check_complete
from .readiness import trajectories_settle
from .rewards import RewardIn, reward_check_undelivered, rewards_apply


@transaction.atomic
def trajectory_create(
    *,
    uid: str,
    prompt_group_uid: str | None = None,
    channel: str = Channel.TRAIN,
    metadata: dict | None = None,
    policy_version: int | None = None,
    source_id: int | None = None,
    sources: object = OWN,
) -> tuple[Trajectory, bool]:
    """Create a trajectory (through the pipeline's trajectory_ensure). Idempotent: an
    existing uid is returned with created=False (a trajectory without a group adopts the
    given one); a different group raises Conflict, another source's uid UidTaken."""
    rules.check_uid(uid, "uid")
    if prompt_group_uid is not None:
        rules.check_uid(prompt_group_uid, "prompt_group_uid")
    rules.check_channel(channel)
    if policy_version is not None:
        policy_versions_ensure({policy_version})
    spec = TrajectorySpec(
        uid=uid, group_uid=prompt_group_uid, channel=channel, policy_version=policy_version, metadata=metadata
    )
    row = trajectory_ensure(specs=[spec], source_id=source_id, sources=sources)[uid]
    return Trajectory.objects.get(id=row.id), row.created


@transaction.atomic
def trajectory_register(
    *,
    uid: str,
    prompt_group_uid: str | None = None,
    channel: str | None = None,
    metadata: dict | None = None,
    source_id: int | None = None,
    sources: object = OWN,
) -> Trajectory:
    """Create or update a trajectory (Claw-R1's init/register_trajectory).

    Idempotent. ``metadata`` is merged into the trajectory's; ``metadata['policy_version']``
    (an integer) becomes the policy version stamped on later appended steps. Raises Conflict
    for a trajectory of another prompt group, InvalidInput for a bad channel or version.
    """
    if channel is not None:
        rules.check_channel(channel)
    meta = metadata or {}
    if meta:
        rules.check_json(meta, "metadata")
    version = meta.get("policy_version")
    if version is not None:
        rules.check_policy_version(version, "metadata.policy_version")
        policy_versions_ensure({version})
    spec = TrajectorySpec(
        uid=uid,
        group_uid=prompt_group_uid,
        channel=channel or Channel.TRAIN,
        policy_version=version,
        metadata=meta,
    )
    row = trajectory_ensure(specs=[spec], source_id=source_id, sources=sources)[uid]
    traj = Trajectory.objects.select_for_update().get(id=row.id)
    if traj.step_count == 0 and traj.group_id is None:
        # Its first proxied call claims index 0 in the fast path's one statement (claim.py).
        # Not in a group: a first step is stored against the group's anchor, which another
        # rollout may set meanwhile; the general path reads it.
        transaction.on_commit(lambda: recent.put(uid, Tail(end=0, steps=[])))
    if row.created:
        return traj
    if channel is not None:
        traj.channel = channel
    if meta:
        traj.metadata = {**traj.metadata, **meta}
    if version is not None:
        traj.policy_version_id = version
    traj.save(update_fields=["channel", "metadata", "policy_version", "updated_at"])
    return traj


@dataclass(slots=True)
class CompletionIn:
    """One trajectory to end (``trajectories_complete``)."""

    uid: str
    reward: float | None = None
    status: str = Trajectory.Status.COMPLETED
    reward_source: str = Step.RewardSource.ENV
    field_prefix: str = ""


ENDED = (Trajectory.Status.COMPLETED, Trajectory.Status.FAILED, Trajectory.Status.ABANDONED)
# Step.RewardSource.values builds a new list on every read (once per completion here).
_REWARD_SOURCES = frozenset(Step.RewardSource.values)


@retry_on_deadlock
@transaction.atomic
def trajectories_complete(
    *, completions: list[CompletionIn], source_id: int | None = None, sources: object = OWN
) -> list[Trajectory]:
    """End trajectories at once (all or none): set each one's reward (audited as a
    RewardEvent), then settle readiness and group completion once for all, the settle
    marking each one's last step ``is_last`` as it rewrites the steps. A constant number of statements for any batch size. Idempotent for the same
    status and reward; ending an ended trajectory with another status raises Conflict, an
    unknown one (or one outside ``sources``: pool/tenancy.py) NotFound, another reward for one
    already delivered (leased or in a snapshot) RewardDelivered (409), each naming the item."""
    mine = allowed(source_id, sources)
    _completions_check(completions)
    # Locked in primary-key order, so concurrent completers cannot deadlock.
    trajs = {
        t.uid: t
        for t in Trajectory.objects.select_for_update()
        .filter(uid__any=Many([c.uid for c in completions]))
        .filter(of_sources("source_id", mine))
        .order_by("id")
    }
    now = timezone.now()
    ending, changed, events = _completions_apply(completions, trajs, now=now, source_id=source_id)
    ends = set(ending)
    rows = [(t.id, t.status, t.id in ends, t.reward, t.reward_source) for t in changed.values()]
    for i in range(0, len(rows), 1000):  # 5 parameters a row: within SQLite's limit
        sql.trajectories_end(rows[i : i + 1000], now)
    sql.rows_insert(events)
    if ending:
        # Before the groups: a trajectory's own reward task is enqueued before its group's.
        emit(_ended_event([changed[i] for i in ending]))
    if again := [i for i in changed if i not in ends]:
        emit(UnitsChanged(trajectory_ids=tuple(again)))  # ended before: a new reward or status
    if changed:
        # Groups first: a group these completions fill settles all its rollouts at once, so
        # each step's readiness is rewritten once, not once for its trajectory and again for
        # its group; only the other trajectories are settled after.
        # The settles mark each ending trajectory's last step (``mark_last``) in the same
        # statement that rewrites its steps' readiness: each row is written once.
        filled = set(
            groups_check_complete(
                group_ids={t.group_id for t in changed.values() if t.group_id}, mark_last=ends
            )
        )
        trajectories_settle(
            trajectory_ids=[t.id for t in changed.values() if t.group_id not in filled], mark_last=ends
        )
    return [trajs[c.uid] for c in completions]


def _completions_check(completions: list[CompletionIn]) -> None:
    """Each completion's reward, status and reward source, before anything is read."""
    for c in completions:
        rules.check_reward(c.reward, f"{c.field_prefix}reward")
        if c.status not in ENDED:
            raise InvalidInput(
                f"status must be completed, failed or abandoned; got {c.status!r}",
                field=f"{c.field_prefix}status",
            )
        if c.reward_source not in _REWARD_SOURCES:
            raise InvalidInput(
                f"reward_source must be one of {Step.RewardSource.values}",
                field=f"{c.field_prefix}reward_source",
            )


def _completions_apply(
    completions: list[CompletionIn], trajs: dict[str, Trajectory], *, now: datetime, source_id: int | None
) -> tuple[list[int], dict[int, Trajectory], list[RewardEvent]]:
    """The completions on the locked rows, in memory: the trajectories they end, those they
    change (ended or rewarded), and the reward changes' audit rows. Raises before any write."""
    ending: list[int] = []
    changed: dict[int, Trajectory] = {}
    events: list[RewardEvent] = []
    for c in completions:
        traj = trajs.get(c.uid)
        if traj is None:
            raise NotFound(f"trajectory {c.uid!r} does not exist", field=f"{c.field_prefix}uid")
        if traj.status != Trajectory.Status.RUNNING and traj.status != c.status:
            raise Conflict(
                f"trajectory {c.uid!r} already ended as {traj.status}", field=f"{c.field_prefix}status"
            )
        if traj.status == Trajectory.Status.RUNNING:
            traj.status, traj.completed_at = c.status, now
            ending.append(traj.id)
            changed[traj.id] = traj
        if c.reward is not None and c.reward != traj.reward:
            reward_check_undelivered(traj.delivered_at, f"trajectory {c.uid!r}", f"{c.field_prefix}reward")
            events.append(
                RewardEvent(
                    trajectory=traj,
                    old_reward=traj.reward,
                    new_reward=c.reward,
                    reward_source=c.reward_source,
                    source_id=source_id,
                )
            )
            traj.reward, traj.reward_source = c.reward, c.reward_source
            changed[traj.id] = traj
    return ending, changed, events


def _ended_event(ended: list[Trajectory]) -> TrajectoriesEnded:
    """The bus event of trajectories just ended. A reward function of its data source may
    score a completed trajectory without a reward (pool/services/reward_compute.py), unless
    its last step (its highest: the settle marks it is_last later in this transaction) has
    a final reward already (the task would skip it): one read instead of an outbox row and
    a task per such trajectory."""
    unscored = [t.id for t in ended if t.status == Trajectory.Status.COMPLETED and t.reward is None]
    scored = sql.trajectories_last_final(unscored) if unscored else set()
    return TrajectoriesEnded(
        trajectories=tuple(
            EndedTrajectory(
                id=t.id,
                uid=t.uid,
                source_id=t.source_id,
                channel=t.channel,
                status=t.status,
                step_count=t.step_count,
                group_id=t.group_id,
                reward_pending=t.status == Trajectory.Status.COMPLETED
                and t.reward is None
                and t.id not in scored,
            )
            for t in ended
        )
    )


def steps_written_ended(written: StepsWritten) -> None:
    """The effect of stored steps on trajectory ending: the trajectories a last step of
    this write ends are a ``TrajectoriesEnded``, like those ``trajectories_complete`` ends
    (one home for what follows: the computed-reward task, the live event). A last step
    without a final reward leaves the reward to a reward function of its data source, even
    for a trajectory that had ended. No query."""
    end: dict[int, int] = {}
    pending: dict[int, bool] = {}
    for s in written.steps:
        if s.step_index >= end.get(s.trajectory_id, 0):
            end[s.trajectory_id] = s.step_index + 1
        if s.is_last:
            pending[s.trajectory_id] = pending.get(s.trajectory_id, False) or not s.reward_final
    if not pending:
        return
    ended = []
    for tid, reward_pending in sorted(pending.items()):
        t = written.trajectories[tid]
        if t.ended and not reward_pending:
            continue
        ended.append(
            EndedTrajectory(
                id=tid,
                uid=t.uid,
                source_id=written.source_id,
                channel=written.channel,
                status=Trajectory.Status.COMPLETED,
                step_count=end[tid],
                group_id=t.group_id,
                reward_pending=reward_pending,
                just_ended=not t.ended,
            )
        )
    if ended:
        emit(TrajectoriesEnded(trajectories=tuple(ended)))


@retry_on_deadlock
@transaction.atomic
def trajectory_complete(
    *,
    uid: str,
    reward: float | None = None,
    status: str = Trajectory.Status.COMPLETED,
    reward_source: str = Step.RewardSource.ENV,
    channel: str | None = None,
    reward_last_step: bool = False,
    source_id: int | None = None,
    sources: object = OWN,
) -> Trajectory:
    """End one trajectory (``trajectories_complete``). ``channel`` also moves it;
    ``reward_last_step``: the reward is also the last step's (Claw-R1's
    complete_trajectory), audited too."""
    if channel is not None:
        rules.check_channel(channel)
    (traj,) = trajectories_complete(
        completions=[CompletionIn(uid=uid, reward=reward, status=status, reward_source=reward_source)],
        source_id=source_id,
        sources=sources,
    )
    if channel is not None and channel != traj.channel:
        traj.channel = channel
        traj.save(update_fields=["channel", "updated_at"])
    if reward is not None and reward_last_step:
        ends = _branch_ends(traj)
        if ends:
            rewards_apply(
                rewards=[RewardIn(reward=reward, step_uid=u, source=reward_source) for u in ends],
                source_id=source_id,
                sources=None,  # the steps of the trajectory just completed
            )
    return traj


def _branch_ends(traj: Trajectory) -> list[str]:
    """The steps a trajectory's reward is given to with ``reward_last_step``: its last step,
    and the last step of each other branch (gateway/proxy/branches.py: a compaction, a
    sub-agent) that has no reward of its own. A trajectory of one branch reads one row."""
    steps = Step.objects.filter(trajectory=traj)
    if not steps.filter(branch__gt=0).exists():
        return list(steps.filter(is_last=True).values_list("uid", flat=True))
    return list(
        steps.filter(
            step_index=Subquery(
                Step.objects.filter(trajectory=traj, branch=OuterRef("branch"))
                .order_by("-step_index")
                .values("step_index")[:1]
            ),
        )
        .filter(Q(is_last=True) | Q(reward__isnull=True))
        .values_list("uid", flat=True)
    )
