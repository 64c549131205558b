"""Reads of trajectories and prompt groups: found by uid, listed for the API's pages, and
their API representations."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import QuerySet

from ..models import PromptGroup, Trajectory


def trajectory_render(t: Trajectory) -> dict[str, Any]:
    return {
        "uid": t.uid,
        "prompt_group_uid": t.group.uid if t.group_id else None,
        "channel": t.channel,
        "status": t.status,
        "reward": t.reward,
        "reward_source": t.reward_source,
        "step_count": t.step_count,
        "policy_version": t.policy_version_id,
        "metadata": t.metadata,
        "source": t.source.name if t.source_id else None,
        "created_at": t.created_at,
        "updated_at": t.updated_at,
        "completed_at": t.completed_at,
    }


def group_render(g: PromptGroup) -> dict[str, Any]:
    return {
        "uid": g.uid,
        "status": g.status,
        "expected_rollouts": g.expected_rollouts,
        "dataset": g.dataset,
        "ground_truth": g.ground_truth,
        "metadata": g.metadata,
        "created_at": g.created_at,
        "completed_at": g.completed_at,
    }


def trajectories_listed() -> QuerySet[Trajectory]:
    """The trajectories ``GET /api/v1/trajectories`` pages through (the view applies its
    filters and cursor), with what ``trajectory_render`` reads joined."""
    return Trajectory.objects.select_related("group", "source")


def trajectory_get(*, uid: str | None = None, id: int | None = None) -> Trajectory | None:
    """The trajectory ``uid`` (or ``id``) with what ``trajectory_render`` reads joined, or None."""
    key = {"uid": uid} if uid is not None else {"id": id}
    return trajectories_listed().filter(**key).first()


def groups_listed() -> QuerySet[PromptGroup]:
    """The prompt groups ``GET /api/v1/groups`` pages through (filters and cursor: the view's)."""
    return PromptGroup.objects.all()


def group_get(*, uid: str) -> PromptGroup | None:
    return PromptGroup.objects.filter(uid=uid).first()


def trajectory_ids_by_uid(uids: Iterable[str]) -> dict[str, int]:
    """The ids of the trajectories among these uids (one query); an unknown uid is absent."""
    return dict(Trajectory.objects.filter(uid__in=set(uids)).values_list("uid", "id"))
