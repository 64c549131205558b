"""Reusable read filters. Selectors (pool/selectors.py) compose these."""

from __future__ import annotations

from django.db import models


class StepQuerySet(models.QuerySet):
    def for_trajectory_uid(self, uid: str) -> StepQuerySet:
        return self.filter(trajectory__uid=uid)

    def for_group_uid(self, uid: str) -> StepQuerySet:
        return self.filter(trajectory__group__uid=uid)

    def reward_pending(self) -> StepQuerySet:
        return self.filter(reward_status="pending")

    def with_context(self) -> StepQuerySet:
        """What the step representation needs, in one query."""
        return self.select_related("trajectory", "trajectory__group")


class TrajectoryQuerySet(models.QuerySet):
    def running(self) -> TrajectoryQuerySet:
        return self.filter(status="running")

    def completed(self) -> TrajectoryQuerySet:
        return self.filter(status="completed")
