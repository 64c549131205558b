"""Operator labels, tags and notes on steps, every change audited as a LabelEvent."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Annotated, Any

import msgspec
from django.db import transaction

from pool import sql
from pool.bus import UnitsChanged, emit
from pool.errors import InvalidInput
from pool.ingest import rules
from pool.models import Step
from pool.services.labels import steps_label_set, steps_note_set

from ..models import LabelEvent, StepTag
from ..specs import struct_parse

MAX_TAG_LEN = 64
# Steps per bulk statement (SQLite caps parameters; ~10 ms per chunk on PostgreSQL).
CHUNK = 500


MAX_LABEL_TARGETS = 10_000


class LabelIn(msgspec.Struct, forbid_unknown_fields=True):
    """What ``POST /api/v1/labels`` takes (exactly one of step_uids and trajectory_uids): the
    label contract the API parses with and its schema is derived from."""

    step_uids: Annotated[list[str], msgspec.Meta(max_length=MAX_LABEL_TARGETS)] | None = None
    trajectory_uids: Annotated[list[str], msgspec.Meta(max_length=MAX_LABEL_TARGETS)] | None = None
    label: (
        Annotated[str, msgspec.Meta(description='accepted, rejected, quarantined; "" clears the label')]
        | None
    ) = None
    tags_add: list[Annotated[str, msgspec.Meta(max_length=MAX_TAG_LEN)]] = []
    tags_remove: list[Annotated[str, msgspec.Meta(max_length=MAX_TAG_LEN)]] = []
    note: str | None = None


def label_parse(raw: Any) -> LabelIn:
    """A label request's JSON body as a LabelIn, or InvalidInput naming the field."""
    change = struct_parse(raw, LabelIn)
    if (change.step_uids is None) == (change.trajectory_uids is None):
        raise InvalidInput("give exactly one of step_uids or trajectory_uids", field="step_uids")
    return change


@transaction.atomic
def steps_label(
    *,
    step_ids: Iterable[int],
    actor: str,
    user_id: int | None = None,
    label: str | None = None,
    tags_add: Sequence[str] = (),
    tags_remove: Sequence[str] = (),
    note: str | None = None,
) -> int:
    """Set the operator label (accepted, rejected, quarantined, or "" to clear), add or
    remove tags and set the note of these steps. Every step whose label, tags or note
    actually changes gets one LabelEvent (who, when, old and new). Idempotent: repeating a
    change writes nothing. Returns the number of steps changed. Datasets follow at once:
    labels are read at query time."""
    if label is not None and label not in Step.Label.values:
        raise InvalidInput(f"label must be one of {[v for v in Step.Label.values if v]} or ''", field="label")
    for name, given in (("tags_add", tags_add), ("tags_remove", tags_remove)):
        for i, tag in enumerate(given):
            if not isinstance(tag, str) or not tag.strip() or len(tag) > MAX_TAG_LEN:
                raise InvalidInput(
                    f"a tag is a non-empty string of at most {MAX_TAG_LEN} characters", field=f"{name}[{i}]"
                )
            rules.check_name(tag, f"{name}[{i}]")
    add, remove = set(tags_add), set(tags_remove) - set(tags_add)
    ids = sorted(set(step_ids))
    changed = 0
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        # Locked in primary-key order, so concurrent labellers cannot deadlock.
        rows = list(
            Step.objects.select_for_update()
            .filter(id__in=chunk)
            .order_by("id")
            .values_list("id", "label", "note")
        )
        tags: dict[int, set[str]] = {sid: set() for sid, _, _ in rows}
        for sid, tag in StepTag.objects.filter(step_id__in=chunk, tag__in=add | remove).values_list(
            "step_id", "tag"
        ):
            tags[sid].add(tag)
        events: list[LabelEvent] = []
        new_tags: list[StepTag] = []
        label_to: list[int] = []
        note_to: list[int] = []
        tagged: list[int] = []
        for sid, old_label, old_note in rows:
            change: dict = {}
            if label is not None and label != old_label:
                change["label"] = [old_label, label]
                label_to.append(sid)
            if note is not None and note != old_note:
                change["note"] = [old_note, note]
                note_to.append(sid)
            added = sorted(add - tags[sid])
            removed = sorted(remove & tags[sid])
            if added:
                change["tags_added"] = added
                new_tags.extend(StepTag(step_id=sid, tag=t) for t in added)
            if removed:
                change["tags_removed"] = removed
            if added or removed:
                tagged.append(sid)
            if change:
                events.append(LabelEvent(step_id=sid, user_id=user_id, actor=actor, changes=change))
        if label_to:
            steps_label_set(step_ids=label_to, label=label)  # type: ignore[arg-type]
        if note_to:
            steps_note_set(step_ids=note_to, note=note)  # type: ignore[arg-type]
        if remove:
            StepTag.objects.filter(step_id__in=chunk, tag__in=remove).delete()
        sql.rows_insert(new_tags)
        sql.rows_insert(events)
        if tagged:
            emit(UnitsChanged(step_ids=tuple(tagged)))
        changed += len(events)
    return changed


def trajectories_label(*, trajectory_ids: Iterable[int], **change) -> int:
    """``steps_label`` for every step of these trajectories."""
    ids = list(Step.objects.filter(trajectory_id__in=list(trajectory_ids)).values_list("id", flat=True))
    return steps_label(step_ids=ids, **change)
