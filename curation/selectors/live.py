"""The dashboard's counters: one consistent read of the pool, for the pages as served and
for the live websocket (its hello state, then a fresh state after events).

What each counter counts (the pages' labels say the same):

=========================  ===============================================================
collect.steps              steps stored (``GET /api/v1/stats``: ``steps``)
collect.trajectories       trajectories stored, whatever their status (``trajectories``)
collect.running            trajectories whose status is running
                           (``trajectories_by_status.running``)
represent.exact            steps whose token ids are exact: given by the client or returned
                           by the upstream (token source client or upstream)
represent.retokenized      steps whose ids a local tokenizer re-encoded from text
represent.drift            steps whose prompt did not extend the previous step's prompt and
                           response (``steps_drift``)
curate.ready_steps         steps ready to train on: exact tokens, a final reward (their own
                           or their trajectory's), trajectory completed, group complete
                           (readiness READY: the steps API's ``ready``)
curate.awaiting_reward     steps with no final reward yet, neither their own nor their
                           trajectory's (readiness without REWARD_FINAL): never a ready step
curate.ready_groups        prompt groups whose completed rollouts are all rewarded (ready_at)
curate.labelled            steps with a curation label (accepted, rejected, quarantined)
optimize.merged_groups     prompt groups with a done prefix-tree merge; ``tokens`` their
                           step tokens, ``tokens_saved`` the tokens the merge shares
consume.leases_open        leases taken and not acked yet; ``acked``; ``consumers``
quality.steps              steps stored in the last RATES_WINDOW (an hour); ``drift_pct``
                           the share of them with drift, ``errors`` gateway calls that
                           failed (ERROR_EVENTS) and ``error_pct`` their share of the calls
                           (steps + errors), in whole percent (None when there were none)
policy_version             the current policy version, or None
=========================  ===============================================================

So ``exact + retokenized <= steps``, ``ready_steps + awaiting_reward <= steps`` and
``running <= trajectories`` hold in every state, because every counter comes from the same
statement (``_one_read``): one SELECT of one-row sub-selects reads one snapshot of the
database (PostgreSQL takes a snapshot per statement even in READ COMMITTED; SQLite runs a
statement in one read transaction, without the write lock an IMMEDIATE transaction takes),
so no write can land between two counters. The counts are exact, as the API's are: ready
steps, ready groups, labelled steps and drift are ranges of partial indexes; the step total,
the token-source split and awaiting reward are one scan of the step table (on PostgreSQL an
index-only scan of step_traj_index_uniq, the narrow covering index holding token_source and readiness);
trajectories and running one scan of the trajectory table; the rest small tables. That is
how SQLite counts. PostgreSQL keeps the counts themselves (pool/selectors/counters.py):
triggers append each write's deltas in the write's own transaction, and the same one
statement sums them, so the read stays one snapshot and no longer grows with the pool;
only the consumers and the last hour's quality window are still read from their tables.
The live websocket bounds how often a process reads them (curation/consumers.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Max, Q, QuerySet, Sum, Value
from django.utils import timezone

from pool.flags import READY
from pool.models import Counter, Event, MergeResult, PolicyVersion, PromptGroup, Step, Trajectory
from pool.replica import read_connection
from pool.selectors.counters import counter, counters_kept, minute_of, source_counters
from pool.selectors.stats import AWAITING_REWARD_VALUES

from ..models import Consumer, Lease

# The state sections each topic needs ("overview" and unknown topics: all of them).
SECTIONS: dict[str, tuple[str, ...]] = {
    "collection": ("collect", "represent"),
    "steps": ("collect", "represent"),
    "curation": ("curate",),
    "optimization": ("optimize",),
    "consumption": ("consume", "curate"),
}
ALL = ("collect", "represent", "curate", "optimize", "consume", "quality")
# The window of the overview's quality counters (drift and error rates).
RATES_WINDOW = timedelta(hours=1)
# Gateway events that mean a call failed (gateway/proxy/faults.py fault_event).
ERROR_EVENTS = ("upstream_error", "record_failed")
EXACT_TOKEN_SOURCES = (Step.TokenSource.CLIENT, Step.TokenSource.UPSTREAM)


def sections(topics: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The state sections ``topics`` need, in ALL's order."""
    wanted: set[str] = set()
    for topic in topics:
        wanted.update(SECTIONS.get(topic, ALL))
    return tuple(name for name in ALL if name in wanted)


def live_state(topics: list[str] | tuple[str, ...], *, counted: bool | None = None) -> dict[str, Any]:
    """The counters ``topics`` need, from one consistent read (see the module docstring):
    {"collect", "represent", "curate", "optimize", "consume"} as far as the topics need
    them, and "policy_version". ``collect`` also lists the sources (their steps and when
    they were last seen; a second statement). ``counted``: read PostgreSQL's counters
    (pool/selectors/counters.py; None: where the database keeps them) or count the rows."""
    wanted = sections(topics)
    parts = [_row(PolicyVersion.objects.filter(is_current=True), policy_version=Max("version"))]
    if counters_kept(counted):
        kept = {
            alias: counter(name) for section in wanted for alias, name in _COUNTED.get(section, {}).items()
        }
        parts += [_row(Counter.objects, **kept)] if kept else []
        parts += [part for name in wanted for part in _UNCOUNTED.get(name, _PARTS[name])()]
    else:
        scan = {k: v for name in wanted for k, v in _STEP_SCAN.get(name, {}).items()}
        parts += [_row(Step.objects, **scan)] if scan else []
        parts += [part for name in wanted for part in _PARTS[name]()]
    row = _one_read(parts)
    state: dict[str, Any] = {name: _SHAPES[name](row) for name in wanted}
    state["policy_version"] = row["policy_version"]
    if "collect" in state:
        state["collect"]["sources"] = _sources(counted)
    return state


def state_for(state: dict[str, Any], topics: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The part of a full state (``live_state(ALL)``) that ``topics`` need: what
    ``live_state(topics)`` would have read."""
    return {name: state[name] for name in sections(topics)} | {"policy_version": state["policy_version"]}


# --- the parts of the one statement --------------------------------------------------------------
# Counters of one scan of the step table, per section: on PostgreSQL an index-only scan of
# step_traj_index_uniq, the narrow covering index that holds token_source and readiness.
_STEP_SCAN: dict[str, dict[str, Any]] = {
    "collect": {"steps": Count("id")},
    "represent": {
        "exact": Count("id", filter=Q(token_source__in=EXACT_TOKEN_SOURCES)),
        "retokenized": Count("id", filter=Q(token_source=Step.TokenSource.RETOKENIZED)),
    },
    "curate": {"awaiting_reward": Count("id", filter=Q(readiness__in=AWAITING_REWARD_VALUES))},
}


def _collect() -> list[QuerySet]:
    return [
        _row(
            Trajectory.objects,
            trajectories=Count("id"),
            running=Count("id", filter=Q(status=Trajectory.Status.RUNNING)),
        ),
    ]


def _represent() -> list[QuerySet]:
    # step_drift: a partial index of the drifting steps only
    return [_row(Step.objects.filter(drift=True), drift=Count("id"))]


def _curate() -> list[QuerySet]:
    return [
        # step_ready: the partial index holds every trainable readiness value, READY among them
        _row(Step.objects.filter(readiness=READY), ready_steps=Count("id")),
        # group_ready: partial index of ready groups
        _row(PromptGroup.objects.filter(ready_at__isnull=False), ready_groups=Count("id")),
        # step_labelled: partial index of labelled steps
        _row(Step.objects.filter(~Q(label="")), labelled=Count("id")),
    ]


def _optimize() -> list[QuerySet]:
    return [
        _row(
            MergeResult.objects.filter(status=MergeResult.Status.DONE, group__isnull=False),
            merged_groups=Count("id"),
            merge_tokens=Sum("total_tokens"),
            merge_unique=Sum("unique_tokens"),
        )
    ]


def _consume() -> list[QuerySet]:
    return [
        _row(
            Lease.objects,
            leases_open=Count("id", filter=Q(status=Lease.Status.LEASED)),
            leases_acked=Count("id", filter=Q(status=Lease.Status.ACKED)),
        ),
        _row(Consumer.objects, consumers=Count("id")),
    ]


def window_start() -> datetime:
    """The start of the quality window: RATES_WINDOW back from now, at a whole minute (the
    per-minute counters' granularity; both ways of reading count the same steps)."""
    return (timezone.now() - RATES_WINDOW).replace(second=0, microsecond=0)


def _quality_counted() -> list[QuerySet]:
    since = window_start()
    return [
        _row(
            Counter.objects.filter(name__in=["minute:steps", "minute:drift"], key__gte=minute_of(since)),
            recent_steps=counter("minute:steps"),
            recent_drift=counter("minute:drift"),
        ),
        _row(Event.objects.filter(type__in=ERROR_EVENTS, created_at__gte=since), recent_errors=Count("id")),
    ]


def _quality() -> list[QuerySet]:
    since = window_start()
    return [
        # step_created: a range of the index (the last hour)
        _row(
            Step.objects.filter(created_at__gte=since),
            recent_steps=Count("id"),
            recent_drift=Count("id", filter=Q(drift=True)),
        ),
        _row(Event.objects.filter(type__in=ERROR_EVENTS, created_at__gte=since), recent_errors=Count("id")),
    ]


_PARTS = {
    "collect": _collect,
    "represent": _represent,
    "curate": _curate,
    "optimize": _optimize,
    "consume": _consume,
    "quality": _quality,
}

# Where the database keeps counters: each section's counts read from them (alias: counter
# name), and the rest of each section's parts (consumers are few and counted; the quality
# window sums the last hour's per-minute counters, its errors are a range of the
# event_type_created index).
_COUNTED: dict[str, dict[str, str]] = {
    "collect": {"steps": "steps", "trajectories": "trajectories", "running": "traj:running"},
    "represent": {"exact": "exact", "retokenized": "retokenized", "drift": "drift"},
    "curate": {
        "ready_steps": "ready",
        "awaiting_reward": "awaiting_reward",
        "ready_groups": "ready_groups",
        "labelled": "labelled",
    },
    "optimize": {
        "merged_groups": "merged_groups",
        "merge_tokens": "merge:group_total",
        "merge_unique": "merge:group_unique",
    },
    "consume": {"leases_open": "lease:leased", "leases_acked": "lease:acked"},
}
_UNCOUNTED = {
    "collect": list,
    "represent": list,
    "curate": list,
    "optimize": list,
    "consume": lambda: [_row(Consumer.objects, consumers=Count("id"))],
    "quality": _quality_counted,
}


# --- the sections, from the statement's one row ---------------------------------------------------
def _optimize_shape(row: dict[str, Any]) -> dict[str, Any]:
    # int(): a raw SUM of a bigint column is a numeric (Decimal) on PostgreSQL
    tokens = int(row["merge_tokens"] or 0)
    saved = tokens - int(row["merge_unique"] or 0)
    return {
        "merged_groups": row["merged_groups"],
        "tokens": tokens,
        "tokens_saved": saved,
        "saved_pct": round(100 * saved / tokens) if tokens else None,
    }


def _quality_shape(row: dict[str, Any]) -> dict[str, Any]:
    steps, drift, errors = row["recent_steps"], row["recent_drift"], row["recent_errors"]
    return {
        "window_hours": int(RATES_WINDOW.total_seconds() // 3600),
        "steps": steps,
        "drift_pct": round(100 * drift / steps) if steps else None,
        "errors": errors,
        "error_pct": round(100 * errors / (steps + errors)) if steps + errors else None,
    }


_SHAPES = {
    "collect": lambda r: {"steps": r["steps"], "trajectories": r["trajectories"], "running": r["running"]},
    "represent": lambda r: {"exact": r["exact"], "retokenized": r["retokenized"], "drift": r["drift"]},
    "curate": lambda r: {
        "ready_steps": r["ready_steps"],
        "awaiting_reward": r["awaiting_reward"],
        "ready_groups": r["ready_groups"],
        "labelled": r["labelled"],
    },
    "optimize": _optimize_shape,
    "quality": _quality_shape,
    "consume": lambda r: {
        "leases_open": r["leases_open"],
        "acked": r["leases_acked"],
        "consumers": r["consumers"],
    },
}


def _sources(counted: bool | None = None) -> list[dict[str, Any]]:
    """The sources with trajectories (the trajectories without one: name ""), by name."""
    if counters_kept(counted):
        rows = [(c["name"], c) for c in source_counters().values()]
        # Ordered as the count below is on PostgreSQL: by name, trajectories without a source last.
        rows.sort(key=lambda r: (r[0] is None, r[0] or ""))
        return [
            {
                "name": name or "",
                "trajectories": c["trajectories"],
                "steps": c["steps"],
                "last_seen": c["last_seen"].isoformat() if c["last_seen"] else None,
            }
            for name, c in rows
        ]
    return [
        {
            "name": name or "",
            "trajectories": trajectories,
            "steps": n or 0,
            "last_seen": last.isoformat() if last else None,
        }
        for name, trajectories, n, last in Trajectory.objects.values("source__name")
        .annotate(trajectories=Count("id"), n=Sum("step_count"), last=Max("updated_at"))
        .order_by("source__name")
        .values_list("source__name", "trajectories", "n", "last")
    ]


# --- one statement ------------------------------------------------------------------------------
def _row(qs: QuerySet, **aggregates: Any) -> QuerySet:
    """``qs.aggregate(**aggregates)`` left unevaluated, to be one part of ``_one_read``:
    grouped by a constant, which is no GROUP BY, so it is one row."""
    return qs.order_by().annotate(_one=Value(1)).values("_one").annotate(**aggregates).values(*aggregates)


def _one_read(parts: list[QuerySet]) -> dict[str, Any]:
    """The columns of every one-row query in ``parts`` (distinct names), read by one SELECT
    that joins them: one statement, one snapshot of the database."""
    sql, params = [], []
    connection = read_connection()  # the replica on a page read from it (pool/replica.py)
    for i, qs in enumerate(parts):
        part, part_params = qs.query.sql_with_params()
        sql.append(f"({part}) AS {connection.ops.quote_name(f'part{i}')}")
        params.extend(part_params)
    with connection.cursor() as cur:
        cur.execute("SELECT * FROM " + " CROSS JOIN ".join(sql), params)
        names = [c[0] for c in cur.description]
        return dict(zip(names, cur.fetchone(), strict=True))
