"""Removing whole prompt groups (and trajectories without a group) from the pool: retention's
write (curation/services/retention.py decides what goes; this removes it).

The unit is a whole group: its trajectories, their steps and every row that hangs on them
(rewards, feedback, events are kept with their step link cleared, images' links, curation's
tags and labels: whatever other apps declare with a foreign key, found through Django's
model metadata, so the pool imports none of them). A reference declared DO_NOTHING without a
constraint is a record kept by uid on purpose (a checkpoint's steps: lineage names a step
that is gone) and is left as it is. A group leaves nothing half-counted:
its trajectories' counters, its anchor, its merges and its serving rows go with it.

Token chains survive: a step is stored as a delta against its token parent
(pool/tokens.py), and a parent is always in the step's own trajectory or group, so a whole
group never takes a kept step's parent. Should a kept step still point into what goes (rows
written by hand, an older layout), it is re-based first: stored whole, so its ids, and its
descendants', read exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import models, transaction

from .. import sql, tokens
from ..bus import UnitsChanged, emit
from ..models import PromptGroup, Step, Trajectory


@dataclass(slots=True)
class Purged:
    groups: int = 0
    trajectories: int = 0
    steps: int = 0
    rebased: int = 0  # kept steps stored whole because their token parent went


def groups_purge(*, group_ids: Sequence[int], trajectory_ids: Sequence[int] = ()) -> Purged:
    """Remove these prompt groups and these trajectories (without a group), with everything
    that hangs on them (module docstring), in one transaction. Idempotent: ids already gone
    are skipped. Kept steps whose token parent goes are re-based first."""
    with transaction.atomic():
        # Said while the rows are still there to be read (whoever keeps counts reads them).
        emit(UnitsChanged(group_ids=tuple(group_ids), trajectory_ids=tuple(trajectory_ids)))
        traj_ids = sorted(
            set(Trajectory.objects.filter(group_id__in=group_ids).values_list("id", flat=True))
            | set(
                Trajectory.objects.filter(id__in=trajectory_ids, group__isnull=True).values_list(
                    "id", flat=True
                )
            )
        )
        step_ids = list(Step.objects.filter(trajectory_id__in=traj_ids).values_list("id", flat=True))
        gone = set(step_ids)
        out = Purged(rebased=_rebase_kept(gone, traj_ids))
        # Kept rows that only point at what goes (a kept group's anchor, a branch's link).
        PromptGroup.objects.filter(anchor_step_id__in=step_ids).exclude(id__in=group_ids).update(
            anchor_step=None
        )
        Step.objects.filter(parent_step_id__in=step_ids).exclude(trajectory_id__in=traj_ids).update(
            parent_step=None
        )
        _dependents(Step, step_ids)
        _dependents(Trajectory, traj_ids)
        _dependents(PromptGroup, list(group_ids))
        out.steps = sql.rows_delete(Step, step_ids)
        out.trajectories = sql.rows_delete(Trajectory, traj_ids)
        out.groups = sql.rows_delete(PromptGroup, list(group_ids))
    return out


def _rebase_kept(gone: set[int], traj_ids: list[int]) -> int:
    """Store whole every kept step whose token parent is in ``gone``."""
    kept = list(
        Step.objects.filter(seq_parent_id__in=gone)
        .exclude(trajectory_id__in=traj_ids)
        .values_list("id", flat=True)
    )
    if not kept:
        return 0
    full = tokens.load_sequences(kept)
    sql.steps_rebase([(sid, full[sid]) for sid in kept])
    return len(kept)


def _dependents(model: type[models.Model], ids: list[int]) -> None:
    """What references these rows of ``model`` from other tables: removed (CASCADE) or
    unlinked (SET_NULL). The pool's own parents and children (steps of trajectories,
    trajectories of groups) are removed by the caller."""
    if not ids:
        return
    for rel in model._meta.get_fields(include_hidden=True):
        if not (rel.auto_created and not rel.concrete and (rel.one_to_many or rel.one_to_one)):
            continue  # only the reverse side of foreign keys pointing here
        related = rel.related_model
        if related in (Step, Trajectory, PromptGroup) or rel.on_delete is models.DO_NOTHING:
            continue  # the pool's own (above), and records kept by uid (lineage) on purpose
        rows = related._base_manager.filter(**{f"{rel.field.name}__in": ids})
        if rel.on_delete is models.SET_NULL:
            rows.update(**{rel.field.name: None})
        else:  # CASCADE (PROTECT towards a group, step or trajectory: nothing of another app uses it)
            rows.delete()
