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
from .service_events import events_listed, feedback_listed
from .trajectories import groups_listed, trajectories_listed

# Readiness values without a final effective reward.
AWAITING_REWARD_VALUES = [v for v in range(READY + 1) if not v & int(Readiness.REWARD_FINAL)]


def pool_stats(sources: Sources = None) -> dict[str, Any]:
    """Counts and token economics of the whole pool (``sources`` None), or of what a reader
    restricted to ``sources`` may list: the rows ``GET /steps``, ``/trajectories``,
    ``/groups``, ``/events`` and ``/feedback`` give it (groups: its sources' and the shared
    ones), and the merges of its sources' groups (a shared group's prefix tree is shown to
    unrestricted readers only). The current policy version is the pool's. A handful of
    aggregate queries."""
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
    naive = (steps["tokens"] or 0) * tokens.TOKEN_BYTES
    return {
        "steps": steps["steps"],
        "steps_reward_pending": steps["reward_pending"],
        "steps_drift": steps["drift"],
        "trajectories": sum(traj.values()),
        "trajectories_by_status": traj,
        "groups": sum(groups.values()),
        "groups_by_status": groups,
        "events": events_listed(sources).select_related(None).count(),
        "feedback": feedback_listed(sources).select_related(None).count(),
        "current_policy_version": current,
        "tokens": {
            "step_tokens": steps["tokens"] or 0,
            "naive_bytes": naive,
            "stored_bytes": stored,
            "dedup_ratio": (stored / naive) if naive else 1.0,
        },
        "merge": {
            "total_tokens": merges["total"] or 0,
            "unique_tokens": merges["unique"] or 0,
        },
    }
