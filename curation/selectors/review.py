"""Reads of the review queues: what a queue reviews (its scope), the items a reviewer may
claim, each queue's progress (overall and per reviewer) and the reviewers' agreement.

A queue over a dataset or filters reviews the trajectories with a step the spec admits
(curation/selectors/specs.py). In group mode an item is a prompt group: one whose rollouts
are all finished, with at least two of them completed in the trajectory scope. An item has
``reviews_per_item`` slots; it leaves the queue once that many distinct reviewers did it.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from itertools import combinations
from typing import Any

from django.db.models import Count, Exists, IntegerField, Min, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from claw_kit.llm.tokenizer import get_tokenizer
from pool.models import Feedback, PromptGroup, Step, Trajectory

from ..models import ReviewClaim, ReviewQueue
from ..specs import spec_parse
from .specs import dataset_step_rows, spec_compile
from .timeline import _messages_text

RATING_AGREEMENT = "mean absolute pairwise difference"
LABEL_AGREEMENT = "percent agreement"
MIN_ROLLOUTS = 2


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


def review_group_scope(queue: ReviewQueue) -> QuerySet:
    """Group mode: the prompt groups a queue reviews, done or not, each annotated with
    ``first`` (its lowest trajectory id: the claim's trajectory) and ``rollouts`` (its
    completed rollouts in scope). No rollout still running."""
    in_scope = review_scope(queue).filter(group_id=OuterRef("pk"))
    running = Trajectory.objects.filter(group_id=OuterRef("pk"), status=Trajectory.Status.RUNNING)
    counted = in_scope.order_by().values("group_id").annotate(n=Count("id")).values("n")
    return (
        PromptGroup.objects.filter(~Exists(running))
        .annotate(rollouts=Coalesce(Subquery(counted, output_field=IntegerField()), 0))
        .filter(rollouts__gte=MIN_ROLLOUTS)
        .annotate(first=Min("trajectories__id"))
    )


def review_rollouts(queue: ReviewQueue, group_id: int) -> list[Trajectory]:
    """Group mode: the rollouts of one group shown side by side (completed, in scope), in id
    order, so "rollout 1" is the same one for every reviewer."""
    return list(review_scope(queue).filter(group_id=group_id).order_by("id"))


def _has_feedback() -> Q:
    return Q(Exists(Feedback.objects.filter(trajectory_id=OuterRef("pk")))) | Q(
        Exists(Feedback.objects.filter(step__trajectory_id=OuterRef("pk")))
    )


def _key(queue: ReviewQueue) -> str:
    return "group_id" if queue.is_group else "trajectory_id"


def review_candidates(queue: ReviewQueue, *, now: datetime, user_id: int | None = None) -> QuerySet:
    """Items with a free slot that ``user_id`` has not done nor holds, oldest first:
    trajectories (oldest completion first), or in group mode prompt groups (oldest first,
    ``first`` annotated)."""
    key = _key(queue)
    active = Q(done_at__isnull=False) | Q(expires_at__gt=now)
    claims = ReviewClaim.objects.filter(queue=queue, **{key: OuterRef("pk")}).filter(active)
    if queue.is_group:
        qs = review_group_scope(queue)
        order = ("created_at", "id")
    else:
        qs = review_scope(queue)
        order = ("completed_at", "id")
    if user_id is not None:
        qs = qs.filter(~Exists(claims.filter(user_id=user_id)))
    if queue.reviews_per_item <= 1:
        qs = qs.filter(~Exists(claims))
    else:
        taken = claims.order_by().values(key).annotate(n=Count("id")).values("n")
        qs = qs.annotate(taken=Coalesce(Subquery(taken, output_field=IntegerField()), 0)).filter(
            taken__lt=queue.reviews_per_item
        )
    if queue.is_default:
        qs = qs.filter(~_has_feedback())
        if not queue.is_group and get_tokenizer() is None:
            # Items a reviewer can read first: a trajectory whose steps stored no text (ids
            # only) shows nothing to read without a tokenizer to decode it (timeline.py).
            text = Step.objects.filter(trajectory_id=OuterRef("pk")).filter(
                Q(messages__isnull=False) | Q(response_text__isnull=False)
            )
            return qs.annotate(readable=Exists(text)).order_by("-readable", *order)
    return qs.order_by(*order)


def review_progress(queue: ReviewQueue) -> dict[str, int]:
    """{"done", "total", "held", "elsewhere"}: for the progress bar and the reviewers' panel.
    An item is done once it has ``reviews_per_item`` finished reviews (the default queue: once
    it has feedback, from anyone; ``elsewhere``: those done without a review here)."""
    if queue.is_group:
        total = review_group_scope(queue).count()
    else:
        total = review_scope(queue).count()
    if queue.is_default:
        done = review_scope(queue).filter(_has_feedback()).count()
    else:
        key = _key(queue)
        done = (
            ReviewClaim.objects.filter(queue=queue, done_at__isnull=False)
            .order_by()
            .values(key)
            .annotate(n=Count("id"))
            .filter(n__gte=queue.reviews_per_item)
            .count()
        )
    held = ReviewClaim.objects.filter(
        queue=queue, done_at__isnull=True, expires_at__gt=timezone.now()
    ).count()
    # The default queue's items are done by any feedback: what its reviewers did not give
    # (the API, another queue) is counted apart, so the reviewers' panel adds up to ``done``.
    elsewhere = 0
    if queue.is_default:
        reviewed_here = (
            ReviewClaim.objects.filter(queue=queue, done_at__isnull=False)
            .values("trajectory_id")
            .distinct()
            .count()
        )
        elsewhere = max(0, done - reviewed_here)
    return {"done": done, "total": total, "held": held, "elsewhere": elsewhere}


def review_reviewers(queue: ReviewQueue, *, total: int, now: datetime | None = None) -> list[dict[str, Any]]:
    """Per reviewer of the queue: items done today (since local midnight) and in all, of
    ``total`` (the queue's items), most active first. One grouped query."""
    now = now or timezone.now()
    midnight = timezone.localtime(now).replace(hour=0, minute=0, second=0, microsecond=0)
    rows = (
        ReviewClaim.objects.filter(queue=queue, done_at__isnull=False)
        .order_by()
        .values("user__username")
        .annotate(done=Count("id"), today=Count("id", filter=Q(done_at__gte=midnight)))
        .order_by("-done", "user__username")
    )
    return [
        {"reviewer": r["user__username"], "today": r["today"], "done": r["done"], "total": total}
        for r in rows
    ]


def review_agreement(queue: ReviewQueue) -> dict[str, Any]:
    """How much the reviewers of an item agree, over the items with at least two finished
    reviews (by distinct reviewers, as the slots make them):

    * ratings: the mean absolute pairwise difference of the ratings (0: everyone gave the
      same rating; in the queue's rating units);
    * labels: percent agreement, the share of reviewer pairs that chose the same label (the
      same set of labels, with several labels per feedback);
    * group mode: percent agreement on the rollout picked best (ranked first).

    Each value is None when no item has two reviews of that kind."""
    key = _key(queue)
    rows = (
        ReviewClaim.objects.filter(queue=queue, done_at__isnull=False, feedback__isnull=False)
        .order_by()
        .values_list(key, "feedback__rating", "feedback__label", "feedback__trajectory_id")
    )
    ratings: dict[int, list[float]] = defaultdict(list)
    labels: dict[int, list[str]] = defaultdict(list)
    best: dict[int, list[int]] = defaultdict(list)
    for item, rating, label, traj in rows:
        if queue.is_group:
            best[item].append(traj)
            continue
        if rating is not None:
            ratings[item].append(rating)
        if label:
            labels[item].append(",".join(sorted(label.split(","))))
    diffs = [abs(a - b) for vs in ratings.values() for a, b in combinations(vs, 2)]
    same = [a == b for vs in labels.values() for a, b in combinations(vs, 2)]
    picks = [a == b for vs in best.values() for a, b in combinations(vs, 2)]
    return {
        "rating": {
            "metric": RATING_AGREEMENT,
            "value": sum(diffs) / len(diffs) if diffs else None,
            "items": sum(1 for vs in ratings.values() if len(vs) > 1),
            "pairs": len(diffs),
        },
        "label": {
            "metric": LABEL_AGREEMENT,
            "value": 100.0 * sum(same) / len(same) if same else None,
            "items": sum(1 for vs in labels.values() if len(vs) > 1),
            "pairs": len(same),
        },
        "best": {
            "metric": LABEL_AGREEMENT,
            "value": 100.0 * sum(picks) / len(picks) if picks else None,
            "items": sum(1 for vs in best.values() if len(vs) > 1),
            "pairs": len(picks),
        },
    }


def review_queues_list() -> list[tuple[ReviewQueue, dict[str, int]]]:
    """Every review queue (default first) with its progress: three counts per queue, and
    queues are few (an operator creates each by hand)."""
    queues = ReviewQueue.objects.select_related("dataset__current").order_by("-is_default", "name")
    return [(q, review_progress(q)) for q in queues]


def review_queue_get(name: str) -> ReviewQueue | None:
    return ReviewQueue.objects.select_related("dataset__current").filter(name=name).first()


LAST_STEPS = 2


def review_group_view(queue: ReviewQueue, group_id: int) -> dict[str, Any]:
    """Group mode: the group with its rollouts side by side, each with its reward (the
    trajectory's, else its last step's effective reward), step count and its last steps'
    answers (``LAST_STEPS``), and the prompt they share (the first step's messages). Two
    queries besides the scope (no per-rollout reads)."""
    group = PromptGroup.objects.get(id=group_id)
    rollouts = review_rollouts(queue, group_id)
    steps: dict[int, list[Step]] = defaultdict(list)
    for s in (
        Step.objects.filter(trajectory_id__in=[t.id for t in rollouts])
        .only(
            "id",
            "uid",
            "trajectory_id",
            "step_index",
            "messages",
            "response_text",
            "reward",
            "effective_reward",
            "seq_len",
            "prompt_len",
        )
        .order_by("trajectory_id", "step_index")
    ):
        steps[s.trajectory_id].append(s)
    first = next((ss[0] for ss in steps.values() if ss), None)
    prompt = _messages_text(first.messages) if first is not None else []
    cards = []
    for i, t in enumerate(rollouts, start=1):
        ss = steps[t.id]
        last = ss[-1] if ss else None
        reward = t.reward if t.reward is not None else (last.effective_reward if last else None)
        cards.append(
            {
                "n": i,
                "trajectory": t,
                "reward": reward,
                "steps": len(ss),
                "last": [
                    {
                        "index": s.step_index,
                        "uid": s.uid,
                        "text": s.response_text,
                        "tokens": s.seq_len - s.prompt_len,
                    }
                    for s in ss[-LAST_STEPS:]
                ],
            }
        )
    return {"group": group, "prompt": prompt, "rollouts": cards}


def review_claim_group(claim_id: int) -> int | None:
    """The group a claim is for (group mode), or None."""
    return ReviewClaim.objects.filter(id=claim_id).values_list("group_id", flat=True).first()
