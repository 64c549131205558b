"""Reads of what black-box services tell the pool: their events and feedback, listed for the
API's pages, and their API representations."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from ..models import Event, Feedback
from ..tenancy import Sources
from ..tenancy import q as of_sources


def events_listed(sources: Sources = None) -> QuerySet[Event]:
    """The events ``GET /api/v1/events`` pages through (filters and cursor: the view's),
    with what ``event_render`` reads joined: those ``sources`` recorded or that name their
    trajectories (pool/tenancy.py; None: all)."""
    qs = Event.objects.select_related("trajectory", "step")
    if sources is None:
        return qs
    return qs.filter(of_sources("source_id", sources) | of_sources("trajectory__source_id", sources))


def event_render(e: Event) -> dict[str, Any]:
    return {
        "id": e.id,
        "type": e.type,
        "payload": e.payload,
        "occurred_at": e.occurred_at,
        "trajectory_uid": e.trajectory.uid if e.trajectory_id else None,
        "step_uid": e.step.uid if e.step_id else None,
        "created_at": e.created_at,
    }


def feedback_listed(sources: Sources = None) -> QuerySet[Feedback]:
    """The feedback ``GET /api/v1/feedback`` pages through (filters and cursor: the view's),
    with what ``feedback_render`` reads joined: that ``sources`` gave or on their steps and
    trajectories (pool/tenancy.py; None: all)."""
    qs = Feedback.objects.select_related("trajectory", "step")
    if sources is None:
        return qs
    return qs.filter(
        of_sources("source_id", sources)
        | of_sources("trajectory__source_id", sources)
        | of_sources("step__trajectory__source_id", sources)
    )


def feedback_render(f: Feedback) -> dict[str, Any]:
    return {
        "id": f.id,
        "step_uid": f.step.uid if f.step_id else None,
        "trajectory_uid": f.trajectory.uid if f.trajectory_id else None,
        "rating": f.rating,
        "label": f.label,
        "correction": f.correction,
        "comment": f.comment,
        "author": f.author,
        "created_at": f.created_at,
    }
