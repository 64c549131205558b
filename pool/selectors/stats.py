"""Reads of the whole pool's counts and token economics (``GET /api/v1/stats``)."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Q, Sum
from django.db.models.functions import Length

from .. import tokens
from ..flags import READY, Readiness
from ..models import Event, Feedback, MergeResult, PolicyVersion, PromptGroup, Step, Trajectory

# Readiness values without a final effective reward.
AWAITING_REWARD_VALUES = [v for v in range(READY + 1) if not v & int(Readiness.REWARD_FINAL)]


def pool_stats() -> dict[str, Any]:
    """Counts and token economics of the whole pool (a handful of aggregate queries)."""
    steps = Step.objects.aggregate(
        steps=Count("id"),
        # Steps without a final effective reward (the REWARD_FINAL bit: its own, its
        # branch's or its trajectory's), the dashboard's "awaiting reward": never a ready step.
        reward_pending=Count("id", filter=Q(readiness__in=AWAITING_REWARD_VALUES)),
        drift=Count("id", filter=Q(drift=True)),
        tokens=Sum("seq_len"),
    )
    traj = dict(Trajectory.objects.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    groups = dict(
        PromptGroup.objects.values_list("status").annotate(n=Count("id")).values_list("status", "n")
    )
    stored = _stored_token_bytes()
    current = PolicyVersion.objects.filter(is_current=True).values_list("version", flat=True).first()
    merges = MergeResult.objects.filter(status=MergeResult.Status.DONE).aggregate(
        total=Sum("total_tokens"), unique=Sum("unique_tokens")
    )
    naive = (steps["tokens"] or 0) * tokens.TOKEN_BYTES
    return {
        "steps": steps["steps"],
        "steps_reward_pending": steps["reward_pending"],
        "steps_drift": steps["drift"],
        "trajectories": sum(traj.values()),
        "trajectories_by_status": traj,
        "groups": sum(groups.values()),
        "groups_by_status": groups,
        "events": Event.objects.count(),
        "feedback": Feedback.objects.count(),
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


def _stored_token_bytes() -> int:
    # LENGTH() of a blob/bytea is its size in bytes on both SQLite and PostgreSQL.
    return Step.objects.aggregate(n=Sum(Length("seq_delta")))["n"] or 0
