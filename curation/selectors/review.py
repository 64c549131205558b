"""Reads of the review queues: what a queue reviews (its scope), the items nobody holds
and nobody finished, and each queue's progress. A queue over a dataset or filters reviews
the trajectories with a step the spec admits (curation/selectors/specs.py)."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from pool.models import Feedback, Trajectory

from ..models import ReviewClaim, ReviewQueue
from ..specs import spec_parse
from .specs import dataset_step_rows, spec_compile


def review_scope(queue: ReviewQueue) -> QuerySet:
    """The trajectories a queue reviews, done or not: completed ones, and (default queue)
    those without feedback, or (other queues) those with a step its dataset or filters
    admit at step level."""
    base = Trajectory.objects.filter(status=Trajectory.Status.COMPLETED)
    if queue.is_default:
        return base
    if queue.dataset_id is not None and queue.dataset.current_id is not None:
        spec = spec_parse(queue.dataset.current.spec)
    else:
        spec = spec_parse({"filters": queue.filters or {}})
    c = spec_compile(spec)
    steps = dataset_step_rows(c).filter(c.passes, trajectory_id=OuterRef("pk"))
    return base.filter(Exists(steps))


def _has_feedback() -> Q:
    return Q(Exists(Feedback.objects.filter(trajectory_id=OuterRef("pk")))) | Q(
        Exists(Feedback.objects.filter(step__trajectory_id=OuterRef("pk")))
    )


def review_candidates(queue: ReviewQueue, *, now: datetime) -> QuerySet:
    """Items nobody holds and nobody finished, oldest completion first."""
    held_or_done = ReviewClaim.objects.filter(queue=queue, trajectory_id=OuterRef("pk")).filter(
        Q(done_at__isnull=False) | Q(expires_at__gt=now)
    )
    qs = review_scope(queue).filter(~Exists(held_or_done))
    if queue.is_default:
        qs = qs.filter(~_has_feedback())
    return qs.order_by("completed_at", "id")


def review_progress(queue: ReviewQueue) -> dict[str, int]:
    """{"done", "total", "held"}: for the progress bar."""
    scope = review_scope(queue)
    if queue.is_default:
        total = scope.count()
        done = scope.filter(_has_feedback()).count()
    else:
        total = scope.count()
        done = ReviewClaim.objects.filter(queue=queue, done_at__isnull=False).count()
    held = ReviewClaim.objects.filter(
        queue=queue, done_at__isnull=True, expires_at__gt=timezone.now()
    ).count()
    return {"done": done, "total": total, "held": held}


def review_queues_list() -> list[tuple[ReviewQueue, dict[str, int]]]:
    """Every review queue (default first) with its progress: three counts per queue, and
    queues are few (an operator creates each by hand)."""
    queues = ReviewQueue.objects.select_related("dataset__current").order_by("-is_default", "name")
    return [(q, review_progress(q)) for q in queues]


def review_queue_get(name: str) -> ReviewQueue | None:
    return ReviewQueue.objects.select_related("dataset__current").filter(name=name).first()
