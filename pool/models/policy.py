"""Policies and their versions (the freshness of a step), and which sources own a policy."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from .access import Source


class PolicyVersion(models.Model):
    """A version of the policy being trained. The version number is the primary key, so a
    step's ``policy_version_id`` *is* the number and freshness filters need no join."""

    version = models.PositiveBigIntegerField(primary_key=True)
    is_current = models.BooleanField(default=False)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            # At most one current version; set_current flips it inside one transaction.
            models.UniqueConstraint(
                fields=["is_current"], condition=Q(is_current=True), name="policy_one_current"
            ),
        ]

    def __str__(self) -> str:
        return f"v{self.version}{' (current)' if self.is_current else ''}"


class Policy(models.Model):
    """A named policy being trained, with its own current version (pool/services/policy.py).

    ``default`` is the one policy of before named policies: its current version is also
    marked on PolicyVersion.is_current, which the pool's overview, stats and defaults read.
    Version numbers are one space (PolicyVersion, the number a step carries); each policy
    has its current one here, and a dataset follows one policy's freshness
    (curation.specs.Filters.policy). Owned by sources (PolicyOwner): a policy key moves only
    the policies of its sources; the first one to move an unowned policy owns it."""

    name = models.CharField(max_length=64, unique=True)
    current_version = models.PositiveBigIntegerField(null=True, blank=True)
    # The window that bounds how far the current version moves per minute
    # (CLAW_POLICY_MAX_ADVANCE_PER_MINUTE): its start and the versions advanced in it.
    window_started_at = models.DateTimeField(null=True, blank=True)
    window_advance = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    DEFAULT = "default"

    class Meta:
        verbose_name_plural = "policies"

    def __str__(self) -> str:
        return f"{self.name} (v{self.current_version})"


class PolicyOwner(models.Model):
    """A source that owns a policy: its policy keys move that policy's versions."""

    policy = models.ForeignKey(Policy, on_delete=models.CASCADE, related_name="owners", db_index=False)
    source = models.ForeignKey(Source, on_delete=models.CASCADE, related_name="+", db_index=False)

    class Meta:
        constraints = [
            # One row per (policy, source); serves "may these sources move this policy".
            models.UniqueConstraint(fields=["policy", "source"], name="policyowner_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.policy_id} owned by source {self.source_id}"
