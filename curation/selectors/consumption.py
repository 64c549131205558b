"""Reads of consumption: each consumer's progress (leases, deliveries, drops) and health,
the recent leases and snapshots, and a lease's batch as first served."""

from __future__ import annotations

import uuid
from collections import defaultdict
from datetime import datetime
from typing import Any

from django.db.models import Count, Exists, Max, OuterRef, Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from pool.models import PolicyVersion, Source
from pool.tenancy import Sources

from ..models import Consumer, Dataset, Delivery, Lease, Skip, Snapshot
from ..specs import spec_parse
from .specs import dataset_steps, spec_compile, units_admitted

# Snapshots and leases shown by the consumption page.
SNAPSHOTS_SHOWN = 20
LEASES_SHOWN = 30


def consumer_of(name: str, *, source_id: int | None) -> Consumer | None:
    """The consumer ``name`` of source ``source_id``: names are per source, so another
    source's consumer of the same name is never found, used nor revealed. ``source_id``
    None: the unowned consumer of that name (operator sessions, internal callers). An admin
    key pulls as its own source too; it reads and releases any consumer's leases by id,
    and reads another source's consumer with ``?source=`` (curation/apis.py). One query
    (consumer_source_name_uniq, consumer_unowned_name_uniq)."""
    q = Consumer.objects.filter(name=name)
    q = q.filter(source__isnull=True) if source_id is None else q.filter(source_id=source_id)
    return q.first()


def consumer_owners(name: str) -> list[int | None]:
    """The sources (None: unowned) that have a consumer called ``name`` (an admin's read by
    name alone). One query."""
    return list(Consumer.objects.filter(name=name).order_by("id").values_list("source_id", flat=True))


def source_id_named(name: str) -> int | None:
    """The id of the source called ``name`` (an admin's ``?source=``), or None."""
    return Source.objects.filter(name=name).values_list("id", flat=True).first()


def consumer_status(name: str, *, source_id: int | None) -> dict[str, Any] | None:
    """A consumer's progress per dataset it pulled from: its leases by status, the units
    delivered to it (and ``deliveries``: their uses, under a reuse budget), the ready units still waiting for it (under the dataset's current
    version), and the units dropped for it, by reason (Skip rows; specs.Serving), with the
    stale drops by the current policy version they were made under (``stale_drops``: how
    many still hold, are deliverable again since the version moved back, or were served
    since). None if source ``source_id``'s consumer ``name`` (names are per source; None:
    the unowned one) never pulled. A few grouped counts on indexed columns."""
    consumer = consumer_of(name, source_id=source_id)
    if consumer is None:
        return None
    datasets: dict[int, dict[str, Any]] = defaultdict(_blank_progress)
    _count_leases(consumer, datasets)
    _count_deliveries(consumer, datasets)
    skips = _skip_counts(consumer)
    now_current = PolicyVersion.objects.filter(is_current=True).values_list("version", flat=True).first()
    catalogue = {
        d.id: d
        for d in Dataset.objects.filter(id__in={row[0] for row in skips} | set(datasets)).select_related(
            "current"
        )
    }
    # Does the dataset's current version filter on freshness (then its filtered drops depend
    # on the current policy version too)?
    fresh_filter = {
        i: d.current is not None and spec_parse(d.current.spec).filters.max_staleness is not None
        for i, d in catalogue.items()
    }
    current_skips = _tally_skips(skips, datasets, catalogue, now_current, fresh_filter)
    names = {i: d.name for i, d in catalogue.items()}
    out = []
    for dataset_id, e in sorted(datasets.items(), key=lambda kv: names.get(kv[0], "")):
        ds = catalogue.get(dataset_id)
        unit, pending = _pending_units(
            consumer,
            dataset_id,
            ds,
            skipped=bool(current_skips.get(dataset_id)),
            now_current=now_current,
            fresh_filter=fresh_filter.get(dataset_id, False),
        )
        e["pending_unit"] = unit
        e["stale_drops"] = [
            e["stale_drops"][k]
            for k in sorted(e["stale_drops"], key=lambda k: (k[0], -1 if k[1] is None else k[1]))
        ]
        out.append({"dataset": names.get(dataset_id), **e, "pending_units": pending})
    return {"name": consumer.name, "created_at": consumer.created_at, "datasets": out}


def _blank_progress() -> dict[str, Any]:
    """One dataset's progress for a consumer, before anything is counted."""
    return {
        "leases": {s.value: 0 for s in Lease.Status},
        "delivered_units": 0,
        "deliveries": 0,
        "dropped": {r.label: 0 for r in Skip.Reason},
        "dropped_steps": {r.label: 0 for r in Skip.Reason},
        "stale_drops": {},
    }


def _count_leases(consumer: Consumer, datasets: dict[int, dict[str, Any]]) -> None:
    """The consumer's leases per dataset, by status: one grouped count."""
    leases = (
        Lease.objects.filter(consumer=consumer)
        .values_list("dataset_version__dataset_id", "status")
        .annotate(n=Count("id"))
        .order_by()
    )
    for dataset_id, status, n in leases:
        datasets[dataset_id]["leases"][status] = n


def _count_deliveries(consumer: Consumer, datasets: dict[int, dict[str, Any]]) -> None:
    """Units delivered per dataset, and every use of them. A unit delivered at all has its
    use 0 row (acked uses are 0..n-1, specs.Serving.reuse): delivered_units counts units,
    deliveries every use of them (the same without reuse)."""
    delivered = (
        Delivery.objects.filter(consumer=consumer)
        .values_list("dataset_id")
        .annotate(n=Count("id", filter=Q(use_index=0)), uses=Count("id"))
        .order_by()
    )
    for dataset_id, n, uses in delivered:
        datasets[dataset_id]["delivered_units"] = n
        datasets[dataset_id]["deliveries"] = uses


def _skip_counts(consumer: Consumer) -> list[tuple]:
    """The units dropped for the consumer, grouped by dataset, version, reason and the policy
    version they were dropped under, with whether each was served since: one grouped count."""
    served = Delivery.objects.filter(
        consumer=consumer,
        dataset_id=OuterRef("dataset_version__dataset_id"),
        kind=OuterRef("kind"),
        key=OuterRef("key"),
    )
    return list(
        Skip.objects.filter(consumer=consumer)
        .annotate(served=Exists(served))
        .values_list(
            "dataset_version__dataset_id",
            "dataset_version_id",
            "dataset_version__version",
            "reason",
            "policy_version",
            "served",
        )
        .annotate(n=Count("id"), steps=Coalesce(Sum("steps"), 0))
        .order_by()
    )


def _tally_skips(
    skips: list[tuple],
    datasets: dict[int, dict[str, Any]],
    catalogue: dict[int, Dataset],
    now_current: int | None,
    fresh_filter: dict[int, bool],
) -> dict[int, int]:
    """The drops into each dataset's progress (by reason, and the stale ones by the policy
    version they were made under); returns the drops per dataset that still hold under its
    current version."""
    current_skips: dict[int, int] = {}
    for dataset_id, version_id, version, reason, at, was_served, n, steps in skips:
        e = datasets[dataset_id]
        label = Skip.Reason(reason).label
        e["dropped"][label] += n
        e["dropped_steps"][label] += steps
        ds = catalogue.get(dataset_id)
        holds = _holds(reason, at, now_current, max_staleness=fresh_filter.get(dataset_id, False))
        if version_id == (ds.current_id if ds else None) and holds and not was_served:
            current_skips[dataset_id] = current_skips.get(dataset_id, 0) + n
        if reason == Skip.Reason.STALE:
            row = e["stale_drops"].setdefault(
                (version, at),
                {
                    "dataset_version": version,
                    "current_policy_version": at,
                    "units": 0,
                    "steps": 0,
                    "held": 0,
                    "deliverable_again": 0,
                    "served_since": 0,
                },
            )
            row["units"] += n
            row["steps"] += steps
            row["served_since" if was_served else "held" if holds else "deliverable_again"] += n
    return current_skips


def _pending_units(
    consumer: Consumer,
    dataset_id: int,
    ds: Dataset | None,
    *,
    skipped: bool,
    now_current: int | None,
    fresh_filter: bool,
) -> tuple[str, int]:
    """What a pull of this dataset could still offer this consumer: the units its current
    version admits now (groups and lone trajectories, or steps for a steps-unit dataset),
    less those delivered to it and those dropped for it for good. (unit, count)"""
    unit, admitted = _admitted_units(ds)
    gone = set(
        Delivery.objects.filter(consumer=consumer, dataset_id=dataset_id, use_index=0).values_list(
            "kind", "key"
        )
    )
    if ds is not None and skipped:
        gone |= {
            (kind, key)
            for kind, key, reason, at in Skip.objects.filter(
                consumer=consumer, dataset_version_id=ds.current_id
            ).values_list("kind", "key", "reason", "policy_version")
            if _holds(reason, at, now_current, max_staleness=fresh_filter)
        }
    return unit, sum(1 for k in admitted if _delivery_key(unit, k) not in gone)


def _admitted_units(dataset: Dataset | None) -> tuple[str, list[int]]:
    """("groups", unit keys: a group's id or minus a lone trajectory's) or ("steps", step
    ids) of what the dataset's current version admits now."""
    if dataset is None or dataset.current is None:
        return "groups", []
    spec = spec_parse(dataset.current.spec)
    c = spec_compile(spec)
    if not spec.grouping.keep_groups_whole:
        return "steps", list(dataset_steps(c).values_list("id", flat=True))
    return "groups", list(units_admitted(c))


def _delivery_key(unit: str, key: int) -> tuple[int, int]:
    if unit == "steps":
        return (Delivery.Kind.STEP, key)
    return (Delivery.Kind.GROUP, key) if key > 0 else (Delivery.Kind.TRAJECTORY, -key)


def _holds(reason: int, at: int | None, current: int | None, *, max_staleness: bool) -> bool:
    """services.consume.skip_holds for one Skip row: is the drop still in force?"""
    depends = reason == Skip.Reason.STALE or (max_staleness and reason == Skip.Reason.FILTERED)
    return not depends or at is None or (current is not None and at <= current)


def snapshots_recent(limit: int = SNAPSHOTS_SHOWN) -> list[Snapshot]:
    """The newest snapshots (snapshot_created index) with their dataset version."""
    return list(
        Snapshot.objects.select_related("dataset_version__dataset")
        .defer("step_ids", "masked_ids", "manifest")
        .order_by("-created_at")[:limit]
    )


def consumers_health() -> list[dict[str, Any]]:
    """Every consumer with its leases by status, the steps it acked and its lag (time since
    its last pull). Consumers are few (one per trainer); one query."""
    now = timezone.now()
    rows = (
        Consumer.objects.annotate(
            n_open=Count("leases", filter=Q(leases__status=Lease.Status.LEASED)),
            n_acked=Count("leases", filter=Q(leases__status=Lease.Status.ACKED)),
            n_lost=Count(
                "leases", filter=Q(leases__status__in=[Lease.Status.EXPIRED, Lease.Status.RELEASED])
            ),
            steps_acked=Sum("leases__n_steps", filter=Q(leases__status=Lease.Status.ACKED)),
            last_pull=Max("leases__created_at"),
        )
        .order_by("name", "source__name")
        .select_related("source")
    )
    return [
        {
            "name": c.name,
            # Names are per source: two sources' "trainer" are two rows, told apart by this.
            "source": c.source.name if c.source is not None else None,
            "open": c.n_open,
            "acked": c.n_acked,
            "lost": c.n_lost,
            "steps_acked": c.steps_acked or 0,
            "last_pull": c.last_pull,
            "lag_seconds": (now - c.last_pull).total_seconds() if c.last_pull else None,
        }
        for c in rows
    ]


def leases_recent(limit: int = LEASES_SHOWN) -> list[Lease]:
    """The newest leases (lease_created index), without their bodies."""
    return list(
        Lease.objects.select_related("consumer", "dataset_version__dataset")
        .defer("body")
        .order_by("-created_at")[:limit]
    )


def lease_body(lease_id: uuid.UUID, *, owner: int | None = None) -> tuple[bytes, datetime | None] | None:
    """A lease's response exactly as first served (the replay) and when its batch was
    dropped (None: it is whole; else the body holds the manifest and ``"batch": null``,
    retention.leases_trim), or None (also when ``owner``, a source id, is given and the
    lease's consumer is not that source's)."""
    found = Lease.objects.filter(id=lease_id)
    if owner is not None:
        found = found.filter(consumer__source_id=owner)
    row = found.values_list("body", "batch_dropped_at").first()
    return (bytes(row[0]), row[1]) if row is not None else None


def snapshot_get(snapshot_id: uuid.UUID | str, *, sources: Sources = None) -> Snapshot | None:
    """A snapshot with its dataset version and dataset, without its step id lists, or None;
    also None for a reader restricted to ``sources`` (pool/tenancy.py) unless the snapshot
    is done and holds rows of those sources only (Snapshot.source_ids: a row without a
    source is nobody's, so only an unrestricted reader reads a snapshot holding one). A
    snapshot holding no row at all is nobody's data: any reader reads it. One query; the
    ids are compared here because "a JSON list within a set" has no portable lookup."""
    snap = (
        Snapshot.objects.select_related("dataset_version__dataset")
        .defer("step_ids", "masked_ids")
        .filter(id=snapshot_id)
        .first()
    )
    if snap is None or sources is None:
        return snap
    return snap if snap.source_ids is not None and set(snap.source_ids) <= sources else None
