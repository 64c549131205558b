"""Service events and human/service feedback."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from ..bus import FeedbackRecorded, emit
from ..errors import InvalidInput, NotFound
from ..ingest import rules
from ..models import Event, Feedback, Step, Trajectory
from ..tenancy import OWN, allowed
from ..tenancy import q as of_sources


@dataclass(slots=True)
class EventIn:
    type: str
    payload: dict = field(default_factory=dict)
    trajectory_uid: str | None = None
    step_uid: str | None = None
    occurred_at: dt.datetime | None = None
    field_prefix: str = ""


@transaction.atomic
def event_record(
    *, events: list[EventIn], source_id: int | None = None, sources: object = OWN
) -> list[Event]:
    """Store raw events atomically. Not idempotent (events have no client key); referenced
    trajectories and steps must exist within ``sources`` (pool/tenancy.py), else NotFound."""
    for e in events:
        rules.check_name(e.type, f"{e.field_prefix}type")
    mine = allowed(source_id, sources)
    traj_ids = dict(
        Trajectory.objects.filter(uid__in={e.trajectory_uid for e in events if e.trajectory_uid})
        .filter(of_sources("source_id", mine))
        .values_list("uid", "id")
    )
    step_ids = dict(
        Step.objects.filter(uid__in={e.step_uid for e in events if e.step_uid})
        .filter(of_sources("trajectory__source_id", mine))
        .values_list("uid", "id")
    )
    rows = []
    for e in events:
        if e.trajectory_uid and e.trajectory_uid not in traj_ids:
            raise NotFound(
                f"trajectory {e.trajectory_uid!r} does not exist", field=f"{e.field_prefix}trajectory_uid"
            )
        if e.step_uid and e.step_uid not in step_ids:
            raise NotFound(f"step {e.step_uid!r} does not exist", field=f"{e.field_prefix}step_uid")
        rows.append(
            Event(
                type=e.type,
                payload=e.payload,
                source_id=source_id,
                occurred_at=e.occurred_at,
                trajectory_id=traj_ids.get(e.trajectory_uid or ""),
                step_id=step_ids.get(e.step_uid or ""),
            )
        )
    return Event.objects.bulk_create(rows)


@transaction.atomic
def feedback_create(
    *,
    step_uid: str | None = None,
    trajectory_uid: str | None = None,
    rating: float | None = None,
    label: str = "",
    correction: str = "",
    comment: str = "",
    author: str = "",
    source_id: int | None = None,
    user_id: int | None = None,
    sources: object = OWN,
) -> Feedback:
    """Record feedback on a step or a trajectory. Not idempotent (each call is one opinion).
    A step or trajectory outside ``sources`` (pool/tenancy.py) is NotFound."""
    if (step_uid is None) == (trajectory_uid is None):
        raise InvalidInput("give exactly one of step_uid or trajectory_uid", field="step_uid")
    rules.check_rating(rating)
    rules.check_name(label, "label")
    mine = allowed(source_id, sources)
    step = traj = None
    if step_uid is not None:
        step = (
            Step.objects.filter(uid=step_uid)
            .filter(of_sources("trajectory__source_id", mine))
            .only("id", "trajectory_id")
            .first()
        )
        if step is None:
            raise NotFound(f"step {step_uid!r} does not exist", field="step_uid")
    else:
        traj = (
            Trajectory.objects.filter(uid=trajectory_uid)
            .filter(of_sources("source_id", mine))
            .only("id")
            .first()
        )
        if traj is None:
            raise NotFound(f"trajectory {trajectory_uid!r} does not exist", field="trajectory_uid")
    feedback = Feedback.objects.create(
        step=step,
        trajectory=traj,
        rating=rating,
        label=label,
        correction=correction,
        comment=comment,
        author=author,
        source_id=source_id,
        user_id=user_id,
    )
    emit(FeedbackRecorded(feedback_id=feedback.id))
    return feedback


def gateway_event_record(
    *,
    type: str,
    payload: dict,
    trajectory_uid: str | None = None,
    source_id: int | None = None,
    sources: object = OWN,
) -> Event:
    """Record a gateway event (an upstream fault, an untokenized or unrecorded call).

    Links the trajectory when it exists within ``sources`` (pool/tenancy.py; never creates
    one: a failed first call leaves no empty trajectory behind); the uid is always in the
    payload. Not idempotent.
    """
    traj_id = None
    if trajectory_uid:
        payload = {"trajectory_uid": trajectory_uid, **payload}
        traj_id = (
            Trajectory.objects.filter(uid=trajectory_uid)
            .filter(of_sources("source_id", allowed(source_id, sources)))
            .values_list("id", flat=True)
            .first()
        )
    return Event.objects.create(
        type=type, payload=payload, trajectory_id=traj_id, source_id=source_id, occurred_at=timezone.now()
    )
