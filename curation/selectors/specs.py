"""What a dataset admits: a spec compiled to step predicates, its preview, its admitted
steps and units.

A spec (curation/specs.py) compiles to two step predicates:

* the **scope**: channel, sources, time range, and (for "ready" datasets) membership:
  only steps of completed trajectories are served;
* the **pass** test: readiness bits, freshness, reward, quality flags, labels, tags,
  token source, feedback.

With ``keep_groups_whole`` the unit of admission is the prompt group (a trajectory without
a group is its own unit). A rollout is *valid* when every one of its steps passes. A group
is *eligible* when it is complete (stored) or, with the dataset's own n (min_rollouts), has
n valid rollouts. An eligible group with at least n valid rollouts is admitted whole, its
invalid rollouts masked; a short one is dropped, or admitted with its bad rollouts masked
(``short_groups: mask``, needs one valid rollout). Without ``keep_groups_whole`` the unit
is the step: every step that passes and whose group is complete.

Everything is evaluated in the database, in one statement per question: the preview at
200k steps is one aggregate over the step table (bench/curation.py measures it).

The dataset catalogue (datasets and their versions) is read here too.

Tenancy (pool/tenancy.py): a preview takes the reader's ``sources`` and counts only the
steps of its sources' trajectories, whatever the spec's ``sources`` filter names (None:
every source's). A reader restricted to some sources sees the datasets whose every version
names only its sources in ``filters.sources`` (a dataset without that filter names none):
the catalogue does not tell another source's name, nor its numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
from django.conf import settings
from django.core.exceptions import EmptyResultSet
from django.db import connection, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import (
    BigIntegerField,
    Case,
    Count,
    Exists,
    F,
    IntegerField,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce

from pool.flags import QUALITY_NAMES, READY, Readiness
from pool.lookups import Many, array_param
from pool.models import Feedback, PromptGroup, Source, Step, Trajectory
from pool.replica import read_connection
from pool.selectors.counters import counters_read
from pool.selectors.policy import policy_current_version
from pool.tenancy import Sources
from pool.tenancy import q as of_sources

from ..models import Dataset, DatasetVersion, StepTag
from ..specs import Filters, Spec

_LABEL_VALUE = {"none": "", "accepted": "accepted", "rejected": "rejected", "quarantined": "quarantined"}


@dataclass(frozen=True, slots=True)
class Compiled:
    """A spec compiled against the current version of its policy (filters.policy)."""

    spec: Spec
    scope: Q  # every scope condition, as step lookups
    step_scope: Q  # the conditions on the step's own columns
    trajectory_status: str | None  # the conditions on its trajectory (joined after aggregation)
    trajectory_channel: str | None
    passes: Q
    current_version: int | None
    needs_alias: bool  # passes refers to the aliases set by ``_aliased``


def spec_compile(spec: Spec, sources: Sources = None) -> Compiled:
    """``spec`` compiled; ``sources``: only the steps of those sources' trajectories (a
    restricted reader's preview; None: every source's)."""
    f = spec.filters
    current = policy_current_version(f.policy)  # the freshness of the dataset's policy
    step_scope = of_sources("trajectory__source_id", sources)
    if f.sources is not None:
        step_scope &= Q(source__name__in=f.sources)
    if f.created_after is not None:
        step_scope &= Q(created_at__gte=f.created_after)
    if f.created_before is not None:
        step_scope &= Q(created_at__lt=f.created_before)
    status = Trajectory.Status.COMPLETED if f.readiness == "ready" else None
    scope = step_scope
    if f.channel is not None:
        scope &= Q(trajectory__channel=f.channel)
    if status is not None:
        scope &= Q(trajectory__status=status)
    return Compiled(spec, scope, step_scope, status, f.channel, _passes(spec, current), current, True)


def _passes(spec: Spec, current: int | None) -> Q:
    f = spec.filters
    q = Q()
    if f.readiness == "ready":
        mask = READY
        if f.allow_retokenized:
            mask &= ~int(Readiness.TOKENS_EXACT)
        if spec.grouping.keep_groups_whole:
            mask &= ~int(Readiness.GROUP_COMPLETE)  # decided per group, with the dataset's n
        # Every readiness value holding the mask's bits (an IN list the step_ready index serves).
        q &= Q(readiness__in=[v for v in range(READY + 1) if v & mask == mask])
    if f.max_staleness is not None and current is not None:
        q &= Q(policy_version_id__gte=current - f.max_staleness)
    # The effective reward (pool/services/effective_reward.py): one column, no join.
    if f.reward_status is not None:
        final = Q(_reward_final=int(Readiness.REWARD_FINAL))
        q &= final if f.reward_status == "final" else ~final
    if f.reward_min is not None:
        q &= Q(effective_reward__gte=f.reward_min)
    if f.reward_max is not None:
        q &= Q(effective_reward__lte=f.reward_max)
    exclude = sum(QUALITY_NAMES[n] for n in set(f.exclude_flags))
    if exclude:
        q &= Q(_flags_excluded=0)
    require = sum(QUALITY_NAMES[n] for n in set(f.require_flags))
    if require:
        q &= Q(_flags_required=require)
    if f.labels is not None:
        q &= Q(label__in=[_LABEL_VALUE[n] for n in f.labels])
    if f.exclude_labels:
        q &= ~Q(label__in=[_LABEL_VALUE[n] for n in f.exclude_labels])
    if f.tags is not None:
        q &= Q(Exists(StepTag.objects.filter(step_id=OuterRef("pk"), tag__in=f.tags)))
    if f.exclude_tags:
        q &= ~Q(Exists(StepTag.objects.filter(step_id=OuterRef("pk"), tag__in=f.exclude_tags)))
    if f.token_sources is not None:
        q &= Q(token_source__in=f.token_sources)
    if f.feedback is not None or f.min_rating is not None:
        about = Q(step_id=OuterRef("pk")) | Q(trajectory_id=OuterRef("trajectory_id"))
        if f.feedback == "with":
            q &= Q(Exists(Feedback.objects.filter(about)))
        elif f.feedback == "without":
            q &= ~Q(Exists(Feedback.objects.filter(about)))
        if f.min_rating is not None:
            q &= Q(Exists(Feedback.objects.filter(about, rating__gte=f.min_rating)))
    return q


def _aliased(qs: QuerySet, f: Filters) -> QuerySet:
    """The computed columns the pass test compares (aliases: never selected or grouped)."""
    aliases: dict[str, Any] = {}
    if f.reward_status is not None:
        aliases["_reward_final"] = F("readiness").bitand(int(Readiness.REWARD_FINAL))
    if f.exclude_flags:
        aliases["_flags_excluded"] = F("quality_flags").bitand(
            sum(QUALITY_NAMES[n] for n in set(f.exclude_flags))
        )
    if f.require_flags:
        aliases["_flags_required"] = F("quality_flags").bitand(
            sum(QUALITY_NAMES[n] for n in set(f.require_flags))
        )
    return qs.alias(**aliases) if aliases else qs


def dataset_step_rows(c: Compiled) -> QuerySet:
    """Steps in the spec's scope, with the aliases its pass test needs."""
    return _aliased(Step.objects.filter(c.scope), c.spec.filters)


def dataset_steps(c: Compiled) -> QuerySet:
    """The steps a step-unit dataset admits (keep_groups_whole false): those that pass and
    whose group is complete."""
    qs = dataset_step_rows(c).filter(c.passes)
    if c.spec.filters.readiness == "ready" and c.spec.grouping.keep_groups_whole is False:
        qs = qs.alias(_group_bit=F("readiness").bitand(int(Readiness.GROUP_COMPLETE))).filter(
            _group_bit=int(Readiness.GROUP_COMPLETE)
        )
    return qs


def _per_rollout_sql(
    c: Compiled,
    trajectory_ids: list[int] | None = None,
    *,
    fresh_from: int | None = None,
    as_array: bool = False,
) -> tuple[str, list[Any]]:
    """One row per trajectory in scope: (trajectory id, group id, valid 0/1, steps, prompt
    tokens, sequence tokens), as SQL to wrap; with ``fresh_from``, also ``mv``: the lowest
    policy version of its steps that is at least that (null: none is).

    The steps are aggregated per trajectory on their own columns first (on PostgreSQL an
    index-only scan of step_traj_index_uniq, in trajectory order), and the trajectory's own
    conditions are joined after, on one row per trajectory instead of one per step.
    ``as_array``: ``trajectory_ids`` bound as one array (PostgreSQL), for thousands of them
    (a preview's sample)."""
    ok = Min(Case(When(c.passes, then=Value(1)), default=Value(0), output_field=IntegerField()))
    more_cols = {}
    if fresh_from is not None:
        more_cols["mv"] = Min(
            Case(
                When(policy_version_id__gte=fresh_from, then=F("policy_version_id")),
                output_field=BigIntegerField(),
            )
        )
    per_rollout = (
        _aliased(
            Step.objects.filter(c.step_scope & _of_trajectories(trajectory_ids, as_array=as_array)),
            c.spec.filters,
        )
        .values(tid=F("trajectory_id"))
        .annotate(ok=ok, n=Count("id"), pt=Sum("prompt_len"), st=Sum("seq_len"), **more_cols)
        .order_by()
    )
    try:
        inner, params = per_rollout.query.sql_with_params()
    except EmptyResultSet:
        # A filter that can match nothing (an empty ``__in`` list, e.g. "sources": []): Django
        # refuses to write its SQL. The same columns, no rows.
        inner, params = "SELECT 0 AS tid, 0 AS ok, 0 AS n, 0 AS pt, 0 AS st, 0 AS mv WHERE 1 = 0", []
    where, more = [], []
    if c.trajectory_status is not None:
        where.append("t.status = %s")
        more.append(c.trajectory_status)
    if c.trajectory_channel is not None:
        where.append("t.channel = %s")
        more.append(c.trajectory_channel)
    if trajectory_ids is not None and as_array:
        where.append("t.id = ANY(%s)" if trajectory_ids else "1 = 0")
        more.extend([array_param(trajectory_ids)] if trajectory_ids else [])
    elif trajectory_ids is not None:
        # The trajectories named on their side of the join too: PostgreSQL then reads them
        # by primary key instead of hashing a scan of the whole trajectory table (which it
        # chose for a pull's 256 trajectories once the pool held 1M steps: bench/growth.py).
        where.append(f"t.id IN ({', '.join(['%s'] * len(trajectory_ids))})" if trajectory_ids else "1 = 0")
        more.extend(trajectory_ids)
    table = connection.ops.quote_name(Trajectory._meta.db_table)
    mv = ", r.mv AS mv" if fresh_from is not None else ""
    sql = (
        f"SELECT r.tid AS tid, t.group_id AS gid, r.ok AS ok, r.n AS n, r.pt AS pt, r.st AS st{mv} "
        f"FROM ({inner}) r INNER JOIN {table} t ON t.id = r.tid"
        + (f" WHERE {' AND '.join(where)}" if where else "")
    )
    return sql, [*params, *more]


def _of_trajectories(trajectory_ids: list[int] | None, *, as_array: bool = False) -> Q:
    if trajectory_ids is None:
        return Q()
    return Q(trajectory_id__any=Many(trajectory_ids)) if as_array else Q(trajectory_id__in=trajectory_ids)


@contextmanager
def _analytic() -> Iterator[BaseDatabaseWrapper]:
    """One aggregate over the step table, on the connection it reads from (the replica on a
    read path that reads it: pool/replica.py): on PostgreSQL without JIT (its compile time,
    ~90 ms, exceeds what it saves here) and with room to sort in memory."""
    conn = read_connection()
    with transaction.atomic(using=conn.alias):
        if conn.vendor == "postgresql":
            with conn.cursor() as cur:
                cur.execute("SET LOCAL jit = off")
                cur.execute("SET LOCAL work_mem = '64MB'")
        yield conn


def _units_sql(
    c: Compiled,
    trajectory_ids: list[int] | None = None,
    *,
    rollouts: str | None = None,
    fresh_from: int | None = None,
    as_array: bool = False,
) -> tuple[str, list[Any]]:
    """One row per unit (group, or trajectory without one) with its admission:
    (unit key, group id, admitted 0/1, eligible 0/1, valid rollouts, rollouts, steps,
    valid steps, prompt tokens, sequence tokens). Unit keys: a group's id, or minus the
    trajectory id of a rollout without a group. ``rollouts``: the name of a relation holding
    ``_per_rollout_sql``'s rows already (a CTE), instead of that query. ``fresh_from``: also
    ``mv``, the lowest of its rollouts' (``_per_rollout_sql``)."""
    inner, params = (
        (rollouts, [])
        if rollouts is not None
        else _per_rollout_sql(c, trajectory_ids, fresh_from=fresh_from, as_array=as_array)
    )
    source = inner if rollouts is not None else f"({inner})"
    g = c.spec.grouping
    group_table = connection.ops.quote_name(PromptGroup._meta.db_table)
    # Integers validated by the spec parser, inlined (no NULL parameters to type).
    n = (
        f"COALESCE({g.min_rollouts}, MAX(g.expected_rollouts), 1)"
        if g.min_rollouts
        else "COALESCE(MAX(g.expected_rollouts), 1)"
    )
    if c.spec.filters.readiness == "ready":
        own_n = f"WHEN SUM(u.ok) >= {g.min_rollouts} THEN 1 " if g.min_rollouts else ""
        eligible = (
            f"(CASE WHEN MAX(u.gid) IS NULL THEN 1 WHEN MAX(g.status) = 'complete' THEN 1 {own_n}ELSE 0 END)"
        )
    else:
        eligible = "1"
    enough = f"SUM(u.ok) >= {n}" + (" OR SUM(u.ok) >= 1" if g.short_groups == "mask" else "")
    unit = "CASE WHEN u.gid IS NULL THEN -u.tid ELSE u.gid END"
    # The inner query's columns: tid, gid, ok, n, pt, st.
    sql = f"""
        SELECT
            {unit} AS unit,
            MAX(u.gid) AS gid,
            CASE WHEN {eligible} = 1
                  AND ((MAX(u.gid) IS NULL AND MIN(u.ok) = 1)
                       OR (MAX(u.gid) IS NOT NULL AND ({enough})))
                 THEN 1 ELSE 0 END AS admitted,
            {eligible} AS eligible,
            SUM(u.ok) AS valid, COUNT(*) AS rollouts, SUM(u.n) AS steps, SUM(u.ok * u.n) AS valid_steps,
            SUM(u.pt) AS pt, SUM(u.st) AS st{", MIN(u.mv) AS mv" if fresh_from is not None else ""}
        FROM {source} u LEFT JOIN {group_table} g ON g.id = u.gid
        GROUP BY {unit}
    """
    return sql, params


def dataset_preview(spec: Spec, sources: Sources = None, *, estimate: bool = False) -> dict[str, Any]:
    """Counts and token statistics of what ``spec`` admits now (one statement), of the steps
    of ``sources``' trajectories only (a restricted reader's; None: every source's). The
    restriction is part of the scope, so a group counts its reader's rollouts only.

    Counted exactly, that is an aggregate over every step in scope: 2 s at 3M steps
    (bench/growth.py). ``estimate`` (the builder's live preview of an unsaved spec): on a
    pool of more than twice CLAW_PREVIEW_SAMPLE_UNITS groups or trajectories, the numbers are
    estimated from a sample of about that many units instead (``_sampled_preview``), at a
    cost that does not grow with the pool; the answer's ``estimate`` says how (None: exact).
    A reader restricted to some sources counts exactly: the estimate's fractions would tell
    it the size of the whole pool.
    A saved dataset is counted exactly and kept (curation/services/counts.py)."""
    c = spec_compile(spec, sources)
    if estimate and sources is None:  # a sample's fractions would tell a restricted reader the pool's size
        sampled = _sampled_preview(c)
        if sampled is not None:
            return sampled
    return _exact_preview(c)


def _exact_preview(c: Compiled) -> dict[str, Any]:
    spec = c.spec
    if not spec.grouping.keep_groups_whole:
        agg = dataset_steps(c).aggregate(
            steps=Count("id"),
            trajectories=Count("trajectory_id", distinct=True),
            pt=Coalesce(Sum("prompt_len"), 0),
            st=Coalesce(Sum("seq_len"), 0),
        )
        return preview_numbers(
            c.current_version,
            agg["steps"],
            0,
            agg["trajectories"],
            None,
            0,
            0,
            agg["pt"],
            agg["st"] - agg["pt"],
        )
    units, params = _units_sql(c)
    query = f"""
        SELECT
            COALESCE(SUM(admitted * steps), 0),
            COALESCE(SUM(admitted * (steps - valid_steps)), 0),
            COALESCE(SUM(admitted * rollouts), 0),
            COALESCE(SUM(CASE WHEN admitted = 1 AND gid IS NOT NULL THEN 1 ELSE 0 END), 0),
            COALESCE(SUM(CASE WHEN admitted = 0 AND eligible = 1 AND gid IS NOT NULL THEN 1 ELSE 0 END), 0),
            COALESCE(SUM(CASE WHEN eligible = 0 THEN 1 ELSE 0 END), 0),
            COALESCE(SUM(admitted * pt), 0),
            COALESCE(SUM(admitted * (st - pt)), 0)
        FROM ({units}) x
    """
    with _analytic() as conn, conn.cursor() as cur:
        cur.execute(query, params)
        steps, masked, rollouts, groups, dropped, waiting, pt, rt = cur.fetchone()
    return preview_numbers(
        c.current_version,
        int(steps),
        int(masked),
        int(rollouts),
        int(groups),
        int(dropped),
        int(waiting),
        int(pt),
        int(rt),
    )


# A preview's figures in preview_numbers' order: what each unit adds (units_shares), what
# a saved dataset's count keeps (curation/services/counts.py), what a sample estimates.
SHARES = (
    "steps",
    "masked_steps",
    "trajectories",
    "groups",
    "dropped_groups",
    "waiting_units",
    "prompt_tokens",
    "response_tokens",
)
# A sampled preview is trusted only when its sample admits at least this many units; with
# fewer (a filter admitting a sliver of the pool) the preview is counted exactly.
MIN_SAMPLED_UNITS = 30
# TABLESAMPLE SYSTEM reads whole pages: flat in the table's size, but over a table of a few
# pages too coarse a draw; below this many pages BERNOULLI draws rows (reading the table).
SYSTEM_SAMPLE_PAGES = 1000
SAMPLE_SEED = 1  # REPEATABLE: the same spec over an unchanged pool reads the same sample
# A sample reads its units' steps by trajectory (an index lookup each), about three times
# the exact count's cost per step (bench.growth at 100k steps: 194 ms for every group's
# rollouts by id, 65 ms counted exactly): it is drawn only where it reads at most this share
# of the pool's rollouts.
MAX_SAMPLE_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class _Stratum:
    """Units drawn from one kind: ``n`` drawn of ``size`` (equal when read whole)."""

    n: int
    size: int

    def estimate(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The totals of the columns of ``y`` (one row per drawn unit that has any; the
        other drawn units count zero), and their variances: the expansion of the sample's
        mean (N * mean: the sample's size fluctuates with the pages drawn, its mean does
        not), and N^2 (1 - n/N) s^2 / n."""
        cols = y.shape[1]
        if self.n == 0:
            return np.zeros(cols), np.zeros(cols)
        mean = y.sum(axis=0) / self.n
        if self.n == self.size:
            return y.sum(axis=0).astype(float), np.zeros(cols)
        s2 = ((y * y).sum(axis=0) - self.n * mean * mean) / max(self.n - 1, 1)
        return self.size * mean, np.maximum(self.size**2 * (1 - self.n / self.size) * s2 / self.n, 0)


@dataclass(frozen=True, slots=True)
class _Sample:
    """The trajectories of a sample of units: every rollout of each group drawn, and the
    trajectories without a group among those drawn from all trajectories."""

    grouped: list[tuple[int, int]]  # (trajectory id, group id)
    lone: list[int]
    groups: _Stratum  # groups drawn of all groups
    trajectories: _Stratum  # trajectories drawn of all (a grouped one is a lone unit of zero)

    @property
    def ids(self) -> list[int]:
        return [t for t, _g in self.grouped] + self.lone


def _sample(conn: BaseDatabaseWrapper, want: int) -> _Sample | None:
    """A sample of about ``want`` groups, and of trajectories (about ``want``, those without a
    group being units of their own), on PostgreSQL; None where counting exactly costs less:
    neither table holds more than ``2 * want`` rows (a bounded count, whatever the planner's
    statistics say), or the sample would read more than MAX_SAMPLE_SHARE of the pool's
    rollouts. A table no larger is read whole. The sizes the sample expands to are the pool's
    counters (pool/selectors/counters.py: exact, and read in a few rows)."""
    q = connection.ops.quote_name
    group, traj = q(PromptGroup._meta.db_table), q(Trajectory._meta.db_table)
    cap = 2 * want
    with conn.cursor() as cur:
        cur.execute(
            f"""SELECT (SELECT count(*) FROM (SELECT 1 FROM {group} LIMIT %s) a),
                       (SELECT count(*) FROM (SELECT 1 FROM {traj} LIMIT %s) b),
                       c.relname, c.reltuples, c.relpages
                FROM pg_class c WHERE c.oid IN (%s::regclass, %s::regclass)""",
            [cap + 1, cap + 1, PromptGroup._meta.db_table, Trajectory._meta.db_table],
        )
        rows = cur.fetchall()
        counted = {PromptGroup._meta.db_table: rows[0][0], Trajectory._meta.db_table: rows[0][1]}
        draw: dict[str, tuple[float, str]] = {}  # table -> (fraction, its TABLESAMPLE clause)
        for name, reltuples, relpages in ((r[2], r[3], r[4]) for r in rows):
            if counted[name] <= cap:
                draw[name] = (1.0, "")
                continue
            p = want / max(float(reltuples), float(counted[name]))
            method = "SYSTEM" if relpages >= SYSTEM_SAMPLE_PAGES else "BERNOULLI"
            draw[name] = (p, f"TABLESAMPLE {method} ({100.0 * p!r}) REPEATABLE ({SAMPLE_SEED})")
        (p_group, groups_from), (p_traj, traj_from) = (
            draw[PromptGroup._meta.db_table],
            draw[Trajectory._meta.db_table],
        )
        if p_group == 1.0 and p_traj == 1.0:
            return None
        cur.execute(f"SELECT id, group_id FROM {traj} {traj_from}")
        drawn = cur.fetchall()
        lone = [t for t, g in drawn if g is None]
        # The share of the pool's rollouts the sample would read (the exact count reads them
        # all, faster per step: one index-only scan); not worth it above MAX_SAMPLE_SHARE.
        grouped_share = 1 - len(lone) / len(drawn) if drawn else 0.0
        if p_group * grouped_share + p_traj * (1 - grouped_share) > MAX_SAMPLE_SHARE:
            return None
        # Each drawn group's rollouts by the group index (the lateral's OFFSET 0 keeps it a
        # lookup per group: joined plainly, PostgreSQL hashed a scan of every trajectory, a
        # cost growing with the pool: 25 ms of a 400k-step pool's preview).
        cur.execute(
            f"SELECT g.id, t.id FROM (SELECT id FROM {group} {groups_from}) g "
            f"LEFT JOIN LATERAL (SELECT id FROM {traj} t WHERE t.group_id = g.id OFFSET 0) t ON true"
        )
        members = cur.fetchall()
    n_groups = len({g for g, _t in members})
    sizes = counters_read(["groups", "trajectories"])
    return _Sample(
        grouped=[(t, g) for g, t in members if t is not None],
        lone=lone,
        groups=_Stratum(n_groups, n_groups if p_group == 1.0 else max(sizes["groups"], n_groups)),
        trajectories=_Stratum(
            len(drawn), len(drawn) if p_traj == 1.0 else max(sizes["trajectories"], len(drawn))
        ),
    )


def _sampled_preview(c: Compiled) -> dict[str, Any] | None:
    """``dataset_preview``'s numbers estimated from a sample of units (``_sample``), or None
    where it counts exactly (a small pool, SQLite, or a sample admitting fewer than
    MIN_SAMPLED_UNITS units). Two strata, groups and trajectories without a group, each
    expanded from its sample's mean to its size; ``estimate.margins`` gives each figure's 95%
    margin from the sample's own variance (units taken as drawn independently: a page-sampled
    table draws neighbours together, so the true spread can be wider)."""
    with _analytic() as conn:
        if conn.vendor != "postgresql":
            return None
        with conn.cursor() as cur:
            # Its reads are index lookups of the units drawn: a parallel plan ran each of its
            # workers through every lookup of the step index and scanned the trajectory table
            # (bench.growth at 1M steps: 98 ms against 51 ms serial).
            cur.execute("SET LOCAL max_parallel_workers_per_gather = 0")
        sample = _sample(conn, settings.CLAW_PREVIEW_SAMPLE_UNITS)
        if sample is None or sample.groups.n + len(sample.lone) < MIN_SAMPLED_UNITS:
            return None
        whole = c.spec.grouping.keep_groups_whole
        if whole:  # each unit's share (a group's key is its id, a lone trajectory's minus its)
            shares = units_shares(c, sample.ids, conn=conn, as_array=True)
            rows = [(unit if unit > 0 else None, share) for unit, (share, _mv) in shares.items()]
        else:
            per_rollout = (
                dataset_steps(c)
                .filter(trajectory_id__any=Many(sample.ids))
                .values("trajectory_id", "trajectory__group_id")
                .annotate(n=Count("id"), pt=Sum("prompt_len"), st=Sum("seq_len"))
                .order_by()
            )
            by_unit: dict[tuple[int | None, int], list[int]] = {}
            for _tid, gid, n, pt, st in per_rollout.using(conn.alias).values_list(
                "trajectory_id", "trajectory__group_id", "n", "pt", "st"
            ):
                key = (gid, gid) if gid is not None else (None, _tid)
                acc = by_unit.setdefault(key, [0, 0, 0, 0, 0, 0, 0, 0])
                for i, v in ((0, n), (2, 1), (6, pt), (7, st - pt)):
                    acc[i] += v
            rows = [(gid, tuple(acc)) for (gid, _k), acc in by_unit.items()]
    admitted = sum(1 for _gid, y in rows if y[0] > 0)
    if admitted < MIN_SAMPLED_UNITS:
        return None
    totals, variances = np.zeros(len(SHARES)), np.zeros(len(SHARES))
    for stratum, of in ((sample.groups, True), (sample.trajectories, False)):
        y = np.array([f for gid, f in rows if (gid is not None) is of], dtype=float).reshape(-1, len(SHARES))
        t, v = stratum.estimate(y)
        totals += t
        variances += v
    numbers = {k: round(float(t)) for k, t in zip(SHARES, totals, strict=True)}
    margins = {k: round(1.96 * float(v) ** 0.5) for k, v in zip(SHARES, variances, strict=True)}
    if not whole:
        numbers["groups"] = None  # a step-unit dataset counts no groups
        del margins["groups"]
    return preview_numbers(
        c.current_version,
        *numbers.values(),  # type: ignore[arg-type]
        estimate={
            "units_sampled": sample.groups.n + len(sample.lone),
            "group_fraction": round(sample.groups.n / sample.groups.size, 6) if sample.groups.size else 1.0,
            "trajectory_fraction": round(sample.trajectories.n / sample.trajectories.size, 6)
            if sample.trajectories.size
            else 1.0,
            "margins": margins,
        },
    )


def units_shares(
    c: Compiled,
    trajectory_ids: list[int] | None = None,
    *,
    conn: BaseDatabaseWrapper | None = None,
    as_array: bool = False,
) -> dict[int, tuple[tuple[int, ...], int | None]]:
    """Each unit's share of ``dataset_preview``'s numbers, for the units of these
    trajectories (a caller names whole units; None: every unit in scope): unit key ->
    ((steps, masked steps, trajectories, groups, dropped groups, waiting units, prompt
    tokens, response tokens), the lowest policy version at or above the freshness bound of
    its steps: None without one, or without a bound). The numbers add up to the preview's:
    curation/services/counts.py keeps them per saved dataset, a sampled preview estimates
    from them. ``conn``: the connection to read on (default: the analytic one for every unit,
    the primary for named ones); ``as_array``: as ``_per_rollout_sql``'s."""
    s, current = c.spec.filters.max_staleness, c.current_version
    fresh_from = current - s if s is not None and current is not None else None
    units, params = _units_sql(c, trajectory_ids, fresh_from=fresh_from, as_array=as_array)
    if conn is not None:
        reading = nullcontext(conn)
    else:
        reading = _analytic() if trajectory_ids is None else nullcontext(connection)
    with reading as conn, conn.cursor() as cur:
        cur.execute(units, params)
        rows = cur.fetchall()
    out: dict[int, tuple[tuple[int, ...], int | None]] = {}
    for row in rows:
        unit, gid, admitted, eligible, _valid, rollouts, steps, valid_steps, pt, st = row[:10]
        a = int(admitted)
        grouped = gid is not None
        out[int(unit)] = (
            (
                a * int(steps),
                a * (int(steps) - int(valid_steps)),
                a * int(rollouts),
                int(a == 1 and grouped),
                int(a == 0 and eligible == 1 and grouped),
                int(eligible == 0),
                a * int(pt),
                a * (int(st) - int(pt)),
            ),
            int(row[10]) if fresh_from is not None and row[10] is not None else None,
        )
    return out


def preview_numbers(
    current_version: int | None,
    steps: int,
    masked: int,
    rollouts: int,
    groups: int | None,
    dropped: int,
    waiting: int,
    pt: int,
    rt: int,
    *,
    estimate: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "steps": steps,
        "masked_steps": masked,
        "trajectories": rollouts,
        "groups": groups,
        "dropped_groups": dropped,
        "waiting_units": waiting,
        "prompt_tokens": pt,
        "response_tokens": rt,
        "mean_prompt_tokens": pt / steps if steps else 0.0,
        "mean_response_tokens": rt / steps if steps else 0.0,
        "current_policy_version": current_version,
        "estimate": estimate,
    }


def dataset_admitted(spec: Spec, *, sources: Sources = None) -> dict[int, bool]:
    """Every admitted step id and whether it is masked (False: train on it); of ``sources``'
    trajectories only (a restricted reader's; None: every source's). For tests, pages,
    snapshots and version diffs; consumption asks about a few candidate units
    (``units_admitted``)."""
    c = spec_compile(spec, sources)
    if not spec.grouping.keep_groups_whole:
        return dict.fromkeys(dataset_steps(c).values_list("id", flat=True), False)
    out: dict[int, bool] = {}
    for steps in units_admitted(c).values():
        out.update(steps)
    return out


def units_admitted(c: Compiled, trajectory_ids: list[int] | None = None) -> dict[int, dict[int, bool]]:
    """The admitted units among the steps of ``trajectory_ids`` (all when None; a caller
    names whole units: every rollout of a candidate group): unit key (a group's id, or minus
    a lone trajectory's id) -> {step id: masked}, in step order.

    One statement: the rollouts in scope (``_per_rollout_sql``, as a CTE read twice), their
    units' admission (``_units_sql``) and the steps of the admitted units' rollouts, a
    rollout masked unless every one of its steps passes. Named trajectories are read by
    primary key on both sides of the join (a pull's candidates: index step_traj_index_uniq); the
    whole dataset (snapshots, pages) runs without JIT, with room to sort, on the connection
    it reads from (``_analytic``: the replica on a read path that reads it)."""
    rollouts, params = _per_rollout_sql(c, trajectory_ids)
    units, _ = _units_sql(c, rollouts="r")
    steps, step_params = (
        Step.objects.filter(c.step_scope & _of_trajectories(trajectory_ids)).values_list(
            "id", "trajectory_id", "step_index"
        )
    ).query.sql_with_params()
    sql = f"""
        WITH r AS ({rollouts}), x AS ({units})
        SELECT s.id, r.tid, r.gid, r.ok
        FROM r JOIN x ON x.unit = CASE WHEN r.gid IS NULL THEN -r.tid ELSE r.gid END
        JOIN ({steps}) s ON s.trajectory_id = r.tid
        WHERE x.admitted = 1
        ORDER BY r.tid, s.step_index
    """
    with _analytic() if trajectory_ids is None else nullcontext(connection) as conn, conn.cursor() as cur:
        cur.execute(sql, [*params, *step_params])
        rows = cur.fetchall()
    out: dict[int, dict[int, bool]] = {}
    for sid, tid, gid, ok in rows:
        out.setdefault(gid if gid is not None else -tid, {})[sid] = ok != 1
    return out


def datasets_list(limit: int | None = None, *, sources: Sources = None) -> list[Dataset]:
    """Every dataset (the first ``limit`` by name) with its current version (one query), or
    (``sources``) those a reader restricted to them may see (module docstring; two more)."""
    qs = Dataset.objects.select_related("current").order_by("name")
    if sources is not None:
        qs = qs.exclude(id__in=_datasets_naming_others(sources))
    return list(qs[:limit])


def dataset_get(name: str, *, sources: Sources = None) -> Dataset | None:
    """The dataset ``name`` with its current version, or None (also when a reader restricted
    to ``sources`` may not see it: module docstring)."""
    qs = Dataset.objects.select_related("current").filter(name=name)
    if sources is not None:
        qs = qs.exclude(id__in=_datasets_naming_others(sources))
    return qs.first()


def _datasets_naming_others(sources: frozenset[int]) -> list[int]:
    """The datasets with a version whose ``filters.sources`` names a source outside
    ``sources``. The names are checked here, not in SQL: "a JSON list within a set" has no
    portable lookup (``contained_by`` is PostgreSQL's), and datasets are few (a trainer's
    catalogue: tens of versions), each version's list read once."""
    names = set(Source.objects.filter(id__in=sorted(sources)).values_list("name", flat=True))
    named = DatasetVersion.objects.values_list("dataset_id", "spec__filters__sources")
    # A stored spec is normalised (curation/specs.py): its sources are a list of names or null.
    return sorted({ds for ds, listed in named if listed is not None and not set(listed) <= names})


def dataset_versions(name: str) -> tuple[Dataset, list[DatasetVersion]] | None:
    """A dataset and its versions, newest first, or None."""
    dataset = dataset_get(name)
    if dataset is None:
        return None
    return dataset, list(dataset.versions.order_by("-version"))


def datasets_with_current() -> list[Dataset]:
    return list(Dataset.objects.select_related("current").filter(current__isnull=False).order_by("name"))
