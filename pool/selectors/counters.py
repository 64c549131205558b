"""The pool's counts, read from the counters PostgreSQL keeps (pool.models.Counter), or
counted where there are none (SQLite).

On PostgreSQL every write of a counted table appends its deltas in its own transaction
(pool/migrations/_counters.py), so a count is the sum of a few hundred rows whatever the
pool's size, read in the same snapshot as the rest of a statement: the dashboard's
counters (curation/selectors/live.py), the overview (curation/selectors/pages.py) and
``GET /api/v1/stats`` (pool/selectors/stats.py) stay as fast at millions of steps as at
thousands, and stay exact. The readers take ``counted`` (None: whether this database keeps
counters) so that a test can read both ways on PostgreSQL and compare them.

The counters' names (what each counts: pool/migrations/0025_counters.py):

======================  ==========================================================
steps                   steps stored
exact / retokenized     steps by token source (client or upstream / retokenized)
awaiting_reward         steps without a final reward (readiness without REWARD_FINAL)
drift / ready /         steps with drift / readiness READY / a curation label
labelled
tokens / stored_bytes   the steps' seq_len and their stored token bytes (seq_delta)
trajectories,           trajectories, per source: all, by status (``traj:running``...),
traj:<status>,          their steps (step_count), and the latest ``updated_at`` in
traj_steps,             microseconds since the epoch (never lowered by a delete: when
max:last_seen           the source was last seen)
groups, group:<status>  prompt groups: all, by status, ready (ready_at set)
ready_groups
merge:done_total,       done merges' tokens and unique tokens; merged_groups and
merge:done_unique,      merge:group_*: those of a prompt group
merged_groups, ...
events, feedback        service events and feedback
lease:leased,           open and acked leases
lease:acked
minute:steps,           steps, and those with drift, per minute of their
minute:drift            ``created_at`` (the key: minutes since the epoch); the last
                        MINUTES_KEPT minutes (pool/services/counters.py)
======================  ==========================================================
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import BigIntegerField, Max, OuterRef, Q, Subquery, Sum
from django.db.models.functions import Cast, Coalesce

from pool.replica import read_connection

from ..models import Counter, Source

TRAJECTORY_STATUSES = ("running", "completed", "failed", "abandoned")
GROUP_STATUSES = ("open", "complete")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # the per-minute and "last seen" counters count from here


def counters_kept(counted: bool | None = None) -> bool:
    """Whether to read the counters (``counted``, or None: whether this database keeps them)."""
    return read_connection().vendor == "postgresql" if counted is None else counted


def counter(name: str) -> Any:
    """The aggregate of counter ``name`` over Counter rows (0 when it has none), for an
    ``aggregate()`` or a one-row part of a statement."""
    agg = Max if name.startswith("max:") else Sum
    return Cast(Coalesce(agg("value", filter=Q(name=name)), 0), BigIntegerField())


def counters_read(names: list[str] | tuple[str, ...]) -> dict[str, int]:
    """The pool-wide value of each counter of ``names`` (summed over its keys): one query."""
    return Counter.objects.using(read_connection().alias).aggregate(**{n: counter(n) for n in names})


def source_counters() -> dict[int | None, dict[str, Any]]:
    """Per source id (None: trajectories without a source) that has trajectories: the
    source's name (None without one), their number, their steps and when the source was
    last seen (an aware datetime, or None). One query."""
    rows = (
        Counter.objects.using(read_connection().alias)
        .filter(name__in=["trajectories", "traj_steps", "max:last_seen"])
        .values("key")
        .annotate(
            source_name=Subquery(Source.objects.filter(id=OuterRef("key")).values("name")[:1]),
            trajectories=counter("trajectories"),
            steps=counter("traj_steps"),
            last=counter("max:last_seen"),
        )
        .values_list("key", "source_name", "trajectories", "steps", "last")
        .order_by()
    )
    return {
        source_id: {
            "name": name,
            "trajectories": trajectories,
            "steps": steps,
            "last_seen": EPOCH + timedelta(microseconds=last) if last else None,
        }
        for source_id, name, trajectories, steps, last in rows
        if trajectories and (source_id is None or name is not None)
    }


def minute_of(moment: datetime) -> int:
    """The per-minute counters' key of ``moment``: whole minutes since the epoch."""
    return int((moment - EPOCH).total_seconds() // 60)


def per_minute(name: str, since: datetime) -> dict[int, int]:
    """Counter ``name`` per minute from the minute of ``since`` on: {minute: count}, minutes
    without any left out. One query."""
    rows = (
        Counter.objects.using(read_connection().alias)
        .filter(name=name, key__gte=minute_of(since))
        .values("key")
        .annotate(n=counter(name))
        .values_list("key", "n")
        .order_by()
    )
    return {minute: n for minute, n in rows if n}
