"""Review queues: reviewers claim the next item of a queue and give feedback on it.

Claims are rows with a unique (queue, trajectory, slot): an item has ``reviews_per_item``
slots, so never more reviewers than that hold or finish it, on any database, without locks
held across requests; a reviewer never finishes two slots of one item. A claim expires after
the queue's ``claim_seconds``; another reviewer then takes it over with a conditional
UPDATE. The default queue (every completed trajectory without feedback) always exists.

A submission is checked against the queue's score schema (``review_check``: the rating's
range, whole stars, the label choices, one label or several). In group mode an item is a
prompt group: the reviewer ranks its rollouts (or picks the best), each rollout gets a
Feedback, and with ``group_reward`` "best" (1 for the best, 0 for the others) or "rank"
(rank r of n: (n - r) / (n - 1)) a human reward through rewards_apply, audited like every
reward write.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from pool.errors import Conflict, InvalidInput, NotFound
from pool.ingest import rules
from pool.models import Feedback, Step, Trajectory
from pool.services.rewards import RewardIn, rewards_apply
from pool.services.service_events import feedback_create

from ..models import GROUP_REWARDS, MODE_GROUP, MODE_TRAJECTORY, MODES, ReviewClaim, ReviewQueue
from ..selectors.review import review_candidates, review_rollouts
from ..specs import spec_dump, spec_parse

DEFAULT_QUEUE = "default"
# Candidates tried per claim before giving up (each miss means another reviewer took that
# item between our read and our insert).
CLAIM_ATTEMPTS = 20
MAX_REVIEWS_PER_ITEM = 20


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


def _schema_check(
    *,
    rating_min: float,
    rating_max: float,
    label_choices: list[str],
    mode: str,
    group_reward: str,
    reviews_per_item: int,
) -> None:
    if not rating_min < rating_max:
        raise InvalidInput("rating_min must be below rating_max", field="rating_min")
    for choice in label_choices:
        if not choice or len(choice) > 64 or "," in choice:
            raise InvalidInput("each label is 1-64 characters, without a comma", field="label_choices")
    if len(set(label_choices)) != len(label_choices):
        raise InvalidInput("label choices must be distinct", field="label_choices")
    if mode not in dict(MODES):
        raise InvalidInput(f"mode must be one of {[m for m, _ in MODES]}", field="mode")
    if group_reward not in dict(GROUP_REWARDS):
        raise InvalidInput(
            f"group_reward must be one of {[g for g, _ in GROUP_REWARDS]}", field="group_reward"
        )
    if group_reward != "none" and mode != MODE_GROUP:
        raise InvalidInput("group_reward needs mode 'group'", field="group_reward")
    if not 1 <= reviews_per_item <= MAX_REVIEWS_PER_ITEM:
        raise InvalidInput(f"reviews_per_item must be 1-{MAX_REVIEWS_PER_ITEM}", field="reviews_per_item")


def _filters(dataset_id: int | None, filters: dict | None) -> dict:
    return (
        spec_dump(spec_parse({"filters": filters or {}}, field=""))["filters"] if dataset_id is None else {}
    )


@transaction.atomic
def review_queue_create(
    *,
    name: str,
    dataset_id: int | None = None,
    filters: dict | None = None,
    rating_min: float = 1.0,
    rating_max: float = 5.0,
    label_choices: list[str] | None = None,
    label_multi: bool = False,
    ask_correction: bool = False,
    sets_reward: bool = False,
    description: str = "",
    guidelines: str = "",
    mode: str = MODE_TRAJECTORY,
    group_reward: str = "none",
    reviews_per_item: int = 1,
) -> ReviewQueue:
    """Create a queue over a dataset or a filter spec. Not idempotent (a name is unique)."""
    if not name or len(name) > 64:
        raise InvalidInput("name must be 1-64 characters", field="name")
    labels = list(label_choices or [])
    _schema_check(
        rating_min=rating_min,
        rating_max=rating_max,
        label_choices=labels,
        mode=mode,
        group_reward=group_reward,
        reviews_per_item=reviews_per_item,
    )
    if sets_reward and mode == MODE_GROUP:
        raise InvalidInput("in group mode the ranking sets rewards: use group_reward", field="sets_reward")
    spec = _filters(dataset_id, filters)
    if ReviewQueue.objects.filter(name=name).exists():
        raise Conflict(f"review queue {name!r} already exists", field="name")
    return ReviewQueue.objects.create(
        name=name,
        dataset_id=dataset_id,
        filters=spec,
        rating_min=rating_min,
        rating_max=rating_max,
        label_choices=labels,
        label_multi=label_multi,
        ask_correction=ask_correction,
        sets_reward=sets_reward,
        description=description,
        guidelines=guidelines,
        mode=mode,
        group_reward=group_reward,
        reviews_per_item=reviews_per_item,
        claim_seconds=settings.CLAW_REVIEW_CLAIM_SECONDS,
    )


@transaction.atomic
def review_queue_update(
    *,
    queue_id: int,
    description: str,
    guidelines: str,
    dataset_id: int | None = None,
    filters: dict | None = None,
    reviews_per_item: int | None = None,
) -> ReviewQueue:
    """Edit what can change under a queue's existing feedback: its words, its guidelines,
    its scope and how many reviews an item needs (the score schema stays, so earlier
    feedback keeps its meaning). The default queue keeps its scope."""
    queue = ReviewQueue.objects.select_for_update().filter(id=queue_id).first()
    if queue is None:
        raise NotFound(f"review queue {queue_id} does not exist", field="queue")
    rpi = queue.reviews_per_item if reviews_per_item is None else reviews_per_item
    if not 1 <= rpi <= MAX_REVIEWS_PER_ITEM:
        raise InvalidInput(f"reviews_per_item must be 1-{MAX_REVIEWS_PER_ITEM}", field="reviews_per_item")
    if queue.is_default and rpi != 1:
        # Its items are the trajectories without feedback: a first review ends them.
        raise InvalidInput("the default queue reviews each item once", field="reviews_per_item")
    queue.description, queue.guidelines, queue.reviews_per_item = description, guidelines, rpi
    fields = ["description", "guidelines", "reviews_per_item"]
    if not queue.is_default:
        queue.dataset_id, queue.filters = dataset_id, _filters(dataset_id, filters)
        fields += ["dataset", "filters"]
    queue.save(update_fields=fields)
    return queue


def review_claim_next(
    *, queue: ReviewQueue, user_id: int, exclude: Collection[int] = (), prefer: int | None = None
) -> ReviewClaim | None:
    """The reviewer's item: the open claim they already hold in this queue, else a new
    claim on the oldest item with a free slot that they have not reviewed, else None (the
    queue is empty for now). Safe under concurrency: a lost race moves on to the next slot
    or candidate. ``exclude``: items (trajectory ids; group ids in group mode) not to claim
    anew (those the reviewer skipped, so Skip moves on); ``prefer``: the item to claim
    first if it is free (going back to the previous item)."""
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
    fields = ("pk", "first") if queue.is_group else ("pk", "pk")
    for _ in range(CLAIM_ATTEMPTS):
        qs = review_candidates(queue, now=now, user_id=user_id).exclude(pk__in=skip)
        row = None
        if prefer is not None and prefer not in skip:
            row = qs.filter(pk=prefer).values_list(*fields).first()
        if row is None:
            row = qs.values_list(*fields).first()
        if row is None:
            return None
        claim = _claim_slot(queue, row, user_id=user_id, now=now, expires=expires)
        if claim is not None:
            return claim
        skip.append(row[0])
    return None


def _claim_slot(
    queue: ReviewQueue, row: tuple[int, int], *, user_id: int, now: datetime, expires: datetime
) -> ReviewClaim | None:
    """Claim a free slot of one item (``row``: its key and its trajectory), or None."""
    item, trajectory_id = row
    group_id = item if queue.is_group else None
    for slot in range(queue.reviews_per_item):
        try:
            with transaction.atomic():
                return ReviewClaim.objects.create(
                    queue=queue,
                    trajectory_id=trajectory_id,
                    group_id=group_id,
                    slot=slot,
                    user_id=user_id,
                    claimed_at=now,
                    expires_at=expires,
                )
        except IntegrityError:
            # The slot's row exists: take it over only if it expired undone (one
            # conditional UPDATE, so of two reviewers racing for it exactly one wins).
            taken = ReviewClaim.objects.filter(
                queue=queue, trajectory_id=trajectory_id, slot=slot, done_at__isnull=True, expires_at__lte=now
            ).update(user_id=user_id, claimed_at=now, expires_at=expires)
            if taken:
                return ReviewClaim.objects.get(queue=queue, trajectory_id=trajectory_id, slot=slot)
    return None


def _claim_for_submit(claim_id: int, user_id: int) -> ReviewClaim:
    """The reviewer's open claim, locked; NotFound or Conflict otherwise (also when they
    already finished this item in another slot)."""
    claim = ReviewClaim.objects.select_for_update().select_related("queue").filter(id=claim_id).first()
    if claim is None:
        raise NotFound(f"review item {claim_id} does not exist", field="claim")
    if claim.user_id != user_id or claim.done_at is not None:
        raise Conflict("this review item is no longer yours to submit", field="claim")
    twice = (
        ReviewClaim.objects.filter(
            queue_id=claim.queue_id, trajectory_id=claim.trajectory_id, user_id=user_id, done_at__isnull=False
        )
        .exclude(id=claim.id)
        .exists()
    )
    if twice:
        raise Conflict("you already reviewed this item in this queue", field="claim")
    return claim


def review_check(queue: ReviewQueue, *, rating: float | None, labels: list[str]) -> tuple[float | None, str]:
    """The rating and the stored label (labels joined by commas) a submission gives, checked
    against the queue's score schema; InvalidInput naming the field otherwise."""
    if rating is not None:
        rules.check_rating(rating, "rating")
        if not queue.rating_min <= rating <= queue.rating_max:
            raise InvalidInput(
                f"rating must be between {queue.rating_min:g} and {queue.rating_max:g}", field="rating"
            )
        if queue.rating_widget == "stars" and rating != int(rating):
            raise InvalidInput("rating must be a whole number of stars", field="rating")
    elif queue.sets_reward:
        raise InvalidInput("this queue turns the rating into a reward: give a rating", field="rating")
    labels = [x.strip() for x in labels if x.strip()]
    if len(labels) > 1 and not queue.label_multi:
        raise InvalidInput("this queue takes one label", field="label")
    if len(set(labels)) != len(labels):
        raise InvalidInput("a label is given twice", field="label")
    if queue.label_choices:
        for label in labels:
            if label not in queue.label_choices:
                raise InvalidInput(f"label must be one of {queue.label_choices}", field="label")
    elif any("," in x for x in labels):
        raise InvalidInput("a label has no comma", field="label")
    stored = ",".join(labels)
    if len(stored) > 64:
        raise InvalidInput("labels are at most 64 characters together", field="label")
    return rating, stored


@transaction.atomic
def review_submit(
    *,
    claim_id: int,
    user_id: int,
    author: str,
    rating: float | None = None,
    label: str = "",
    labels: list[str] | None = None,
    correction: str = "",
    comment: str = "",
) -> Feedback:
    """Record the reviewer's feedback on their claimed item and close the claim. With a
    queue that ``sets_reward``, the rating rescaled to [0, 1] becomes the trajectory's human
    reward (a RewardEvent audits it, and readiness follows). ``labels``: several labels (a
    queue with ``label_multi``), stored joined by commas; else ``label``. Not idempotent: a
    claim that is done, or held by someone else, raises Conflict."""
    claim = _claim_for_submit(claim_id, user_id)
    queue = claim.queue
    if queue.is_group:
        raise InvalidInput("a group is reviewed by ranking its rollouts", field="ranking")
    rating, stored = review_check(queue, rating=rating, labels=labels if labels is not None else [label])
    traj_uid = Trajectory.objects.filter(id=claim.trajectory_id).values_list("uid", flat=True).get()
    feedback = feedback_create(
        trajectory_uid=traj_uid,
        rating=rating,
        label=stored,
        correction=correction,
        comment=comment,
        author=author,
        user_id=user_id,
        sources=None,  # a reviewer reviews every source's trajectories
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
            ],
            sources=None,
        )
    return feedback


def group_scores(ranking: list[int], rollouts: list[int], *, best_only: bool) -> dict[int, tuple[float, str]]:
    """Each rollout's score and label from a ranking (trajectory ids, best first): picking
    the best gives it 1 and the others 0; a full ranking gives rank r of n (r = 1 best)
    (n - r) / (n - 1)."""
    n = len(rollouts)
    if best_only:
        return {t: (1.0, "best") if t == ranking[0] else (0.0, "not best") for t in rollouts}
    return {t: ((n - r) / (n - 1), f"rank {r}/{n}") for r, t in enumerate(ranking, start=1)}


@transaction.atomic
def review_submit_group(
    *, claim_id: int, user_id: int, author: str, ranking: list[int], comment: str = ""
) -> list[Feedback]:
    """Group mode: the reviewer's ranking of a group's rollouts (trajectory ids, best first;
    with ``group_reward == "best"`` the best one alone suffices). Each rollout gets a
    Feedback (its score in [0, 1] as the rating, "rank r/n" or "best"/"not best" as the
    label; the comment on the best one), and, if the queue says so, the score as its human
    reward: trajectory-scoped, audited by RewardEvents, so readiness and the effective
    rewards follow. The claim points at the best rollout's feedback."""
    claim = _claim_for_submit(claim_id, user_id)
    queue = claim.queue
    if not queue.is_group or claim.group_id is None:
        raise InvalidInput("this queue reviews one trajectory at a time: give a rating", field="rating")
    rollouts = [t.id for t in review_rollouts(queue, claim.group_id)]
    uids = dict(Trajectory.objects.filter(id__in=rollouts).values_list("id", "uid"))
    best_only = queue.group_reward == "best"  # the first named is the best, whatever follows
    if not ranking:
        raise InvalidInput("rank the rollouts (or pick the best)", field="ranking")
    if len(set(ranking)) != len(ranking) or any(t not in uids for t in ranking):
        raise InvalidInput("the ranking names each rollout of this group once", field="ranking")
    if not best_only and len(ranking) != len(rollouts):  # a full ranking otherwise
        raise InvalidInput(f"rank all {len(rollouts)} rollouts, each once", field="ranking")
    scores = group_scores(ranking, rollouts, best_only=best_only)
    feedback: dict[int, Feedback] = {}
    for t in rollouts:
        score, label = scores[t]
        feedback[t] = feedback_create(
            trajectory_uid=uids[t],
            rating=score,
            label=label,
            comment=comment if t == ranking[0] else "",
            author=author,
            user_id=user_id,
            sources=None,
        )
    claim.done_at = timezone.now()
    claim.feedback = feedback[ranking[0]]
    claim.save(update_fields=["done_at", "feedback"])
    if queue.group_reward != "none":
        rewards_apply(
            rewards=[
                RewardIn(
                    reward=scores[t][0],
                    trajectory_uid=uids[t],
                    source=Step.RewardSource.HUMAN,
                    metadata={
                        "review_queue": queue.name,
                        "feedback_id": feedback[t].id,
                        "group_reward": queue.group_reward,
                        "ranking": scores[t][1],
                    },
                )
                for t in rollouts
            ],
            sources=None,
        )
    return [feedback[t] for t in rollouts]


def review_release(*, claim_id: int, user_id: int) -> None:
    """Give an item back before its claim expires (skip). Idempotent."""
    ReviewClaim.objects.filter(id=claim_id, user_id=user_id, done_at__isnull=True).delete()
