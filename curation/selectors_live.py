"""The live dashboard's state on (re)connect: the counters of the requested topics.

Every read is an index (partial or small table) or a planner estimate, so a connect stays
cheap on a big pool: on PostgreSQL the totals of the step and trajectory tables and the
split of steps by token source come from the planner's statistics (pg_class.reltuples,
pg_stats) once a table holds more than EXACT_BELOW rows; below that, and on SQLite, they are
exact counts. Live events then move the counters; a reconnect catches up by reading them
again.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.db.models import Count, Max, Q, Sum

from pool.flags import TRAINABLE_VALUES
from pool.models import MergeResult, PolicyVersion, PromptGroup, Step, Trajectory

from .models import Consumer, Lease

EXACT_BELOW = 50_000  # rows: an exact COUNT(*) below this costs a few milliseconds

# The state sections each topic needs ("overview" and unknown topics: all of them).
SECTIONS: dict[str, tuple[str, ...]] = {
    "collection": ("collect", "represent"),
    "steps": ("collect", "represent"),
    "curation": ("curate",),
    "optimization": ("optimize",),
    "consumption": ("consume", "curate"),
}
ALL = ("collect", "represent", "curate", "optimize", "consume")


def live_state(topics: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """The hello state for ``topics``: {"collect", "represent", "curate", "optimize",
    "consume"} as far as the topics need them, and "policy_version" (the current one, or
    None)."""
    wanted: set[str] = set()
    for topic in topics:
        wanted.update(SECTIONS.get(topic, ALL))
    state: dict[str, Any] = {}
    for name in ALL:
        if name in wanted:
            state[name] = _READERS[name]()
    state["policy_version"] = (
        PolicyVersion.objects.filter(is_current=True).values_list("version", flat=True).first()
    )
    return state


def _collect() -> dict[str, Any]:
    steps = _total(Step)
    sources = [
        {"name": name or "", "steps": n or 0, "last_seen": last.isoformat() if last else None}
        for name, n, last in Trajectory.objects.values("source__name")
        .annotate(n=Sum("step_count"), last=Max("updated_at"))
        .order_by("source__name")
        .values_list("source__name", "n", "last")
    ]
    return {
        "steps": steps,
        "trajectories": _total(Trajectory),
        # traj_status_updated: a range of the index (running trajectories are few)
        "running": Trajectory.objects.filter(status=Trajectory.Status.RUNNING).count(),
        "sources": sources,
    }


def _represent() -> dict[str, Any]:
    split = _token_sources()
    retokenized = split.get(Step.TokenSource.RETOKENIZED, 0)
    exact = split.get(Step.TokenSource.CLIENT, 0) + split.get(Step.TokenSource.UPSTREAM, 0)
    # step_drift: a partial index of the drifting steps only
    drift = Step.objects.filter(drift=True).count()
    return {"exact": exact, "retokenized": retokenized, "drift": drift}


def _curate() -> dict[str, Any]:
    return {
        # step_ready: the partial index holds exactly these steps (an index-only count)
        "ready_steps": Step.objects.filter(readiness__in=TRAINABLE_VALUES).count(),
        # group_ready: partial index of ready groups
        "ready_groups": PromptGroup.objects.filter(ready_at__isnull=False).count(),
        # step_labelled: partial index of labelled steps
        "labelled": Step.objects.filter(~Q(label="")).count(),
    }


def _optimize() -> dict[str, Any]:
    got = MergeResult.objects.filter(status=MergeResult.Status.DONE, group__isnull=False).aggregate(
        groups=Count("id"), tokens=Sum("total_tokens"), unique=Sum("unique_tokens")
    )
    tokens = got["tokens"] or 0
    saved = tokens - (got["unique"] or 0)
    return {
        "merged_groups": got["groups"],
        "tokens": tokens,
        "tokens_saved": saved,
        "saved_pct": round(100 * saved / tokens) if tokens else None,
    }


def _consume() -> dict[str, Any]:
    got = Lease.objects.aggregate(
        open=Count("id", filter=Q(status=Lease.Status.LEASED)),
        acked=Count("id", filter=Q(status=Lease.Status.ACKED)),
    )
    return {"leases_open": got["open"], "acked": got["acked"], "consumers": Consumer.objects.count()}


_READERS = {
    "collect": _collect,
    "represent": _represent,
    "curate": _curate,
    "optimize": _optimize,
    "consume": _consume,
}


# --- estimates ---------------------------------------------------------------------------------
def _total(model: Any) -> int:
    """Rows of ``model``'s table: the planner's estimate on PostgreSQL for a big table,
    else exact."""
    estimate = _reltuples(model._meta.db_table)
    if estimate is not None and estimate >= EXACT_BELOW:
        return estimate
    return model.objects.count()


def _token_sources() -> dict[str, int]:
    """Steps per token source: exact on a small table, else the planner's most-common-value
    frequencies times its row estimate (PostgreSQL)."""
    total = _reltuples(Step._meta.db_table)
    if total is not None and total >= EXACT_BELOW:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT most_common_vals::text::text[], most_common_freqs FROM pg_stats"
                " WHERE tablename = %s AND attname = 'token_source'",
                [Step._meta.db_table],
            )
            row = cur.fetchone()
        if row and row[0]:
            return {v: round(f * total) for v, f in zip(row[0], row[1], strict=True)}
    return dict(Step.objects.values("token_source").annotate(n=Count("id")).values_list("token_source", "n"))


def _reltuples(table: str) -> int | None:
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cur:
        cur.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)", [table])
        row = cur.fetchone()
    return int(row[0]) if row and row[0] is not None and row[0] >= 0 else None
