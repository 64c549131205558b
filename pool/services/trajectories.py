"""Trajectories: explicit creation (through the pipeline's trajectory_ensure), registration
and completion (with an optional final reward)."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from ..errors import Conflict, InvalidInput, NotFound
from ..ingest import TrajectorySpec, policy_versions_ensure, rules, trajectory_ensure
from ..models import Channel, RewardEvent, Step, Trajectory
from .groups import groups_check_complete
from .readiness import trajectories_settle
from .rewards import RewardIn, rewards_apply


@transaction.atomic
def trajectory_create(
    *,
    uid: str,
    prompt_group_uid: str | None = None,
    channel: str = Channel.TRAIN,
    metadata: dict | None = None,
    policy_version: int | None = None,
    source_id: int | None = None,
) -> tuple[Trajectory, bool]:
    """Create a trajectory (through the pipeline's trajectory_ensure). Idempotent: an
    existing uid is returned with created=False (a trajectory without a group adopts the
    given one); a different group raises Conflict."""
    rules.check_channel(channel)
    if policy_version is not None:
        policy_versions_ensure({policy_version})
    spec = TrajectorySpec(
        uid=uid, group_uid=prompt_group_uid, channel=channel, policy_version=policy_version, metadata=metadata
    )
    row = trajectory_ensure(specs=[spec], source_id=source_id)[uid]
    return Trajectory.objects.get(id=row.id), row.created


@transaction.atomic
def trajectory_register(
    *,
    uid: str,
    prompt_group_uid: str | None = None,
    channel: str | None = None,
    metadata: dict | None = None,
    source_id: int | None = None,
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
    row = trajectory_ensure(specs=[spec], source_id=source_id)[uid]
    traj = Trajectory.objects.select_for_update().get(id=row.id)
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
) -> Trajectory:
    """End a trajectory: mark its last step ``is_last``, set the trajectory reward (audited as
    a RewardEvent) and check group completion. ``reward_last_step``: the reward is also the
    last step's (Claw-R1's complete_trajectory), audited too. ``channel`` moves it. Idempotent
    for the same reward; completing an already-ended trajectory with a different status
    raises Conflict; an unknown trajectory NotFound."""
    rules.check_reward(reward, "reward")
    if channel is not None:
        rules.check_channel(channel)
    if status not in (Trajectory.Status.COMPLETED, Trajectory.Status.FAILED, Trajectory.Status.ABANDONED):
        raise InvalidInput(f"status must be completed, failed or abandoned; got {status!r}", field="status")
    traj = Trajectory.objects.select_for_update().filter(uid=uid).first()
    if traj is None:
        raise NotFound(f"trajectory {uid!r} does not exist", field="uid")
    if traj.status != Trajectory.Status.RUNNING and traj.status != status:
        raise Conflict(f"trajectory {uid!r} already ended as {traj.status}", field="status")
    now = timezone.now()
    if traj.status == Trajectory.Status.RUNNING:
        traj.status = status
        traj.completed_at = now
        last = Step.objects.filter(trajectory=traj).order_by("-step_index").only("id").first()
        if last is not None:
            Step.objects.filter(trajectory=traj, is_last=True).exclude(id=last.id).update(is_last=False)
            Step.objects.filter(id=last.id).update(is_last=True, updated_at=now)
    if reward is not None and reward != traj.reward:
        RewardEvent.objects.create(
            trajectory=traj,
            old_reward=traj.reward,
            new_reward=reward,
            reward_source=reward_source,
            source_id=source_id,
        )
        traj.reward = reward
    if channel is not None:
        traj.channel = channel
    traj.save(update_fields=["status", "completed_at", "reward", "channel", "updated_at"])
    trajectories_settle(trajectory_ids=[traj.id])
    if traj.group_id:
        groups_check_complete(group_ids=[traj.group_id])
    if reward is not None and reward_last_step:
        last_uid = Step.objects.filter(trajectory=traj, is_last=True).values_list("uid", flat=True).first()
        if last_uid is not None:
            rewards_apply(
                rewards=[RewardIn(reward=reward, step_uid=last_uid, source=reward_source)],
                source_id=source_id,
            )
    return traj
