"""Operator labels and notes on steps: the pool's write of its own columns. Curation decides
who changes what and audits it (curation/services/labels.py); the columns are written here."""

from __future__ import annotations

from collections.abc import Sequence

from django.db.models import F

from ..bus import LabelsSet, UnitsChanged, emit
from ..models import Step


def steps_label_set(*, step_ids: Sequence[int], label: str) -> int:
    """Set the operator label of these steps (``""`` clears it) and emit ``LabelsSet``.
    Idempotent. One statement, atomic by itself (no savepoint inside the caller's
    transaction); the caller validates the label and locks the rows. Returns the number of
    rows written."""
    ids = tuple(step_ids)
    if not ids:
        return 0
    n = Step.objects.filter(id__in=ids).update(label=label)
    emit(LabelsSet(step_ids=ids, label=label))
    return n


def steps_note_set(*, step_ids: Sequence[int], note: str) -> int:
    """Set the operator note of these steps. One statement; idempotent."""
    ids = tuple(step_ids)
    if not ids:
        return 0
    return Step.objects.filter(id__in=ids).update(note=note)


# Step ids per statement (SQLite's variable limit; bounded statements on PostgreSQL).
FLAG_CHUNK = 5000


def steps_quality_flag_set(*, step_ids: Sequence[int], flag: int) -> int:
    """Add the quality bit ``flag`` (pool.flags.Quality) to these steps' flags, keeping the
    others; returns how many steps gained it. Idempotent (a step that has it is not
    written). One statement per FLAG_CHUNK ids, each atomic (``flags | bit`` in the
    statement: a concurrent write of another bit is kept). Race: the readiness settle
    rewrites a group's flags from a read (pool/services/readiness.py, group flags only) and
    could drop a bit set between its read and its write; a trained step's group settled
    long before its verdict comes."""
    ids = sorted(set(step_ids))
    n = 0
    for i in range(0, len(ids), FLAG_CHUNK):
        n += (
            Step.objects.filter(id__in=ids[i : i + FLAG_CHUNK])
            .alias(_has=F("quality_flags").bitand(flag))
            .exclude(_has=flag)
            .update(quality_flags=F("quality_flags").bitor(flag))
        )
    if n:
        emit(UnitsChanged(step_ids=tuple(ids)))
    return n
