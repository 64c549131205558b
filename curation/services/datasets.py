"""Datasets: named, versioned curation specs. A version is immutable; an edit that changes
the spec adds a version, so what was served under an older one stays traceable."""

from __future__ import annotations

import re
from typing import Any

from django.db import IntegrityError, transaction

from pool.bus import emit
from pool.errors import Conflict, InvalidInput, NotFound
from pool.models import AuditEvent
from pool.services.audit import audit_record

from ..events import DatasetVersionCurrent
from ..models import Dataset, DatasetVersion
from ..specs import spec_dump, spec_parse

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# Names a dataset cannot take: the literal routes beside /api/v1/datasets/<name>
# (curation/api_urls.py: "datasets/preview" previews an unsaved spec), which a dataset of that
# name could never be reached past. tests/curation/test_datasets.py checks the URL conf.
RESERVED_NAMES = frozenset({"preview"})


@transaction.atomic
def dataset_create(*, name: str, spec: Any = None, description: str = "", actor: str = "") -> Dataset:
    """Create a dataset at version 1. Not idempotent: an existing name raises Conflict;
    a bad name or spec InvalidInput naming the field."""
    if not isinstance(name, str) or not NAME.match(name):
        raise InvalidInput(
            "name must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
            field="name",
        )
    if name in RESERVED_NAMES:
        raise InvalidInput(
            f"{name!r} is a reserved word (a route of the datasets API): pick another name", field="name"
        )
    parsed = spec_dump(spec_parse(spec))
    try:
        with transaction.atomic():
            dataset = Dataset.objects.create(name=name, description=description or "")
    except IntegrityError:
        raise Conflict(f"dataset {name!r} already exists", field="name") from None
    version = DatasetVersion.objects.create(dataset=dataset, version=1, spec=parsed, created_by=actor)
    dataset.current = version
    dataset.save(update_fields=["current", "updated_at"])
    audit_record(action=AuditEvent.Action.DATASET_CREATE, target=name, actor=actor, details={"version": 1})
    emit(DatasetVersionCurrent(version_id=version.id))  # its count: services/counts.py
    return dataset


@transaction.atomic
def dataset_update(
    *, name: str, spec: Any = None, description: str | None = None, actor: str = ""
) -> Dataset:
    """Edit a dataset. A spec that differs from the current version's adds version n + 1
    and makes it current; the same spec adds nothing (idempotent). ``spec`` None keeps it."""
    dataset = (
        Dataset.objects.select_for_update(of=("self",)).select_related("current").filter(name=name).first()
    )
    if dataset is None:
        raise NotFound(f"dataset {name!r} does not exist", field="name")
    if spec is not None:
        parsed = spec_dump(spec_parse(spec))
        current = dataset.current
        # The current spec normalised again: one stored before a field existed has no key
        # for it, and is still the same spec as today's form with that field's default.
        if current is None or spec_dump(spec_parse(current.spec)) != parsed:
            number = (current.version if current else 0) + 1
            dataset.current = DatasetVersion.objects.create(
                dataset=dataset, version=number, spec=parsed, created_by=actor
            )
            audit_record(
                action=AuditEvent.Action.DATASET_VERSION,
                target=name,
                actor=actor,
                details={"version": number},
            )
            emit(DatasetVersionCurrent(version_id=dataset.current.id))
    if description is not None:
        dataset.description = description
    dataset.save(update_fields=["current", "description", "updated_at"])
    return dataset
