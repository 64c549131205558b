"""Reads of the pool's counts and token economics (``GET /api/v1/stats``): the whole pool's,
or a restricted reader's sources' (pool/tenancy.py)."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q, Sum
from django.db.models.functions import Length

from .. import tokens
from ..flags import READY, Readiness
from ..models import MergeResult, PolicyVersion, Step
from ..tenancy import Sources
from ..tenancy import q as of_sources
from .counters import GROUP_STATUSES, TRAJECTORY_STATUSES, counters_kept, counters_read
from .service_events import events_listed, feedback_listed
from .trajectories import groups_listed, trajectories_listed

# Readiness values without a final effective reward.
AWAITING_REWARD_VALUES = [v for v in range(READY + 1) if not v & int(Readiness.REWARD_FINAL)]


def pool_stats(sources: Sources = None, *, counted: bool | None = None) -> dict[str, Any]:
    """Counts and token economics of the whole pool (``sources`` None), or of what a reader
    restricted to ``sources`` may list: the rows ``GET /steps``, ``/trajectories``,
    ``/groups``, ``/events`` and ``/feedback`` give it (groups: its sources' and the shared
    ones), and the merges of its sources' groups (a shared group's prefix tree is shown to
    unrestricted readers only). The current policy version is the pool's. A handful of
    aggregate queries; the whole pool's, where the database keeps counters, from them
    (pool/selectors/counters.py; ``counted``: None, where it does)."""
    if sources is None and counters_kept(counted):
        return _counted_stats()
    own_steps = Step.objects.filter(of_sources("trajectory__source_id", sources))
    steps = own_steps.aggregate(
        steps=Count("id"),
        # Steps without a final effective reward (the REWARD_FINAL bit: its own, its
        # branch's or its trajectory's), the dashboard's "awaiting reward": never a ready step.
        reward_pending=Count("id", filter=Q(readiness__in=AWAITING_REWARD_VALUES)),
        drift=Count("id", filter=Q(drift=True)),
        tokens=Sum("seq_len"),
    )
    traj = dict(
        trajectories_listed(sources)
        .select_related(None)
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    groups = dict(
        groups_listed(sources).values_list("status").annotate(n=Count("id")).values_list("status", "n")
    )
    stored = own_steps.aggregate(n=Sum(Length("seq_delta")))["n"] or 0
    current = PolicyVersion.objects.filter(is_current=True).values_list("version", flat=True).first()
    merges = MergeResult.objects.filter(
        of_sources("group__source_id", sources), status=MergeResult.Status.DONE
    ).aggregate(total=Sum("total_tokens"), unique=Sum("unique_tokens"))
    return _stats(
        steps=steps["steps"],
        reward_pending=steps["reward_pending"],
        drift=steps["drift"],
        traj=traj,
        groups=groups,
        events=events_listed(sources).select_related(None).count(),
        feedback=feedback_listed(sources).select_related(None).count(),
        current=current,
        step_tokens=steps["tokens"] or 0,
        stored=stored,
        merge_total=merges["total"] or 0,
        merge_unique=merges["unique"] or 0,
    )


def _counted_stats() -> dict[str, Any]:
    """``pool_stats()`` of the whole pool from the counters: one query, and the policy."""
    names = [f"traj:{s}" for s in TRAJECTORY_STATUSES] + [f"group:{s}" for s in GROUP_STATUSES]
    c = counters_read(
        names
        + ["steps", "awaiting_reward", "drift", "events", "feedback", "tokens", "stored_bytes"]
        + ["merge:done_total", "merge:done_unique"]
    )
    current = PolicyVersion.objects.filter(is_current=True).values_list("version", flat=True).first()
    return _stats(
        steps=c["steps"],
        reward_pending=c["awaiting_reward"],
        drift=c["drift"],
        traj={s: c[f"traj:{s}"] for s in TRAJECTORY_STATUSES if c[f"traj:{s}"]},
        groups={s: c[f"group:{s}"] for s in GROUP_STATUSES if c[f"group:{s}"]},
        events=c["events"],
        feedback=c["feedback"],
        current=current,
        step_tokens=c["tokens"],
        stored=c["stored_bytes"],
        merge_total=c["merge:done_total"],
        merge_unique=c["merge:done_unique"],
    )


def _stats(
    *,
    steps: int,
    reward_pending: int,
    drift: int,
    traj: dict[str, int],
    groups: dict[str, int],
    events: int,
    feedback: int,
    current: int | None,
    step_tokens: int,
    stored: int,
    merge_total: int,
    merge_unique: int,
) -> dict[str, Any]:
    naive = step_tokens * tokens.TOKEN_BYTES
    return {
        "steps": steps,
        "steps_reward_pending": reward_pending,
        "steps_drift": drift,
        "trajectories": sum(traj.values()),
        "trajectories_by_status": traj,
        "groups": sum(groups.values()),
        "groups_by_status": groups,
        "events": events,
        "feedback": feedback,
        "current_policy_version": current,
        "tokens": {
            "step_tokens": step_tokens,
            "naive_bytes": naive,
            "stored_bytes": stored,
            "dedup_ratio": (stored / naive) if naive else 1.0,
        },
        "merge": {"total_tokens": merge_total, "unique_tokens": merge_unique},
    }
