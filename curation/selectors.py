"""Reads of curation: what a dataset spec admits, and its preview.

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
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.core.exceptions import EmptyResultSet
from django.db import connection, transaction
from django.db.models import (
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
from django.utils import timezone

from pool.flags import QUALITY_NAMES, READINESS_NAMES, READY, READY_ANY_TOKENS, Readiness
from pool.flags import names as flag_names
from pool.models import Feedback, PolicyVersion, PromptGroup, RewardEvent, Step, Trajectory
from pool.selectors import steps_render

from .models import (
    Consumer,
    Dataset,
    DatasetVersion,
    Delivery,
    LabelEvent,
    Lease,
    ReviewClaim,
    ReviewQueue,
    Skip,
    StepTag,
)
from .specs import Filters, Spec, spec_parse

_LABEL_VALUE = {"none": "", "accepted": "accepted", "rejected": "rejected", "quarantined": "quarantined"}


@dataclass(frozen=True, slots=True)
class Compiled:
    """A spec compiled against the pool's current policy version."""

    spec: Spec
    scope: Q  # every scope condition, as step lookups
    step_scope: Q  # the conditions on the step's own columns
    trajectory_status: str | None  # the conditions on its trajectory (joined after aggregation)
    trajectory_channel: str | None
    passes: Q
    current_version: int | None
    needs_alias: bool  # passes refers to the aliases set by ``_aliased``


def spec_compile(spec: Spec) -> Compiled:
    f = spec.filters
    current = PolicyVersion.objects.filter(is_current=True).values_list("version", flat=True).first()
    step_scope = Q()
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


def _per_rollout_sql(c: Compiled, restrict: Q | None = None) -> tuple[str, list[Any]]:
    """One row per trajectory in scope: (trajectory id, group id, valid 0/1, steps, prompt
    tokens, sequence tokens), as SQL to wrap.

    The steps are aggregated per trajectory on their own columns first (on PostgreSQL an
    index-only scan of step_curation, in trajectory order), and the trajectory's own
    conditions are joined after, on one row per trajectory instead of one per step."""
    ok = Min(Case(When(c.passes, then=Value(1)), default=Value(0), output_field=IntegerField()))
    per_rollout = (
        _aliased(Step.objects.filter(c.step_scope & (restrict or Q())), c.spec.filters)
        .values(tid=F("trajectory_id"))
        .annotate(ok=ok, n=Count("id"), pt=Sum("prompt_len"), st=Sum("seq_len"))
        .order_by()
    )
    try:
        inner, params = per_rollout.query.sql_with_params()
    except EmptyResultSet:
        # A filter that can match nothing (an empty ``__in`` list, e.g. "sources": []): Django
        # refuses to write its SQL. The same columns, no rows.
        inner, params = "SELECT 0 AS tid, 0 AS ok, 0 AS n, 0 AS pt, 0 AS st WHERE 1 = 0", []
    where, more = [], []
    if c.trajectory_status is not None:
        where.append("t.status = %s")
        more.append(c.trajectory_status)
    if c.trajectory_channel is not None:
        where.append("t.channel = %s")
        more.append(c.trajectory_channel)
    table = connection.ops.quote_name(Trajectory._meta.db_table)
    sql = (
        f"SELECT r.tid AS tid, t.group_id AS gid, r.ok AS ok, r.n AS n, r.pt AS pt, r.st AS st "
        f"FROM ({inner}) r INNER JOIN {table} t ON t.id = r.tid"
        + (f" WHERE {' AND '.join(where)}" if where else "")
    )
    return sql, [*params, *more]


@contextmanager
def _analytic() -> Iterator[None]:
    """One aggregate over the step table: on PostgreSQL without JIT (its compile time, ~90
    ms, exceeds what it saves here) and with room to sort in memory."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cur:
                cur.execute("SET LOCAL jit = off")
                cur.execute("SET LOCAL work_mem = '64MB'")
        yield


def _units_sql(c: Compiled, restrict: Q | None = None) -> tuple[str, list[Any]]:
    """One row per unit (group, or trajectory without one) with its admission:
    (unit key, group id, admitted 0/1, eligible 0/1, valid rollouts, rollouts, steps,
    valid steps, prompt tokens, sequence tokens). Unit keys: a group's id, or minus the
    trajectory id of a rollout without a group."""
    inner, params = _per_rollout_sql(c, restrict)
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
            SUM(u.pt) AS pt, SUM(u.st) AS st
        FROM ({inner}) u LEFT JOIN {group_table} g ON g.id = u.gid
        GROUP BY {unit}
    """
    return sql, params


def dataset_preview(spec: Spec) -> dict[str, Any]:
    """Counts and token statistics of what ``spec`` admits now (one statement)."""
    c = spec_compile(spec)
    if not spec.grouping.keep_groups_whole:
        agg = dataset_steps(c).aggregate(
            steps=Count("id"),
            trajectories=Count("trajectory_id", distinct=True),
            pt=Coalesce(Sum("prompt_len"), 0),
            st=Coalesce(Sum("seq_len"), 0),
        )
        return _preview(c, agg["steps"], 0, agg["trajectories"], None, 0, 0, agg["pt"], agg["st"] - agg["pt"])
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
    with _analytic(), connection.cursor() as cur:
        cur.execute(query, params)
        steps, masked, rollouts, groups, dropped, waiting, pt, rt = cur.fetchone()
    return _preview(
        c, int(steps), int(masked), int(rollouts), int(groups), int(dropped), int(waiting), int(pt), int(rt)
    )


def _preview(
    c: Compiled,
    steps: int,
    masked: int,
    rollouts: int,
    groups: int | None,
    dropped: int,
    waiting: int,
    pt: int,
    rt: int,
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
        "current_policy_version": c.current_version,
    }


def dataset_admitted(spec: Spec) -> dict[int, bool]:
    """Every admitted step id and whether it is masked (False: train on it). For tests,
    pages and snapshots; consumption asks about a few candidate units (``units_admitted``)."""
    c = spec_compile(spec)
    if not spec.grouping.keep_groups_whole:
        return dict.fromkeys(dataset_steps(c).values_list("id", flat=True), False)
    out: dict[int, bool] = {}
    for steps in units_admitted(c).values():
        out.update(steps)
    return out


def units_admitted(c: Compiled, restrict: Q | None = None) -> dict[int, dict[int, bool]]:
    """The admitted units among the steps ``restrict`` selects (all when None): unit key
    (a group's id, or minus a lone trajectory's id) -> {step id: masked}, in step order."""
    units, params = _units_sql(c, restrict)
    with _analytic(), connection.cursor() as cur:
        cur.execute(f"SELECT unit FROM ({units}) x WHERE admitted = 1", params)
        admitted = {row[0] for row in cur.fetchall()}
    groups = [u for u in admitted if u > 0]
    lone = [-u for u in admitted if u < 0]
    if not admitted:
        return {}
    rollouts = dataset_step_rows(c).filter(Q(trajectory__group_id__in=groups) | Q(trajectory_id__in=lone))
    valid = {
        tid
        for tid, ok in rollouts.values("trajectory_id")
        .annotate(ok=Min(Case(When(c.passes, then=Value(1)), default=Value(0), output_field=IntegerField())))
        .order_by()
        .values_list("trajectory_id", "ok")
        if ok == 1
    }
    out: dict[int, dict[int, bool]] = {}
    for sid, tid, gid in rollouts.order_by("trajectory_id", "step_index").values_list(
        "id", "trajectory_id", "trajectory__group_id"
    ):
        out.setdefault(gid if gid is not None else -tid, {})[sid] = tid not in valid
    return out


# --- review queues ---------------------------------------------------------------------------
def review_scope(queue: ReviewQueue) -> QuerySet:
    """The trajectories a queue reviews, done or not: completed ones, and (default queue)
    those without feedback, or (other queues) those with a step its dataset or filters
    admit at step level."""
    base = Trajectory.objects.filter(status=Trajectory.Status.COMPLETED)
    if queue.is_default:
        return base
    if queue.dataset_id is not None and queue.dataset.current_id is not None:
        spec = spec_parse(queue.dataset.current.spec)
    else:
        spec = spec_parse({"filters": queue.filters or {}})
    c = spec_compile(spec)
    steps = dataset_step_rows(c).filter(c.passes, trajectory_id=OuterRef("pk"))
    return base.filter(Exists(steps))


def _has_feedback() -> Q:
    return Q(Exists(Feedback.objects.filter(trajectory_id=OuterRef("pk")))) | Q(
        Exists(Feedback.objects.filter(step__trajectory_id=OuterRef("pk")))
    )


def review_candidates(queue: ReviewQueue, *, now: datetime) -> QuerySet:
    """Items nobody holds and nobody finished, oldest completion first."""
    held_or_done = ReviewClaim.objects.filter(queue=queue, trajectory_id=OuterRef("pk")).filter(
        Q(done_at__isnull=False) | Q(expires_at__gt=now)
    )
    qs = review_scope(queue).filter(~Exists(held_or_done))
    if queue.is_default:
        qs = qs.filter(~_has_feedback())
    return qs.order_by("completed_at", "id")


def review_progress(queue: ReviewQueue) -> dict[str, int]:
    """{"done", "total", "held"}: for the progress bar."""
    scope = review_scope(queue)
    if queue.is_default:
        total = scope.count()
        done = scope.filter(_has_feedback()).count()
    else:
        total = scope.count()
        done = ReviewClaim.objects.filter(queue=queue, done_at__isnull=False).count()
    held = ReviewClaim.objects.filter(
        queue=queue, done_at__isnull=True, expires_at__gt=timezone.now()
    ).count()
    return {"done": done, "total": total, "held": held}


# --- pages ------------------------------------------------------------------------------------
# Rows per page of the trajectory browser (keyset on id: one bounded query per page).
TRAJECTORY_PAGE = 50


def keyset_page(qs: QuerySet, *, before: int | None, limit: int) -> tuple[list[Any], int | None]:
    """One page of ``qs`` (ordered by -id) below id ``before``: the rows and the id to pass
    as ``before`` for the next page, or None on the last. One query (limit + 1 rows), by
    primary key whatever the page's depth."""
    if before is not None:
        qs = qs.filter(id__lt=before)
    rows = list(qs[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (rows[-1].id if more else None)


def trajectories_browse(
    *,
    status: str = "",
    channel: str = "",
    source: str = "",
    group: str = "",
    has_ready: bool = False,
    before: int | None = None,
    limit: int | None = None,
) -> tuple[list[Trajectory], int | None]:
    """One page of trajectories, newest first, and the ``before`` cursor of the next page
    (None on the last). One query: source and group are joined, never fetched per row."""
    limit = limit or TRAJECTORY_PAGE
    qs = Trajectory.objects.select_related("source", "group").order_by("-id")
    if status:
        qs = qs.filter(status=status)
    if channel:
        qs = qs.filter(channel=channel)
    if source:
        qs = qs.filter(source__name=source)
    if group:
        qs = qs.filter(group__uid=group)
    if has_ready:
        # The step_ready partial index holds exactly these readiness values.
        ready = Step.objects.filter(trajectory_id=OuterRef("pk"), readiness__in=[READY, READY_ANY_TOKENS])
        qs = qs.filter(Exists(ready))
    return keyset_page(qs, before=before, limit=limit)


@dataclass(slots=True)
class StepView:
    """A step as the trajectory and review pages show it."""

    step: Step
    messages: list[dict[str, str]]
    response_text: str | None
    readiness: list[str]
    quality: list[str]
    tags: list[str]
    label_events: list[Any]
    reward_events: list[Any]
    feedback: list[Feedback]


BRANCH_DX, BRANCH_DY, BRANCH_PAD = 44, 34, 18


def branches_layout(steps: Sequence[Step]) -> dict[str, Any] | None:
    """The trajectory's branches drawn as lanes (one per branch, steps left to right in
    step order), each branch's first step joined to the step it branched from
    (gateway/proxy/branches.py: compactions, sub-agents, retries). None for a trajectory of
    one branch. Pure: reads the steps' branch and parent_step_id only."""
    if not steps or all(s.branch == 0 and s.parent_step_id is None for s in steps):
        return None
    lanes = sorted({s.branch for s in steps})
    lane_of = {b: i for i, b in enumerate(lanes)}
    at: dict[int, tuple[int, int]] = {}
    nodes = []
    for col, s in enumerate(steps):  # steps come in step_index order
        x, y = BRANCH_PAD + col * BRANCH_DX, BRANCH_PAD + lane_of[s.branch] * BRANCH_DY
        at[s.id] = (x, y)
        nodes.append({"x": x, "y": y, "index": s.step_index, "branch": s.branch, "uid": s.uid})
    index_of: dict[int | None, int] = {s.id: s.step_index for s in steps}
    edges = []
    last: dict[int, tuple[int, int]] = {}
    info: dict[int, dict[str, Any]] = {}
    for s in steps:
        here = at[s.id]
        if s.branch in last:
            edges.append(
                {
                    "x1": last[s.branch][0],
                    "y1": last[s.branch][1],
                    "x2": here[0],
                    "y2": here[1],
                    "fork": False,
                }
            )
        else:
            parent = at.get(s.parent_step_id) if s.parent_step_id is not None else None
            if parent is not None:
                edges.append({"x1": parent[0], "y1": parent[1], "x2": here[0], "y2": here[1], "fork": True})
            info[s.branch] = {
                "branch": s.branch,
                "first": s.step_index,
                "steps": 0,
                "from": index_of.get(s.parent_step_id),
            }
        info[s.branch]["steps"] += 1
        last[s.branch] = here
    return {
        "width": 2 * BRANCH_PAD + (len(steps) - 1) * BRANCH_DX,
        "height": 2 * BRANCH_PAD + (len(lanes) - 1) * BRANCH_DY,
        "nodes": nodes,
        "edges": edges,
        "branches": [info[b] for b in lanes],
    }


def trajectory_timeline(uid: str | None = None, *, trajectory_id: int | None = None) -> dict[str, Any] | None:
    """A trajectory (by uid or id) with every step's text, flags, labels, rewards and
    feedback, or None.
    Six queries whatever the step count (no per-step reads); token ids stay in the
    database (step_token_ids loads one step's on demand)."""
    key = {"uid": uid} if uid is not None else {"id": trajectory_id}
    traj = Trajectory.objects.select_related("source", "group").filter(**key).first()
    if traj is None:
        return None
    steps = list(
        Step.objects.filter(trajectory=traj)
        .defer("seq_delta", "rollout_logprobs", "seq_hash", "content_hash", "response_hash")
        .order_by("step_index")
    )
    ids = [s.id for s in steps]
    tags: dict[int, list[str]] = {i: [] for i in ids}
    for sid, tag in StepTag.objects.filter(step_id__in=ids).order_by("tag").values_list("step_id", "tag"):
        tags[sid].append(tag)
    labels: dict[int, list[Any]] = {i: [] for i in ids}
    for ev in LabelEvent.objects.filter(step_id__in=ids).order_by("-created_at", "-id"):
        labels[ev.step_id].append(ev)
    rewards: dict[int | None, list[Any]] = {i: [] for i in ids} | {None: []}
    for ev in RewardEvent.objects.filter(Q(step_id__in=ids) | Q(trajectory=traj)).order_by(
        "-created_at", "-id"
    ):
        rewards[ev.step_id if ev.step_id in labels else None].append(ev)
    feedback: dict[int | None, list[Feedback]] = {i: [] for i in ids} | {None: []}
    for fb in Feedback.objects.filter(Q(step_id__in=ids) | Q(trajectory=traj)).order_by("-created_at", "-id"):
        feedback[fb.step_id if fb.step_id in labels else None].append(fb)
    views = [
        StepView(
            step=s,
            messages=_messages_text(s.messages),
            response_text=s.response_text,
            readiness=flag_names(s.readiness, READINESS_NAMES),
            quality=flag_names(s.quality_flags, QUALITY_NAMES),
            tags=tags[s.id],
            label_events=labels[s.id],
            reward_events=rewards[s.id],
            feedback=feedback[s.id],
        )
        for s in steps
    ]
    return {
        "trajectory": traj,
        "steps": views,
        "branches": branches_layout(steps),
        "reward_events": rewards[None],
        "feedback": feedback[None],
    }


def _messages_text(messages: Any) -> list[dict[str, str]]:
    """Chat messages as (role, text) pairs; content parts that are not text are shown as
    JSON, so nothing is hidden."""
    if not isinstance(messages, list):
        return []
    out = []
    for m in messages:
        if isinstance(m, dict):
            content = m.get("content")
            text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
            out.append({"role": str(m.get("role", "")), "text": text})
        else:
            out.append({"role": "", "text": json.dumps(m, ensure_ascii=False)})
    return out


def step_token_ids(step_id: int) -> dict[str, Any] | None:
    """One step's exact token ids (rebuilt by steps_render), as plain lists, or None."""
    step = Step.objects.select_related("trajectory__group").filter(id=step_id).first()
    if step is None:
        return None
    r = steps_render([step])[0]
    return {
        "uid": r["uid"],
        "token_source": r["token_source"],
        "drift_offset": r["drift_offset"],
        "prompt_ids": r["prompt_ids"].tolist(),
        "response_ids": r["response_ids"].tolist(),
    }


def datasets_list() -> list[Dataset]:
    """Every dataset with its current version (one query)."""
    return list(Dataset.objects.select_related("current").order_by("name"))


def dataset_versions(name: str) -> tuple[Dataset, list[DatasetVersion]] | None:
    """A dataset and its versions, newest first, or None."""
    dataset = Dataset.objects.select_related("current").filter(name=name).first()
    if dataset is None:
        return None
    return dataset, list(dataset.versions.order_by("-version"))


def review_queues_list() -> list[tuple[ReviewQueue, dict[str, int]]]:
    """Every review queue (default first) with its progress: three counts per queue, and
    queues are few (an operator creates each by hand)."""
    queues = ReviewQueue.objects.select_related("dataset__current").order_by("-is_default", "name")
    return [(q, review_progress(q)) for q in queues]


def review_queue_get(name: str) -> ReviewQueue | None:
    return ReviewQueue.objects.select_related("dataset__current").filter(name=name).first()


# --- consumers -------------------------------------------------------------------------------
def consumer_status(name: str) -> dict[str, Any] | None:
    """A consumer's progress per dataset it pulled from: its leases by status, the units
    delivered to it, the ready units still waiting for it (under the dataset's current
    version), and the units dropped for it, by reason (Skip rows; specs.Serving). None if it
    never pulled. A few grouped counts on indexed columns."""
    consumer = Consumer.objects.filter(name=name).first()
    if consumer is None:
        return None
    datasets: dict[int, dict[str, Any]] = {}

    def entry(dataset_id: int) -> dict[str, Any]:
        return datasets.setdefault(
            dataset_id,
            {
                "leases": {s.value: 0 for s in Lease.Status},
                "delivered_units": 0,
                "dropped": {r.label: 0 for r in Skip.Reason},
                "dropped_steps": {r.label: 0 for r in Skip.Reason},
            },
        )

    leases = (
        Lease.objects.filter(consumer=consumer)
        .values_list("dataset_version__dataset_id", "status")
        .annotate(n=Count("id"))
        .order_by()
    )
    for dataset_id, status, n in leases:
        entry(dataset_id)["leases"][status] = n
    delivered = (
        Delivery.objects.filter(consumer=consumer)
        .values_list("dataset_id")
        .annotate(n=Count("id"))
        .order_by()
    )
    for dataset_id, n in delivered:
        entry(dataset_id)["delivered_units"] = n
    current_skips: dict[int, int] = {}
    skips = (
        Skip.objects.filter(consumer=consumer)
        .values_list("dataset_version__dataset_id", "dataset_version_id", "reason")
        .annotate(n=Count("id"), steps=Coalesce(Sum("steps"), 0))
        .order_by()
    )
    current = dict(
        Dataset.objects.filter(id__in={row[0] for row in skips} | set(datasets)).values_list(
            "id", "current_id"
        )
    )
    for dataset_id, version_id, reason, n, steps in skips:
        e = entry(dataset_id)
        label = Skip.Reason(reason).label
        e["dropped"][label] += n
        e["dropped_steps"][label] += steps
        if version_id == current.get(dataset_id):
            current_skips[dataset_id] = current_skips.get(dataset_id, 0) + n
    ready = (
        PromptGroup.objects.filter(ready_at__isnull=False).count()
        + Trajectory.objects.filter(group__isnull=True, status=Trajectory.Status.COMPLETED).count()
        if datasets
        else 0
    )
    names = dict(Dataset.objects.filter(id__in=list(datasets)).values_list("id", "name"))
    out = []
    for dataset_id, e in sorted(datasets.items(), key=lambda kv: names.get(kv[0], "")):
        # Units a group-unit pull could still offer (steps-unit pulls count steps instead).
        pending = max(0, ready - e["delivered_units"] - current_skips.get(dataset_id, 0))
        out.append({"dataset": names.get(dataset_id), **e, "pending_units": pending})
    return {"name": consumer.name, "created_at": consumer.created_at, "datasets": out}
