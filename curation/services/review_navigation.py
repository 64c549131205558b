"""A reviewer's way through a queue: the workbench's state machine, kept out of the view.

The reviewer holds at most one claim (curation/services/review.py). Between items they may:

* **skip** or **next**: give the item back and remember it, so the next claim moves on past
  it (at most ``SKIPS_KEPT`` per queue);
* **prev**: give the item back and claim the item last skipped first (it leaves the skip
  list: it is offered now, not remembered);
* **restart**: forget the skipped items, so they are offered again;
* **submit**: the view's form records the feedback (review_submit), then the next claim.

What is remembered lives in ``state``, a mapping the caller keeps between requests (the
page keeps the session): ``review-skipped-<queue>`` (the skip list) and
``review-prefer-<queue>`` (the item ``prev`` asked for).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from ..models import ReviewClaim, ReviewQueue
from .review import review_claim_next, review_release

# Skipped items remembered per queue (so Skip moves on), at most.
SKIPS_KEPT = 500
MOVES = ("skip", "next", "prev")


class ReviewNavigation:
    """One reviewer's place in one queue, over the caller's ``state`` mapping."""

    def __init__(self, state: MutableMapping[str, Any], queue: ReviewQueue, user_id: int) -> None:
        self.state, self.queue, self.user_id = state, queue, user_id
        self._skipped_key = f"review-skipped-{queue.pk}"
        self._prefer_key = f"review-prefer-{queue.pk}"

    @property
    def skipped(self) -> list[int]:
        """The items skipped, oldest first."""
        return list(self.state.get(self._skipped_key, []))

    def restart(self) -> None:
        """Offer the skipped items again."""
        self.state.pop(self._skipped_key, None)

    def move(self, action: str, *, claim_id: int, item: int | None) -> None:
        """Leave the claimed item by ``action`` (one of MOVES): it is given back either way."""
        if action not in MOVES:
            raise ValueError(f"not a move: {action!r}")
        review_release(claim_id=claim_id, user_id=self.user_id)
        skipped = self.skipped
        if action == "prev":
            # Back to the item last left: this one is given back, not skipped (it comes
            # again in its turn).
            if skipped:
                self.state[self._prefer_key] = skipped[-1]
                skipped = skipped[:-1]
        elif item is not None:
            skipped = [*skipped, item][-SKIPS_KEPT:]
        self.state[self._skipped_key] = skipped

    def claim(self) -> ReviewClaim | None:
        """The reviewer's item: the one ``prev`` asked for if it is free, else the next one
        not skipped (review_claim_next); None when the queue has nothing for them now."""
        prefer = self.state.pop(self._prefer_key, None)
        exclude = [i for i in self.skipped if i != prefer]
        claim = review_claim_next(queue=self.queue, user_id=self.user_id, exclude=exclude, prefer=prefer)
        if prefer is not None:
            self.state[self._skipped_key] = exclude
        return claim
