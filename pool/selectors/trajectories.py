"""Reads of trajectories and prompt groups: found by uid, listed for the API's pages, and
their API representations."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Q, QuerySet

from .. import compiled
from ..models import PromptGroup, Trajectory
from ..tenancy import Sources
from ..tenancy import q as of_sources


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


def trajectories_listed(sources: Sources = None) -> QuerySet[Trajectory]:
    """The trajectories ``GET /api/v1/trajectories`` pages through (the view applies its
    filters and cursor), with what ``trajectory_render`` reads joined; only those of
    ``sources`` (pool/tenancy.py; None: all)."""
    return Trajectory.objects.select_related("group", "source").filter(of_sources("source_id", sources))


def trajectory_get(
    *, uid: str | None = None, id: int | None = None, sources: Sources = None
) -> Trajectory | None:
    """The trajectory ``uid`` (or ``id``) with what ``trajectory_render`` reads joined, or
    None (also for one outside ``sources``)."""
    key = {"uid": uid} if uid is not None else {"id": id}
    return trajectories_listed(sources).filter(**key).first()


def groups_listed(sources: Sources = None) -> QuerySet[PromptGroup]:
    """The prompt groups ``GET /api/v1/groups`` pages through (filters and cursor: the
    view's): those of ``sources`` and the shared ones (no source; None: all)."""
    if sources is None:
        return PromptGroup.objects.all()
    return PromptGroup.objects.filter(Q(source__isnull=True) | of_sources("source_id", sources))


def group_get(*, uid: str, sources: Sources = None, shared: bool = True) -> PromptGroup | None:
    """The group ``uid`` if ``sources`` may see it (``shared``: also a shared group), or None."""
    qs = (
        groups_listed(sources)
        if shared or sources is None
        else PromptGroup.objects.filter(of_sources("source_id", sources))
    )
    return qs.filter(uid=uid).first()


def trajectory_ids_by_uid(uids: Iterable[str]) -> dict[str, int]:
    """The ids of the trajectories among these uids (one query); an unknown uid is absent."""
    return dict(Trajectory.objects.filter(uid__in=set(uids)).values_list("uid", "id"))


def write_target_owners(*, trajectory_uid: str | None, prompt_group_uid: str | None) -> dict[str, int | None]:
    """The owning source ids (None: no source, shared) of the named trajectory and prompt
    group that exist, as ``{"trajectory": id, "prompt group": id}`` (an unknown uid is
    absent). The proxied doors read it before anything goes upstream (gateway/proxy/owners.py);
    served by the unique indexes on ``uid``."""
    out: dict[str, int | None] = {}
    if trajectory_uid is not None:
        for (source_id,) in compiled.read(_trajectory_owner, uid=trajectory_uid):
            out["trajectory"] = source_id
    if prompt_group_uid is not None:
        for (source_id,) in compiled.read(_group_owner, uid=prompt_group_uid):
            out["prompt group"] = source_id
    return out


# The builds of write_target_owners' reads (pool/compiled.py: the first call of every named
# trajectory makes them, and the ORM's compile was most of their cost).
def _trajectory_owner(*, uid: str):
    return Trajectory.objects.filter(uid=uid).values_list("source_id")


def _group_owner(*, uid: str):
    return PromptGroup.objects.filter(uid=uid).values_list("source_id")
