"""Prompt groups: upsert with dataset fields, and completion detection."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from django.db import transaction
from django.db.models import Count, F, Q
from django.utils import timezone

from ..bus import GroupsCompleted, StepsWritten, UnitsChanged, emit
from ..errors import UidTaken
from ..ingest import rules
from ..lookups import Many
from ..models import PromptGroup, Trajectory
from ..tenancy import OWN, allowed
from .task_catalog import group_task_set

TERMINAL = (Trajectory.Status.COMPLETED, Trajectory.Status.FAILED, Trajectory.Status.ABANDONED)


@transaction.atomic
def group_upsert(
    *,
    uid: str,
    expected_rollouts: int | None = None,
    dataset: str | None = None,
    ground_truth: Any = None,
    metadata: dict | None = None,
    task: str | None = None,
    source_id: int | None = None,
    sources: object = OWN,
) -> PromptGroup:
    """Create the group or update the given fields. Idempotent. A restricted writer
    (``sources``: pool/tenancy.py) creates its source's group and changes only its own
    groups: a shared group or another source's raises UidTaken, and nothing changes."""
    rules.check_uid(uid, "uid")
    rules.check_name(dataset, "dataset")
    mine = allowed(source_id, sources)
    owner = source_id if mine is not None else None
    group, _ = PromptGroup.objects.select_for_update().get_or_create(uid=uid, defaults={"source_id": owner})
    if mine is not None and group.source_id not in mine:
        raise UidTaken("prompt group", uid, field="uid")
    if task is not None:  # the task it rolls out (pool/services/task_catalog.py)
        group_task_set(group=group, uid=task, source_id=source_id, sources=sources, field="task")
    changed = []
    for name, value in (
        ("expected_rollouts", expected_rollouts),
        ("dataset", dataset),
        ("ground_truth", ground_truth),
        ("metadata", metadata),
    ):
        if value is not None and getattr(group, name) != value:
            setattr(group, name, value)
            changed.append(name)
    if changed:
        group.save(update_fields=changed)
        if "expected_rollouts" in changed:  # the n a dataset's group needs, by default
            emit(UnitsChanged(group_ids=(group.id,)))
    groups_check_complete(group_ids=[group.id])
    group.refresh_from_db()
    return group


def groups_check_complete(*, group_ids: Iterable[int], mark_last: Collection[int] = ()) -> list[int]:
    """Mark open groups complete once ``expected_rollouts`` trajectories have ended, and
    emit ``GroupsCompleted`` (its effects settle the rollouts' readiness and enqueue the
    groups' prefix-tree merge and computed rewards on commit). ``mark_last``: trajectories
    ending now whose is_last step the settle marks (trajectories_complete). Idempotent;
    call inside the writer's transaction. Returns the ids that became complete."""
    ids = list(group_ids)
    if not ids:
        return []
    ready = list(
        PromptGroup.objects.filter(
            id__any=Many(ids), status=PromptGroup.Status.OPEN, expected_rollouts__isnull=False
        )
        .annotate(ended=Count("trajectories", filter=Q(trajectories__status__in=TERMINAL)))
        .filter(ended__gte=F("expected_rollouts"))
        .values_list("id", flat=True)
    )
    if ready:
        PromptGroup.objects.filter(id__any=Many(ready), status=PromptGroup.Status.OPEN).update(
            status=PromptGroup.Status.COMPLETE, completed_at=timezone.now()
        )
        emit(GroupsCompleted(group_ids=tuple(ready), mark_last=frozenset(mark_last)))
    return ready


def steps_written_groups(written: StepsWritten) -> None:
    """The effect of stored steps on groups: a last step may complete its group."""
    groups = {
        gid
        for s in written.steps
        if s.is_last and (gid := written.trajectories[s.trajectory_id].group_id) is not None
    }
    if groups:
        groups_check_complete(group_ids=groups)
