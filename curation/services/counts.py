"""Counts kept per saved dataset: what a dataset's current version admits, as the pool
changes, so that its preview costs what changed since it was last read instead of a scan of
every step in its scope (bench.growth: that scan took 1.5 s at 3M steps, 40x its 100k time).

A dataset whose spec admits ready steps in whole groups (the default, and what trainers pull)
has one ``DatasetCount`` for its current version. The count is the sum of its units' shares
(``DatasetCountUnit``: a group, or a trajectory without one), each computed by the very
query of the live preview (curation/selectors/specs.py ``_units_sql``) restricted to that
unit's rollouts, so a kept count and a live one cannot disagree by construction, only by
what was not yet folded.

What changes a unit says so in its own transaction: every pool event that touches what a
spec reads (a trajectory ending, a group completing or becoming ready, rewards, labels,
feedback, tags, quality flags, a group's expected rollouts, a purge) is an effect here
(``units_changed``) that writes one ``DatasetCountChange`` row per count and unit. Appending a
step to a running trajectory writes none: a "ready" spec counts only completed rollouts, so
a unit enters a count through its trajectory's end. A new current policy version moves the
freshness bound (``filters.max_staleness``): each unit keeps the policy version from which a
step of it that passes stops passing (``recount_at``), so only those units are counted again.

``dataset_count_read`` folds what changed (the change rows it can take, the units past their
``recount_at``) into the totals and returns them; the periodic sweep folds too, creates the
counts of new current versions and drops those of older ones. A count that is not built yet,
a spec of another kind, or a reader restricted to some sources get the live preview.

Race with a count being created: a write that looked for counts before the new one existed
writes no change row for it. On PostgreSQL the effect's one statement is an INSERT into the
change table whether or not a count exists (its table lock held to the writer's commit), and
the creation locks that table in SHARE mode, which waits for those writers: the first full
count, after the creation's commit, sees their rows. On SQLite writes are serial. Change rows
have no unique key, so writers marking the same unit never wait for each other.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connection, connections, models, transaction
from django.db.models import BigIntegerField, Case, Count, F, Max, Min, Q, Sum, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from pool import bus, sql
from pool.models import Feedback, Step, Trajectory
from pool.replica import read_connection
from pool.selectors.policy import policy_current_version_query
from pool.tenancy import Sources

from ..models import (
    Dataset,
    DatasetCount,
    DatasetCountChange,
    DatasetCountSource,
    DatasetCountUnit,
    DatasetVersion,
)
from ..selectors.specs import SHARES, Compiled, dataset_preview, preview_numbers, spec_compile, units_shares
from ..specs import Spec, spec_parse

UNITS_PER_STATEMENT = 200  # units counted again per statement (their rollouts by id)


def counted(spec: Spec) -> bool:
    """Whether a dataset of this spec keeps counts: ready steps, whole groups."""
    return spec.filters.readiness == "ready" and spec.grouping.keep_groups_whole


# --- the changes ---------------------------------------------------------------------------------
def units_changed(
    *, units: Iterable[int] = (), trajectory_ids: Iterable[int] = (), step_ids: Iterable[int] = ()
) -> None:
    """Mark units changed for every count: ``units`` by key, and the units of these
    trajectories and steps. One statement on PostgreSQL, whether or not counts exist."""
    units, tids, sids = sorted(set(units)), sorted(set(trajectory_ids)), sorted(set(step_ids))
    if not (units or tids or sids):
        return
    if connection.vendor == "postgresql":
        sql.unit_marks_insert(
            DatasetCountChange, DatasetCount, units=units, trajectory_ids=tids, step_ids=sids
        )
        return
    counts = list(DatasetCount.objects.values_list("id", flat=True))
    if not counts:
        return
    keys = set(units)
    if tids:
        found = Trajectory.objects.filter(id__in=tids).values_list("id", "group_id")
        keys.update(g if g is not None else -t for t, g in found)
    if sids:
        found = Step.objects.filter(id__in=sids).values_list("trajectory_id", "trajectory__group_id")
        keys.update(g if g is not None else -t for t, g in found)
    DatasetCountChange.objects.bulk_create(
        [DatasetCountChange(count_id=c, unit=u) for c in counts for u in keys]
    )


# The pool's events, each as the units it changed (registered in curation/apps.py). Inside a
# step write's own follow-up (``bus.within(StepsWritten)``: its rewards, readiness, group
# completion, trajectory ends), the write's effect marks every unit those touch (the units of
# the trajectories it ends or that had ended) in one statement, so those events mark nothing.
def trajectories_ended(event: bus.TrajectoriesEnded) -> None:
    if not bus.within(bus.StepsWritten):
        units_changed(units=[t.group_id if t.group_id is not None else -t.id for t in event.trajectories])


def groups_completed(event: bus.GroupsCompleted) -> None:
    if not bus.within(bus.StepsWritten):
        units_changed(units=event.group_ids)


def groups_ready(event: bus.GroupsReady) -> None:
    if not bus.within(bus.StepsWritten):
        units_changed(units=event.group_ids)


def rewards_set(event: bus.RewardsSet) -> None:
    if not bus.within(bus.StepsWritten):
        units_changed(trajectory_ids=event.trajectory_ids)


def labels_set(event: bus.LabelsSet) -> None:
    units_changed(step_ids=event.step_ids)


def feedback_recorded(event: bus.FeedbackRecorded) -> None:
    about = Feedback.objects.filter(id=event.feedback_id).values_list("step_id", "trajectory_id").first()
    if about is not None:
        units_changed(step_ids=[s for s in about[:1] if s], trajectory_ids=[t for t in about[1:] if t])


def units_changed_event(event: bus.UnitsChanged) -> None:
    units_changed(units=event.group_ids, trajectory_ids=event.trajectory_ids, step_ids=event.step_ids)


def steps_written(event: bus.StepsWritten) -> None:
    """The units of the trajectories this write ends (a last step) or that had ended (late
    steps): what its rewards, readiness and group completion touched. A step appended to a
    running trajectory marks nothing (it counts from its trajectory's end)."""
    ending = {s.trajectory_id for s in event.steps if s.is_last}
    units = [
        t.group_id if t.group_id is not None else -t.id
        for t in event.trajectories.values()
        if t.ended or t.id in ending
    ]
    if units:
        units_changed(units=units)


# --- the counts ----------------------------------------------------------------------------------
def dataset_counts_sweep() -> int:
    """Periodic: a count for each dataset's current version that keeps one (built here),
    none for any other version, and every count folded. Idempotent. Returns the counts."""
    DatasetCount.objects.exclude(version__in=Dataset.objects.values("current")).delete()
    n = 0
    for version in DatasetVersion.objects.filter(id__in=Dataset.objects.values("current")).order_by("id"):
        if not counted(spec_parse(version.spec)):
            continue
        count = dataset_count_start(version)
        dataset_count_fold(count)
        n += 1
    return n


def dataset_count_build(version_id: int) -> None:
    """The count of this version, created and built (folded, if built), when it is its
    dataset's current version and of a kind that keeps one; else nothing."""
    version = DatasetVersion.objects.filter(id=version_id, dataset__current_id=version_id).first()
    if version is None:
        return
    DatasetCount.objects.filter(version__dataset_id=version.dataset_id).exclude(version=version).delete()
    if counted(spec_parse(version.spec)):
        dataset_count_fold(dataset_count_start(version))


def dataset_count_start(version: DatasetVersion) -> DatasetCount:
    """This version's count, created (not yet built) when it has none. Its creation waits
    for the writes in flight that looked for counts before it existed (module docstring)."""
    found = DatasetCount.objects.filter(version=version).first()
    if found is not None:
        return found
    with transaction.atomic():
        if connection.vendor == "postgresql":
            # Waits for every writer that has marked changes (the INSERT holds ROW EXCLUSIVE
            # on the table to its commit, rows or none) and holds new ones back until this
            # count exists.
            sql.table_lock(DatasetCountChange, "SHARE")
        count, _ = DatasetCount.objects.get_or_create(version=version)
    return count


def dataset_version_preview(version: DatasetVersion, sources: Sources = None) -> dict[str, Any]:
    """What a saved version admits now: from its kept count when it keeps one
    (``dataset_count_read``; for a reader restricted to some sources, ``_restricted_read``:
    the shares of their units), else counted live (``dataset_preview``: a restricted reader
    counts only their sources' steps)."""
    kept = dataset_count_read(version) if sources is None else _restricted_read(version, sources)
    return kept if kept is not None else dataset_preview(spec_parse(version.spec), sources)


def dataset_count_read(version: DatasetVersion) -> dict[str, Any] | None:
    """The preview of ``version`` from its kept count, with what changed folded in first;
    None when it keeps none yet (or its spec is of a kind that keeps none): the caller
    counts live. One statement when nothing changed (``_kept``: the count, the current
    policy version, whether a change waits), on the replica of a read path that has one
    (its lag is the page's); a fold writes, on the primary."""
    folded = _folded(version)
    if folded is None:
        return None
    count, current, _alias = folded
    return preview_numbers(current, *(getattr(count, name) for name in SHARES))


# A restricted reader's units of several sources are counted live, by their rollouts' ids, up
# to this many; beyond, its whole preview is counted live (one aggregate beats that many ids).
MAX_LIVE_UNITS = 2000


def _restricted_read(version: DatasetVersion, sources: frozenset[int]) -> dict[str, Any] | None:
    """The preview of ``version`` for a reader of ``sources`` from its kept count (folded
    first): the shares of the units whose every rollout is of one of them (a unit of one
    source is all or nothing to a reader: the restriction only narrows the rollouts a unit
    counts), plus the units of several sources counted live in the reader's scope. None when
    it keeps no count, or more than MAX_LIVE_UNITS units must be counted live: the caller
    counts live. The sums read a row per source (``DatasetCountSource``), and the units of
    several sources by a partial index, whatever the pool's size."""
    folded = _folded(version)
    if folded is None:
        return None
    count, current, alias = folded
    if not sources:
        return preview_numbers(current, *([0] * len(SHARES)))
    kept = (
        DatasetCountSource.objects.using(alias)
        .filter(count_id=count.id, source_id__in=sources)
        .aggregate(**{name: Coalesce(Sum(name), 0) for name in SHARES})
    )
    totals = [int(kept[name]) for name in SHARES]
    several = list(
        DatasetCountUnit.objects.using(alias)
        .filter(count_id=count.id, one_source=False)
        .values_list("unit", flat=True)[: MAX_LIVE_UNITS + 1]
    )
    if len(several) > MAX_LIVE_UNITS:
        return None
    if several:
        # On the connection that read the kept sums: one view of the pool (a replica's lag).
        c = spec_compile(spec_parse(version.spec), sources)
        tids = list(Trajectory.objects.using(alias).filter(_of_units(several)).values_list("id", flat=True))
        for share, _mv in (units_shares(c, tids, conn=connections[alias]) if tids else {}).values():
            totals = [a + b for a, b in zip(totals, share, strict=True)]
    return preview_numbers(current, *totals)


def _folded(version: DatasetVersion) -> tuple[DatasetCount, int | None, str] | None:
    """``version``'s count with what changed folded in, the current policy version, and the
    alias that read it (the read path's when nothing was folded, else the primary's); None
    when it keeps none yet, or its spec is of a kind that keeps none."""
    spec = spec_parse(version.spec)
    if not counted(spec):
        return None
    kept = _kept(version.id, spec.filters.policy)
    if kept is None:
        return None
    count, current, changed = kept
    s = spec.filters.max_staleness
    if not count.built or (s is not None and count.policy_version != current) or changed:
        count = dataset_count_fold(count)
        if not count.built:
            return None
        return count, current, connection.alias
    return count, current, read_connection().alias


def _kept(version_id: int, policy: str) -> tuple[DatasetCount, int | None, bool] | None:
    """The count of this version (None: it has none), the current version of ``policy``
    (``policy_current_version``'s own query, as a subquery) and whether a change waits to
    be folded, read by one statement on the read path's connection. Three ORM queries cost
    ~1.3 ms of Python and round trips here (bench.growth's preview figure was that)."""
    sql, params = _kept_sql(policy)
    with read_connection().cursor() as cur:
        cur.execute(sql, [*params, version_id])
        row = cur.fetchone()
    if row is None:
        return None
    count_id, built, policy_version, *shares, current, changed = row
    count = DatasetCount(
        id=count_id,
        version_id=version_id,
        built=bool(built),
        policy_version=policy_version,
        **dict(zip(SHARES, shares, strict=True)),
    )
    return count, current, bool(changed)


@functools.lru_cache(maxsize=64)
def _kept_sql(policy: str) -> tuple[str, tuple]:
    """``_kept``'s statement for ``policy`` and the parameters before the version's id,
    compiled once per policy name."""
    q = connection.ops.quote_name

    def col(model: type[models.Model], name: str) -> str:
        return q(model._meta.get_field(name).column)

    current, params = policy_current_version_query(policy).query.sql_with_params()
    change, count = (q(m._meta.db_table) for m in (DatasetCountChange, DatasetCount))
    shares = ", ".join(f"c.{col(DatasetCount, name)}" for name in SHARES)
    count_id = f"c.{col(DatasetCount, 'id')}"
    sql = (
        f"SELECT {count_id}, c.{col(DatasetCount, 'built')}, c.{col(DatasetCount, 'policy_version')}, "
        f"{shares}, ({current}), "
        f"EXISTS (SELECT 1 FROM {change} ch WHERE ch.{col(DatasetCountChange, 'count')} = {count_id}) "
        f"FROM {count} c WHERE c.{col(DatasetCount, 'version')} = %s"
    )
    return sql, tuple(params)


def dataset_count_fold(count: DatasetCount) -> DatasetCount:
    """Fold what changed into ``count`` (built whole the first time, and again when the
    current policy version went back or appeared); returns it as it stands. A fold already
    under way elsewhere is waited for (then what it left is folded): a read after a write
    always counts it. Skipping it returned the totals from before that fold, so a preview
    read just after every step was ready could miss some of them. The lock is FOR NO KEY
    UPDATE: a write marking a unit meanwhile (its change row's foreign key takes FOR KEY
    SHARE on the count) goes on; FOR UPDATE made every such write wait for the fold."""
    with transaction.atomic():
        row = DatasetCount.objects.select_for_update(no_key=True).filter(id=count.id).first()
        if row is None:
            return DatasetCount.objects.filter(id=count.id).first() or count
        spec = spec_parse(DatasetVersion.objects.get(id=row.version_id).spec)
        c = spec_compile(spec)
        s = spec.filters.max_staleness
        current = c.current_version
        whole = not row.built or (
            s is not None
            and row.policy_version != current
            and (current is None or row.policy_version is None or current < row.policy_version)
        )
        if whole:
            DatasetCountChange.objects.filter(count=row).delete()
            DatasetCountUnit.objects.filter(count=row).delete()
            _recount(row, c, None)
            row.built = True
        else:
            units = _changes_take(row)
            if s is not None and current is not None and current != row.policy_version:
                units |= set(
                    DatasetCountUnit.objects.filter(count=row, recount_at__lte=current).values_list(
                        "unit", flat=True
                    )
                )
            ordered = sorted(units)
            for i in range(0, len(ordered), UNITS_PER_STATEMENT):
                _recount(row, c, ordered[i : i + UNITS_PER_STATEMENT])
        row.policy_version = current if s is not None else None
        row.counted_at = timezone.now()
        row.save()
        return row


def _changes_take(count: DatasetCount) -> set[int]:
    """The units marked changed for ``count`` (committed marks), their rows removed."""
    return set(sql.rows_take(DatasetCountChange, "count_id", count.id, "unit"))


def _of_units(units: Iterable[int]) -> Q:
    """The trajectories of these units (a group's key is its id, a lone trajectory's minus its)."""
    units = list(units)
    return Q(group_id__in=[u for u in units if u > 0]) | Q(
        id__in=[-u for u in units if u < 0], group__isnull=True
    )


MIXED = (None, False)  # a unit of several sources, as _unit_sources says it


def _unit_sources(rollouts: models.QuerySet) -> dict[int, tuple[int | None, bool]]:
    """Each unit of these trajectories: (its rollouts' one source, True), None for rollouts
    without one; (None, False) for a unit of several. One aggregate, every status: a rollout
    of another source that is still running makes its unit one of several already (where
    it does not count yet, that costs a restricted reader a live count of the unit, never a
    wrong one)."""
    unit = Case(
        When(group_id__isnull=True, then=F("id") * -1), default=F("group_id"), output_field=BigIntegerField()
    )
    rows = (
        rollouts.annotate(u=unit)
        .values("u")
        .annotate(lo=Min("source_id"), hi=Max("source_id"), n=Count("id"), with_source=Count("source_id"))
        .values_list("u", "lo", "hi", "n", "with_source")
        .order_by()
    )
    return {u: (lo, True) if (lo == hi and k == n) or k == 0 else MIXED for u, lo, hi, n, k in rows}


def _recount(count: DatasetCount, c: Compiled, units: Sequence[int] | None) -> None:
    """Count ``units`` again (None: every unit in scope), replacing their shares and moving
    the totals, and those of their sources (``DatasetCountSource``), by the difference."""
    if units is None:
        tids = None
        old: dict[int, tuple[int | None, tuple]] = {}  # unit -> (its one source, its share)
        sources = _unit_sources(Trajectory.objects.all())
    else:
        rollouts = Trajectory.objects.filter(_of_units(units))
        tids = list(rollouts.values_list("id", flat=True))
        sources = _unit_sources(rollouts)
        old = {
            r[0]: (r[1] if r[2] else None, r[3:])
            for r in DatasetCountUnit.objects.filter(count=count, unit__in=units).values_list(
                "unit", "source_id", "one_source", *SHARES
            )
        }
        DatasetCountUnit.objects.filter(count=count, unit__in=units).delete()
    shares = units_shares(c, tids) if tids is None or tids else {}
    s = c.spec.filters.max_staleness
    DatasetCountUnit.objects.bulk_create(
        [
            DatasetCountUnit(
                count=count,
                unit=unit,
                recount_at=(mv + s + 1) if (s is not None and mv is not None) else None,
                source_id=src,
                one_source=one,
                **dict(zip(SHARES, share, strict=True)),
            )
            for unit, (share, mv) in shares.items()
            for src, one in (sources.get(unit, MIXED),)
        ],
        batch_size=2000,
    )
    # The differences: the totals' (every unit), and each source's (its units of one source).
    delta = [0] * len(SHARES)
    by_source: dict[int, list[int]] = {}
    moves = [(share, 1, sources.get(unit, MIXED)) for unit, (share, _mv) in shares.items()]
    moves += [(share, -1, (src, src is not None)) for src, share in old.values()]
    for share, sign, (src, one) in moves:
        at = by_source.setdefault(src, [0] * len(SHARES)) if one and src is not None else None
        for i, v in enumerate(share):
            delta[i] += sign * v
            if at is not None:
                at[i] += sign * v
    if units is None:
        for name, v in zip(SHARES, delta, strict=True):
            setattr(count, name, v)
        DatasetCountSource.objects.filter(count=count).delete()
        DatasetCountSource.objects.bulk_create(
            [
                DatasetCountSource(count=count, source_id=src, **dict(zip(SHARES, d, strict=True)))
                for src, d in by_source.items()
            ]
        )
        return
    if any(delta):
        DatasetCount.objects.filter(id=count.id).update(
            **{name: F(name) + v for name, v in zip(SHARES, delta, strict=True) if v}
        )
        count.refresh_from_db(fields=SHARES)
    # Under the fold's lock of the count (dataset_count_fold): no other writer of its rows.
    for src, d in by_source.items():
        if not any(d):
            continue
        moved = DatasetCountSource.objects.filter(count=count, source_id=src).update(
            **{name: F(name) + v for name, v in zip(SHARES, d, strict=True) if v}
        )
        if not moved:
            DatasetCountSource.objects.create(count=count, source_id=src, **dict(zip(SHARES, d, strict=True)))
