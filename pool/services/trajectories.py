"""Trajectories: explicit creation and completion (with an optional final reward)."""

from __future__ import annotations

import math

from django.db import transaction
from django.utils import timezone

from ..errors import Conflict, InvalidInput, NotFound
from ..models import Channel, PromptGroup, RewardEvent, Step, Trajectory
from .groups import groups_check_complete


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
    """Create a trajectory. Idempotent: an existing uid with the same group is returned with
    created=False; a different group raises Conflict."""
    group = PromptGroup.objects.get_or_create(uid=prompt_group_uid)[0] if prompt_group_uid else None
    if policy_version is not None:
        from .policy import policy_version_ensure

        policy_version_ensure(version=policy_version)
    traj, created = Trajectory.objects.get_or_create(
        uid=uid,
        defaults={
            "group": group,
            "channel": channel,
            "metadata": metadata or {},
            "policy_version_id": policy_version,
            "source_id": source_id,
        },
    )
    if not created and group is not None and traj.group_id not in (None, group.id):
        raise Conflict(f"trajectory {uid!r} belongs to another prompt group", field="prompt_group_uid")
    return traj, created


@transaction.atomic
def trajectory_complete(
    *,
    uid: str,
    reward: float | None = None,
    status: str = Trajectory.Status.COMPLETED,
    reward_source: str = Step.RewardSource.ENV,
    source_id: int | None = None,
) -> Trajectory:
    """End a trajectory: mark its last step ``is_last``, set the trajectory reward (audited as
    a RewardEvent) and check group completion. Idempotent for the same reward; completing an
    already-ended trajectory with a different status raises Conflict."""
    if reward is not None and not math.isfinite(reward):
        raise InvalidInput("reward must be a finite number", field="reward")
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
    traj.save(update_fields=["status", "completed_at", "reward", "updated_at"])
    if traj.group_id:
        groups_check_complete(group_ids=[traj.group_id])
    return traj
