"""Operator labels and notes on steps: the pool's write of its own columns. Curation decides
who changes what and audits it (curation/services/labels.py); the columns are written here."""

from __future__ import annotations

from collections.abc import Sequence

from ..ingest.effects import LabelsSet, emit
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
