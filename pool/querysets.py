"""Reusable read filters. Selectors (pool/selectors/) compose these."""

from __future__ import annotations

from django.db import models


class StepQuerySet(models.QuerySet):
    def with_context(self) -> StepQuerySet:
        """What the step representation needs, in one query."""
        return self.select_related("trajectory", "trajectory__group")
