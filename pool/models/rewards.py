"""Rewards: the audit of every reward change, reward functions by name, and failed computations."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from .access import Source
from .steps import Step, Trajectory


class RewardEvent(models.Model):
    """Audit trail: every reward set or changed, on a step or a trajectory."""

    step = models.ForeignKey(
        Step, null=True, blank=True, on_delete=models.CASCADE, related_name="reward_events"
    )
    trajectory = models.ForeignKey(
        Trajectory, null=True, blank=True, on_delete=models.CASCADE, related_name="reward_events"
    )
    old_reward = models.FloatField(null=True, blank=True)
    new_reward = models.FloatField()
    reward_source = models.CharField(max_length=8, choices=Step.RewardSource.choices)
    final = models.BooleanField(default=True)
    source = models.ForeignKey(Source, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(step__isnull=False) | Q(trajectory__isnull=False), name="reward_event_has_target"
            )
        ]
        indexes = [
            # Audit listing: "reward history, newest first".
            models.Index(fields=["created_at"], name="reward_event_created"),
        ]

    def __str__(self) -> str:
        return f"{self.old_reward} -> {self.new_reward} ({self.reward_source})"


class RewardFunction(models.Model):
    """A reward function the pool computes itself (pool/rewards/), named by a data source or
    a dataset. Rows here override settings.CLAW_REWARD_FUNCTIONS for the same name; a
    disabled row switches the name off (also one that settings define)."""

    name = models.CharField(max_length=128, unique=True, help_text="A data source or dataset name.")
    path = models.CharField(
        max_length=255, help_text="Dotted path of the function, e.g. pool.rewards.builtin.gsm8k."
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} -> {self.path}{'' if self.enabled else ' (disabled)'}"


class RewardFailure(models.Model):
    """A computed reward that could not be made (the function raised, the text is unknown,
    the judge failed). One row per trajectory and data source, updated on a retry and removed
    once the reward is made; the trajectory's other rewards are unaffected."""

    trajectory = models.ForeignKey(
        Trajectory, on_delete=models.CASCADE, related_name="reward_failures", db_index=False
    )
    step = models.ForeignKey(Step, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    data_source = models.CharField(max_length=128)
    function = models.CharField(max_length=255, blank=True, default="")
    error = models.TextField()
    attempts = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            # Also serves "failures of a trajectory" (the upsert and its removal on success).
            models.UniqueConstraint(fields=["trajectory", "data_source"], name="reward_failure_traj_uniq"),
        ]
        indexes = [
            # Admin listing: "latest failures first".
            models.Index(fields=["updated_at"], name="reward_failure_updated"),
        ]

    def __str__(self) -> str:
        return f"{self.data_source} on {self.trajectory_id}: {self.error[:60]}"
