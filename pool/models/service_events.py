"""What black-box services tell the pool: live events and feedback (human or automatic)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from .access import Source
from .steps import Step, Trajectory


class Event(models.Model):
    """A raw event from a black-box service (or the gateway itself: upstream faults)."""

    type = models.CharField(max_length=64)
    source = models.ForeignKey(Source, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    trajectory = models.ForeignKey(
        Trajectory, null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    step = models.ForeignKey(Step, null=True, blank=True, on_delete=models.SET_NULL, related_name="events")
    payload = models.JSONField(default=dict, blank=True)
    occurred_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [
            # Event feed: "events of type T, newest first".
            models.Index(fields=["type", "created_at"], name="event_type_created"),
            # Live feed and retention.
            models.Index(fields=["created_at"], name="event_created"),
        ]

    def __str__(self) -> str:
        return f"{self.type} #{self.pk}"


class Feedback(models.Model):
    """Human or service feedback on a step or a trajectory."""

    step = models.ForeignKey(Step, null=True, blank=True, on_delete=models.CASCADE, related_name="feedback")
    trajectory = models.ForeignKey(
        Trajectory, null=True, blank=True, on_delete=models.CASCADE, related_name="feedback"
    )
    rating = models.FloatField(null=True, blank=True)
    label = models.CharField(max_length=64, blank=True, default="")
    correction = models.TextField(blank=True, default="")
    comment = models.TextField(blank=True, default="")
    author = models.CharField(max_length=128, blank=True, default="")
    source = models.ForeignKey(Source, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "feedback"
        constraints = [
            models.CheckConstraint(
                condition=Q(step__isnull=False) | Q(trajectory__isnull=False), name="feedback_has_target"
            )
        ]
        indexes = [
            # Review queue: "feedback with label L, newest first".
            models.Index(fields=["label", "created_at"], name="feedback_label_created"),
        ]

    def __str__(self) -> str:
        return f"feedback #{self.pk} {self.label}".strip()
