"""Reads of the dashboard's list pages: the overview, the sources, and the browse pages of
trajectories and steps. Each function is a bounded number of queries, whatever the pool's
size: aggregates, or pages of at most a few dozen rows (keyset on id, never OFFSET).

The numbers a page starts with are the ones the live websocket's hello state carries
(curation/selectors/live.py): the page is correct without live updates, and live events
only move it forward.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Exists, F, Max, OuterRef, Q, QuerySet, Sum
from django.db.models.functions import TruncMinute
from django.utils import timezone

from pool.flags import READY, READY_ANY_TOKENS
from pool.models import Event, PolicyVersion, Source, Step, Trajectory
from pool.selectors.counters import EPOCH, counters_kept, minute_of, per_minute, source_counters
from pool.selectors.stats import pool_stats

from .live import live_state

# Minutes shown by the overview's ingestion-rate chart (one point per minute).
RATE_MINUTES = 30
# Rows per page of the trajectory browser and of the step list (keyset on id: one bounded
# query per page).
TRAJECTORY_PAGE = 50
STEP_PAGE = 50


def overview() -> dict[str, Any]:
    """Everything the overview shows: the counters of the five stages and the last hour's
    quality (``state``: the live hello state, one consistent read, curation/selectors/live.py),
    the ingestion rate per minute, sources and their health, and token storage."""
    state = live_state(["overview"])
    quality = state["quality"]
    calls = quality["steps"] + quality["errors"]
    return {
        "stats": pool_stats(),
        "state": state,
        "rate": ingest_rate(),
        "sources": sources_health(),
        "error_rate": quality["errors"] / calls if calls else None,
    }


def ingest_rate(
    *, now: datetime | None = None, minutes: int = RATE_MINUTES, counted: bool | None = None
) -> list[dict[str, Any]]:
    """Steps stored per minute over the last ``minutes`` minutes, oldest first, zeros
    included: the per-minute counters where the database keeps them
    (pool/selectors/counters.py; ``counted``: None, where it does), else one GROUP BY on the
    step_created index range."""
    now = now or timezone.now()
    end = now.replace(second=0, microsecond=0)
    start = end - timedelta(minutes=minutes - 1)
    if counters_kept(counted):
        first = minute_of(start)
        kept = per_minute("minute:steps", start)
        return [
            {"minute": start + timedelta(minutes=i), "steps": kept.get(first + i, 0)} for i in range(minutes)
        ]
    counts = {
        m.replace(second=0, microsecond=0): n
        for m, n in Step.objects.filter(created_at__gte=start)
        .annotate(m=TruncMinute("created_at"))
        .values_list("m")
        .annotate(n=Count("id"))
        .values_list("m", "n")
    }
    return [
        {"minute": start + timedelta(minutes=i), "steps": counts.get(start + timedelta(minutes=i), 0)}
        for i in range(minutes)
    ]


def sources_health(*, counted: bool | None = None) -> list[dict[str, Any]]:
    """The data sources (those that wrote trajectories or events; not a trainer's or another
    consumer-only key's source) with their trajectory and step counts and when they were last
    seen (the newest trajectory's update). Sources are few (one per agent runtime or service);
    their counts come from the counters where the database keeps them
    (pool/selectors/counters.py; ``counted``: None, where it does), else from a count."""
    wrote_events = Exists(Event.objects.filter(source_id=OuterRef("pk")))
    if counters_kept(counted):
        per_source = source_counters()
        listed = Source.objects.filter(Q(id__in=list(per_source)) | Q(wrote_events)).values_list(
            "id", "name", "kind"
        )
        rows = [
            {
                "name": name,
                "kind": kind,
                "trajectories": per_source.get(sid, {}).get("trajectories", 0),
                "steps": per_source.get(sid, {}).get("steps", 0),
                "last_seen": per_source.get(sid, {}).get("last_seen"),
            }
            for sid, name, kind in listed
        ]
        # The order of the count below: the most recently seen first, never seen last, then by name.
        return sorted(
            rows, key=lambda r: (r["last_seen"] is None, -(r["last_seen"] or EPOCH).timestamp(), r["name"])
        )
    rows = (
        Source.objects.annotate(
            n_trajectories=Count("trajectories"),
            n_steps=Sum("trajectories__step_count"),
            last_seen=Max("trajectories__updated_at"),
        )
        .filter(Q(n_trajectories__gt=0) | Q(wrote_events))
        .order_by(F("last_seen").desc(nulls_last=True), "name")
    )
    return [
        {
            "name": s.name,
            "kind": s.kind,
            "trajectories": s.n_trajectories,
            "steps": s.n_steps or 0,
            "last_seen": s.last_seen,
        }
        for s in rows
    ]


def policy_current() -> PolicyVersion | None:
    return PolicyVersion.objects.filter(is_current=True).first()


def source_names() -> list[str]:
    return list(Source.objects.order_by("name").values_list("name", flat=True))


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


def steps_browse(
    *,
    source: str = "",
    token_source: str = "",
    drift: bool = False,
    before: int | None = None,
    limit: int = STEP_PAGE,
) -> tuple[list[Step], int | None]:
    """One page of steps, newest first, with the ``before`` cursor of the next page (None on
    the last). One query; token bytes and text stay in the database."""
    qs = (
        Step.objects.select_related("trajectory__source")
        .only(
            "id",
            "uid",
            "step_index",
            "prompt_len",
            "seq_len",
            "token_source",
            "drift",
            "drift_offset",
            "effective_reward",
            "reward_scope",
            "readiness",
            "created_at",
            "trajectory__uid",
            "trajectory__source__name",
        )
        .order_by("-id")
    )
    if source:
        qs = qs.filter(trajectory__source__name=source)
    if token_source:
        qs = qs.filter(token_source=token_source)
    if drift:
        qs = qs.filter(drift=True)
    return keyset_page(qs, before=before, limit=limit)


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
