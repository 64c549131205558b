"""Reads of policy versions: listed newest first, rendered for the API, and a policy's
current version."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from ..models import Policy, PolicyVersion

# Policy versions ``GET /api/v1/policy-versions`` returns at most, newest first.
POLICY_VERSIONS_SHOWN = 1000


def policy_versions_listed() -> QuerySet[PolicyVersion]:
    """Every policy version, newest first."""
    return PolicyVersion.objects.order_by("-version")


def policy_versions_list(limit: int = POLICY_VERSIONS_SHOWN) -> list[PolicyVersion]:
    """The newest ``limit`` policy versions, newest first."""
    return list(policy_versions_listed()[:limit])


def policy_version_render(p: PolicyVersion) -> dict[str, Any]:
    return {"version": p.version, "is_current": p.is_current, "metadata": p.metadata}


def policy_current_version(name: str) -> int | None:
    """The current version of policy ``name`` (pool.models.Policy), None when it has none
    or does not exist. ``default``'s is PolicyVersion.is_current's. One query."""
    return next(iter(policy_current_version_query(name)), None)


def policy_current_version_query(name: str) -> QuerySet:
    """The query of ``policy_current_version``: at most one row of one column, for a caller
    that reads it inside a statement of its own (a kept dataset count's read)."""
    if name == Policy.DEFAULT:
        return (
            PolicyVersion.objects.filter(is_current=True)
            .order_by("version")
            .values_list("version", flat=True)[:1]
        )
    return Policy.objects.filter(name=name).order_by("id").values_list("current_version", flat=True)[:1]
