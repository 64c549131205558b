"""Review queues (curation/services/review.py): claims, expiry, submission, human rewards,
and two reviewers never holding the same item, also under real concurrency."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.utils import timezone

from curation.models import ReviewClaim
from curation.selectors.review import review_progress
from curation.services import (
    review_claim_next,
    review_queue_create,
    review_queue_default,
    review_release,
    review_submit,
    user_create,
)
from pool.errors import Conflict, InvalidInput
from pool.models import Feedback, RewardEvent, Step, Trajectory
from pool.services import steps_ingest, trajectory_complete
from tests.pool.factories import step_in

PASSWORD = "a-long-review-password-1"


def done(traj: str, *, channel: str = "train", **extra) -> Trajectory:
    steps_ingest(steps=[step_in(traj, 0, prompt=[1, 2], response=[3], is_last=True, **extra)])
    t = Trajectory.objects.get(uid=traj)
    if channel != t.channel:
        trajectory_complete(uid=traj, channel=channel)
    return Trajectory.objects.get(uid=traj)


def reviewer(name: str):
    return user_create(username=name, role="reviewer", password=PASSWORD)


@pytest.mark.django_db
def test_the_default_queue_serves_completed_trajectories_without_feedback_oldest_first():
    a, b = done("a"), done("b")
    steps_ingest(steps=[step_in("running", 0, prompt=[1], response=[2])])
    done("has-feedback")
    Feedback.objects.create(trajectory=Trajectory.objects.get(uid="has-feedback"), rating=1)
    queue = review_queue_default()
    alice = reviewer("alice")
    # given: progress counts completed trajectories and those with feedback
    assert review_progress(queue) == {"done": 1, "total": 3, "held": 0}
    # when: alice asks for an item, twice
    first = review_claim_next(queue=queue, user_id=alice.id)
    again = review_claim_next(queue=queue, user_id=alice.id)
    # then: the oldest, and she keeps holding it
    assert first.trajectory_id == a.id and again.id == first.id
    fb = review_submit(
        claim_id=first.id, user_id=alice.id, author="alice", rating=4, label="good", comment="fine"
    )
    assert (fb.trajectory_id, fb.author, fb.user_id, fb.rating) == (a.id, "alice", alice.id, 4)
    assert review_claim_next(queue=queue, user_id=alice.id).trajectory_id == b.id
    assert review_progress(queue) == {"done": 2, "total": 3, "held": 1}
    # a done item cannot be submitted twice
    with pytest.raises(Conflict):
        review_submit(claim_id=first.id, user_id=alice.id, author="alice", rating=3)


@pytest.mark.django_db
def test_two_reviewers_get_different_items_and_an_expired_claim_moves_on():
    done("a")
    done("b")
    queue = review_queue_default()
    alice, bob, carol = reviewer("alice"), reviewer("bob"), reviewer("carol")
    ca = review_claim_next(queue=queue, user_id=alice.id)
    cb = review_claim_next(queue=queue, user_id=bob.id)
    assert ca.trajectory_id != cb.trajectory_id
    assert review_claim_next(queue=queue, user_id=carol.id) is None  # both held
    # when alice's claim expires, carol takes it over
    ReviewClaim.objects.filter(id=ca.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    cc = review_claim_next(queue=queue, user_id=carol.id)
    assert cc.trajectory_id == ca.trajectory_id and cc.user_id == carol.id
    # and alice can no longer submit it
    with pytest.raises(Conflict):
        review_submit(claim_id=ca.id, user_id=alice.id, author="alice", rating=3)
    # skipping gives the item back
    review_release(claim_id=cb.id, user_id=bob.id)
    assert review_claim_next(queue=queue, user_id=alice.id).trajectory_id == cb.trajectory_id


@pytest.mark.django_db
def test_a_queue_that_sets_rewards_turns_the_rating_into_an_audited_human_reward():
    t = done("a")
    queue = review_queue_create(
        name="score", filters={"readiness": "any"}, rating_min=1, rating_max=5, sets_reward=True
    )
    alice = reviewer("alice")
    claim = review_claim_next(queue=queue, user_id=alice.id)
    with pytest.raises(InvalidInput) as err:
        review_submit(claim_id=claim.id, user_id=alice.id, author="alice", rating=7)
    assert err.value.field == "rating"
    with pytest.raises(InvalidInput):
        review_submit(claim_id=claim.id, user_id=alice.id, author="alice")  # the rating is required here
    review_submit(claim_id=claim.id, user_id=alice.id, author="alice", rating=4)
    t.refresh_from_db()
    assert t.reward == 0.75
    event = RewardEvent.objects.get(trajectory=t)
    assert (event.reward_source, event.new_reward, event.metadata["review_queue"]) == ("human", 0.75, "score")
    # the human reward makes the step's reward final: it is ready now
    assert Step.objects.get(uid="a:0").readiness == 15


@pytest.mark.django_db
def test_a_queue_built_from_filters_serves_only_matching_trajectories():
    done("train-1")
    val = done("val-1", channel="val")
    queue = review_queue_create(
        name="val", filters={"readiness": "any", "channel": "val"}, label_choices=["ok", "bad"]
    )
    alice = reviewer("alice")
    claim = review_claim_next(queue=queue, user_id=alice.id)
    assert claim.trajectory_id == val.id
    with pytest.raises(InvalidInput):
        review_submit(claim_id=claim.id, user_id=alice.id, author="alice", rating=3, label="meh")
    review_submit(claim_id=claim.id, user_id=alice.id, author="alice", rating=3, label="ok")
    assert review_claim_next(queue=queue, user_id=alice.id) is None
    assert review_progress(queue) == {"done": 1, "total": 1, "held": 0}


@pytest.mark.django_db(transaction=True)
def test_concurrent_reviewers_never_hold_the_same_item():
    if connection.vendor != "postgresql":
        pytest.skip("concurrent claims need PostgreSQL (SQLite serialises writers)")
    for i in range(6):
        done(f"t{i}")
    queue = review_queue_default()
    users = [reviewer(f"r{i}") for i in range(8)]
    barrier = threading.Barrier(len(users))
    got: dict[int, int | None] = {}
    errors: list[BaseException] = []

    def claim(user_id: int) -> None:
        try:
            barrier.wait(timeout=60)
            c = review_claim_next(queue=queue, user_id=user_id)
            got[user_id] = c.trajectory_id if c else None
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claim, args=(u.id,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    held = [t for t in got.values() if t is not None]
    # six items, eight reviewers: six distinct holders, two with nothing
    assert len(held) == 6 and len(set(held)) == 6
    assert ReviewClaim.objects.count() == 6
