"""Review queues: reviewers claim the next trajectory of a queue and give feedback on it.

Claims are rows with a unique (queue, trajectory): two reviewers never hold the same item
on any database, without locks held across requests. A claim expires after the queue's
``claim_seconds``; another reviewer then takes it over with a conditional UPDATE. The
default queue (every completed trajectory without feedback) always exists.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from pool.errors import Conflict, InvalidInput, NotFound
from pool.ingest import rules
from pool.models import Feedback, Step, Trajectory
from pool.services import RewardIn, feedback_create, rewards_apply

from ..models import ReviewClaim, ReviewQueue
from ..selectors.review import review_candidates
from ..specs import spec_dump, spec_parse

DEFAULT_QUEUE = "default"
# Candidates tried per claim before giving up (each miss means another reviewer took that
# item between our read and our insert).
CLAIM_ATTEMPTS = 20


def review_queue_default() -> ReviewQueue:
    """The default queue: every completed trajectory without feedback. Idempotent."""
    queue = ReviewQueue.objects.filter(is_default=True).first()
    if queue is not None:
        return queue
    try:
        with transaction.atomic():
            return ReviewQueue.objects.create(
                name=DEFAULT_QUEUE,
                is_default=True,
                description="Every completed trajectory without feedback.",
                claim_seconds=settings.CLAW_REVIEW_CLAIM_SECONDS,
            )
    except IntegrityError:  # created concurrently
        return ReviewQueue.objects.get(is_default=True)


@transaction.atomic
def review_queue_create(
    *,
    name: str,
    dataset_id: int | None = None,
    filters: dict | None = None,
    rating_min: float = 1.0,
    rating_max: float = 5.0,
    label_choices: list[str] | None = None,
    ask_correction: bool = False,
    sets_reward: bool = False,
    description: str = "",
) -> ReviewQueue:
    """Create a queue over a dataset or a filter spec. Not idempotent (a name is unique)."""
    if not name or len(name) > 64:
        raise InvalidInput("name must be 1-64 characters", field="name")
    if not rating_min < rating_max:
        raise InvalidInput("rating_min must be below rating_max", field="rating_min")
    spec = (
        spec_dump(spec_parse({"filters": filters or {}}, field=""))["filters"] if dataset_id is None else {}
    )
    if ReviewQueue.objects.filter(name=name).exists():
        raise Conflict(f"review queue {name!r} already exists", field="name")
    return ReviewQueue.objects.create(
        name=name,
        dataset_id=dataset_id,
        filters=spec,
        rating_min=rating_min,
        rating_max=rating_max,
        label_choices=list(label_choices or []),
        ask_correction=ask_correction,
        sets_reward=sets_reward,
        description=description,
        claim_seconds=settings.CLAW_REVIEW_CLAIM_SECONDS,
    )


def review_claim_next(
    *, queue: ReviewQueue, user_id: int, exclude: Collection[int] = ()
) -> ReviewClaim | None:
    """The reviewer's item: the open claim they already hold in this queue, else a new
    claim on the oldest unclaimed item, else None (the queue is empty for now). Safe under
    concurrency: a lost race moves on to the next candidate. ``exclude``: trajectory ids
    not to claim anew (those the reviewer skipped, so Skip moves on)."""
    now = timezone.now()
    held = (
        ReviewClaim.objects.filter(queue=queue, user_id=user_id, done_at__isnull=True, expires_at__gt=now)
        .order_by("claimed_at")
        .first()
    )
    if held is not None:
        return held
    expires = now + timedelta(seconds=queue.claim_seconds)
    skip: list[int] = list(exclude)
    for _ in range(CLAIM_ATTEMPTS):
        candidate = (
            review_candidates(queue, now=now).exclude(id__in=skip).values_list("id", flat=True).first()
        )
        if candidate is None:
            return None
        try:
            with transaction.atomic():
                return ReviewClaim.objects.create(
                    queue=queue, trajectory_id=candidate, user_id=user_id, claimed_at=now, expires_at=expires
                )
        except IntegrityError:
            # A claim row exists: take it over only if it expired undone (one conditional
            # UPDATE, so of two reviewers racing for it exactly one wins).
            taken = ReviewClaim.objects.filter(
                queue=queue, trajectory_id=candidate, done_at__isnull=True, expires_at__lte=now
            ).update(user_id=user_id, claimed_at=now, expires_at=expires)
            if taken:
                return ReviewClaim.objects.get(queue=queue, trajectory_id=candidate)
            skip.append(candidate)
    return None


@transaction.atomic
def review_submit(
    *,
    claim_id: int,
    user_id: int,
    author: str,
    rating: float | None = None,
    label: str = "",
    correction: str = "",
    comment: str = "",
) -> Feedback:
    """Record the reviewer's feedback on their claimed item and close the claim. With a
    queue that ``sets_reward``, the rating rescaled to [0, 1] becomes the trajectory's human
    reward (a RewardEvent audits it, and readiness follows). Not idempotent: a claim that is
    done, or held by someone else, raises Conflict."""
    claim = ReviewClaim.objects.select_for_update().select_related("queue").filter(id=claim_id).first()
    if claim is None:
        raise NotFound(f"review item {claim_id} does not exist", field="claim")
    if claim.user_id != user_id or claim.done_at is not None:
        raise Conflict("this review item is no longer yours to submit", field="claim")
    queue = claim.queue
    if rating is not None:
        rules.check_reward(rating, "rating")
        if not queue.rating_min <= rating <= queue.rating_max:
            raise InvalidInput(
                f"rating must be between {queue.rating_min:g} and {queue.rating_max:g}", field="rating"
            )
    elif queue.sets_reward:
        raise InvalidInput("this queue turns the rating into a reward: give a rating", field="rating")
    if queue.label_choices and label and label not in queue.label_choices:
        raise InvalidInput(f"label must be one of {queue.label_choices}", field="label")
    traj_uid = Trajectory.objects.filter(id=claim.trajectory_id).values_list("uid", flat=True).get()
    feedback = feedback_create(
        trajectory_uid=traj_uid,
        rating=rating,
        label=label,
        correction=correction,
        comment=comment,
        author=author,
        user_id=user_id,
    )
    claim.done_at = timezone.now()
    claim.feedback = feedback
    claim.save(update_fields=["done_at", "feedback"])
    if queue.sets_reward and rating is not None:
        reward = (rating - queue.rating_min) / (queue.rating_max - queue.rating_min)
        rewards_apply(
            rewards=[
                RewardIn(
                    reward=reward,
                    trajectory_uid=traj_uid,
                    source=Step.RewardSource.HUMAN,
                    metadata={"review_queue": queue.name, "feedback_id": feedback.id, "rating": rating},
                )
            ]
        )
    return feedback


def review_release(*, claim_id: int, user_id: int) -> None:
    """Give an item back before its claim expires (skip). Idempotent."""
    ReviewClaim.objects.filter(id=claim_id, user_id=user_id, done_at__isnull=True).delete()
