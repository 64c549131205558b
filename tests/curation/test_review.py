"""Review queues (curation/services/review.py): claims, expiry, submission, human rewards,
and two reviewers never holding the same item, also under real concurrency."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.test import Client
from django.utils import timezone

from curation.models import ReviewClaim
from curation.selectors.review import review_agreement, review_progress, review_reviewers
from curation.services.review import (
    review_claim_next,
    review_queue_create,
    review_queue_default,
    review_release,
    review_submit,
    review_submit_group,
)
from curation.services.users import user_create
from pool.errors import Conflict, InvalidInput
from pool.ingest.pipeline import steps_ingest
from pool.models import Feedback, RewardEvent, Step, Trajectory
from pool.services.groups import group_upsert
from pool.services.trajectories import trajectory_complete
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
    # given: progress counts completed trajectories and those with feedback (given elsewhere)
    assert review_progress(queue) == {"done": 1, "total": 3, "held": 0, "elsewhere": 1}
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
    assert review_progress(queue) == {"done": 2, "total": 3, "held": 1, "elsewhere": 1}
    # a done item cannot be submitted twice
    with pytest.raises(Conflict):
        review_submit(claim_id=first.id, user_id=alice.id, author="alice", rating=3)


@pytest.mark.django_db
def test_the_default_queue_opens_on_an_item_a_reviewer_can_read(settings):
    # given: an older trajectory of token ids only, a newer one with its text, no tokenizer
    settings.CLAW_TOKENIZER = ""
    done("ids-only")
    texted = done("texted", messages=[{"role": "user", "content": "hi"}], response_text="hello")
    # when: a reviewer opens the default queue
    first = review_claim_next(queue=review_queue_default(), user_id=reviewer("rae").id)
    # then: the item that reads as text comes first
    assert first.trajectory_id == texted.id


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
    assert review_progress(queue) == {"done": 1, "total": 1, "held": 0, "elsewhere": 0}


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


# --- the review workbench: group mode, several reviews per item, agreement, the schema -------
def rollouts(group: str, n: int) -> list[Trajectory]:
    """A complete prompt group of ``n`` rollouts (declared), one step each, without rewards."""
    group_upsert(uid=group, expected_rollouts=n)
    for i in range(n):
        steps_ingest(
            steps=[
                step_in(
                    f"{group}-r{i}",
                    0,
                    prompt=[1, 2],
                    response=[3, i],
                    group=group,
                    is_last=True,
                    messages=[{"role": "user", "content": "Pick a number"}],
                    response_text=f"answer {i}",
                )
            ]
        )
        trajectory_complete(uid=f"{group}-r{i}")
    return list(Trajectory.objects.filter(group__uid=group).order_by("id"))


# (group_reward, n rollouts, the ranking as rollout positions best first, expected reward per
# rollout): best = 1 and the others 0; rank r of n (r = 1 best) = (n - r) / (n - 1).
GROUP_CASES = [
    ("rank", 2, [2, 1], [0.0, 1.0]),
    ("rank", 3, [3, 1, 2], [0.5, 0.0, 1.0]),
    ("rank", 4, [1, 2, 3, 4], [1.0, 2 / 3, 1 / 3, 0.0]),
    ("rank", 5, [5, 4, 3, 2, 1], [0.0, 0.25, 0.5, 0.75, 1.0]),
    ("best", 3, [2], [0.0, 1.0, 0.0]),
    ("best", 4, [4], [0.0, 0.0, 0.0, 1.0]),
    ("best", 3, [3, 1, 2], [0.0, 0.0, 1.0]),  # a full ranking in a "best" queue: its first is best
]


@pytest.mark.django_db
@pytest.mark.parametrize(("group_reward", "n", "ranking", "expected"), GROUP_CASES)
def test_a_group_ranking_becomes_audited_human_rewards_the_trainer_reads(
    group_reward, n, ranking, expected, reader
):
    # given a group queue whose ranking sets rewards, and a finished group of n rollouts
    trajs = rollouts("g", n)
    queue = review_queue_create(
        name="rank", filters={"readiness": "any"}, mode="group", group_reward=group_reward
    )
    alice = reviewer("alice")
    claim = review_claim_next(queue=queue, user_id=alice.id)
    assert claim.group.uid == "g" and claim.trajectory_id == trajs[0].id
    # when alice ranks the rollouts
    review_submit_group(
        claim_id=claim.id,
        user_id=alice.id,
        author="alice",
        ranking=[trajs[p - 1].id for p in ranking],
        comment="the second is right",
    )
    # then each rollout's step reads, through the trainer's API, the formula's reward, as a
    # final human reward of trajectory scope
    for t, want in zip(trajs, expected, strict=True):
        got = reader.get(f"/api/v1/steps/{t.uid}:0").json()
        assert got["reward"] == pytest.approx(want), t.uid
        assert got["reward_source"] == "human"
        assert got["reward_scope"] == "trajectory"
        assert got["reward_status"] == "final"
        assert got["ready"] is True, got["readiness"]
        # audited as the existing reward writes are
        event = RewardEvent.objects.get(trajectory=t)
        assert event.new_reward == pytest.approx(want) and event.reward_source == "human"
        assert event.metadata["review_queue"] == "rank" and event.metadata["group_reward"] == group_reward
        # and stored as feedback by alice, its score as the rating
        fb = Feedback.objects.get(trajectory=t)
        assert (fb.author, fb.user_id, fb.rating) == ("alice", alice.id, pytest.approx(want))
    best = trajs[ranking[0] - 1]
    claim.refresh_from_db()
    assert claim.feedback.trajectory_id == best.id and claim.feedback.comment == "the second is right"
    assert review_claim_next(queue=queue, user_id=alice.id) is None
    assert review_progress(queue) == {"done": 1, "total": 1, "held": 0, "elsewhere": 0}


@pytest.mark.django_db
def test_a_group_queue_without_group_reward_stores_feedback_only():
    trajs = rollouts("g", 3)
    queue = review_queue_create(name="fb", filters={"readiness": "any"}, mode="group")
    alice = reviewer("alice")
    claim = review_claim_next(queue=queue, user_id=alice.id)
    review_submit_group(claim_id=claim.id, user_id=alice.id, author="alice", ranking=[t.id for t in trajs])
    assert sorted(Feedback.objects.values_list("label", flat=True)) == ["rank 1/3", "rank 2/3", "rank 3/3"]
    assert not RewardEvent.objects.exists()
    assert list(Trajectory.objects.filter(reward__isnull=False)) == []


@pytest.mark.django_db
def test_an_item_needing_two_reviews_goes_to_two_distinct_reviewers_then_leaves_the_queue():
    t = done("a")
    queue = review_queue_create(name="twice", filters={"readiness": "any"}, reviews_per_item=2)
    alice, bob, carol = reviewer("alice"), reviewer("bob"), reviewer("carol")
    # given alice and bob both hold the same item (two slots), carol gets nothing
    ca = review_claim_next(queue=queue, user_id=alice.id)
    cb = review_claim_next(queue=queue, user_id=bob.id)
    assert ca.trajectory_id == cb.trajectory_id == t.id and {ca.slot, cb.slot} == {0, 1}
    assert review_claim_next(queue=queue, user_id=carol.id) is None
    # when alice submits, the item leaves her queue but is not done yet
    review_submit(claim_id=ca.id, user_id=alice.id, author="alice", rating=4)
    assert review_claim_next(queue=queue, user_id=alice.id) is None
    assert review_progress(queue) == {"done": 0, "total": 1, "held": 1, "elsewhere": 0}
    # when bob gives up his slot, carol takes it (alice never gets a second one)
    review_release(claim_id=cb.id, user_id=bob.id)
    assert review_claim_next(queue=queue, user_id=alice.id) is None
    cc = review_claim_next(queue=queue, user_id=carol.id)
    assert cc.trajectory_id == t.id and cc.slot == cb.slot
    review_submit(claim_id=cc.id, user_id=carol.id, author="carol", rating=2)
    # then the item has its two reviews: done, and nobody gets it again
    assert review_progress(queue) == {"done": 1, "total": 1, "held": 0, "elsewhere": 0}
    assert review_claim_next(queue=queue, user_id=bob.id) is None
    assert sorted(Feedback.objects.filter(trajectory=t).values_list("author", flat=True)) == [
        "alice",
        "carol",
    ]
    reviewers = {r["reviewer"]: (r["today"], r["done"], r["total"]) for r in review_reviewers(queue, total=1)}
    assert reviewers == {"alice": (1, 1, 1), "carol": (1, 1, 1)}


@pytest.mark.django_db
def test_agreement_of_a_known_fixture():
    # given two items reviewed by three and by two reviewers
    done("a")
    done("b")
    queue = review_queue_create(
        name="agree", filters={"readiness": "any"}, reviews_per_item=3, label_choices=["ok", "bad"]
    )
    given = {
        "a": [("r1", 1, "ok"), ("r2", 3, "ok"), ("r3", 5, "bad")],
        "b": [("r1", 4, "ok"), ("r2", 5, "ok")],
    }
    users = {name: reviewer(name) for name in ("r1", "r2", "r3")}
    for traj, reviews in given.items():
        for name, rating, label in reviews:
            claim = review_claim_next(
                queue=queue, user_id=users[name].id, prefer=Trajectory.objects.get(uid=traj).id
            )
            assert claim.trajectory.uid == traj
            review_submit(claim_id=claim.id, user_id=users[name].id, author=name, rating=rating, label=label)
    # when the agreement is computed
    got = review_agreement(queue)
    # then ratings: |1-3|, |1-5|, |3-5|, |4-5| -> (2 + 4 + 2 + 1) / 4; labels: 2 of 4 pairs agree
    assert got["rating"] == {
        "metric": "mean absolute pairwise difference",
        "value": 2.25,
        "items": 2,
        "pairs": 4,
    }
    assert got["label"] == {"metric": "percent agreement", "value": 50.0, "items": 2, "pairs": 4}
    # and the queue page names the measure and shows the numbers
    client = Client()
    client.force_login(users["r1"])
    page = client.get("/review/agree/").content.decode()
    assert "Ratings: mean absolute pairwise difference" in page and ">2.25 <" in page
    assert "Labels: percent agreement" in page and "50.0 %" in page


# (queue schema, submission, the field the error names, words of the message)
SCHEMA_CASES = [
    ({}, {"rating": 2.5}, "rating", "whole number of stars"),
    ({}, {"rating": 6}, "rating", "between 1 and 5"),
    ({"rating_min": 0, "rating_max": 100}, {"rating": 100.5}, "rating", "between 0 and 100"),
    ({"label_choices": ["ok", "bad"]}, {"labels": ["meh"]}, "label", "must be one of"),
    ({"label_choices": ["ok", "bad"]}, {"labels": ["ok", "bad"]}, "label", "one label"),
    (
        {"label_choices": ["ok", "bad"], "label_multi": True},
        {"labels": ["ok", "x"]},
        "label",
        "must be one of",
    ),
    ({"label_choices": ["ok", "bad"], "label_multi": True}, {"labels": ["ok", "ok"]}, "label", "twice"),
    ({"sets_reward": True}, {}, "rating", "give a rating"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("schema", "submission", "field", "words"), SCHEMA_CASES)
def test_submissions_are_checked_against_the_queue_schema(schema, submission, field, words):
    done("a")
    queue = review_queue_create(name="schema", filters={"readiness": "any"}, **schema)
    alice = reviewer("alice")
    claim = review_claim_next(queue=queue, user_id=alice.id)
    with pytest.raises(InvalidInput) as err:
        review_submit(claim_id=claim.id, user_id=alice.id, author="alice", **submission)
    assert err.value.field == field and words in err.value.message
    # nothing written, the item still hers
    assert not Feedback.objects.exists()
    assert review_claim_next(queue=queue, user_id=alice.id).id == claim.id


@pytest.mark.django_db
def test_several_labels_are_stored_and_a_slider_takes_any_value_in_range():
    done("a")
    queue = review_queue_create(
        name="multi",
        filters={"readiness": "any"},
        rating_min=0,
        rating_max=100,
        label_choices=["ok", "bad", "slow"],
        label_multi=True,
    )
    assert queue.rating_widget == "slider"
    alice = reviewer("alice")
    claim = review_claim_next(queue=queue, user_id=alice.id)
    fb = review_submit(
        claim_id=claim.id, user_id=alice.id, author="alice", rating=37.5, labels=["ok", "slow"]
    )
    assert (fb.rating, fb.label) == (37.5, "ok,slow")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("ranking", "words"),
    [([], "rank the rollouts"), ("first-two", "rank all 3"), ("twice", "each rollout of this group once")],
)
def test_a_group_ranking_must_name_every_rollout_once(ranking, words):
    trajs = rollouts("g", 3)
    queue = review_queue_create(name="rank", filters={"readiness": "any"}, mode="group", group_reward="rank")
    alice = reviewer("alice")
    claim = review_claim_next(queue=queue, user_id=alice.id)
    ids = {"first-two": [trajs[0].id, trajs[1].id], "twice": [trajs[0].id, trajs[0].id, trajs[1].id]}
    with pytest.raises(InvalidInput) as err:
        review_submit_group(
            claim_id=claim.id,
            user_id=alice.id,
            author="alice",
            ranking=ids[ranking] if isinstance(ranking, str) else ranking,
        )
    assert err.value.field == "ranking" and words in err.value.message
    assert not Feedback.objects.exists() and not RewardEvent.objects.exists()


@pytest.mark.django_db
def test_the_review_page_shows_the_schema_widgets_and_refuses_bad_values_naming_the_field():
    done("a")
    review_queue_create(
        name="page",
        filters={"readiness": "any"},
        label_choices=["ok", "bad"],
        guidelines="# Rules\n<script>alert(1)</script>\n\n**Be fair.** [docs](https://example.com) [x](javascript:alert(1))",
    )
    client = Client()
    client.force_login(reviewer("alice"))
    page = client.get("/review/page/").content.decode()
    # stars for 1..5, label buttons, the hotkeys listed, the guidelines rendered safely
    assert all(f'name="rating" id="star-{v}" value="{v}"' in page for v in range(1, 6))
    assert 'type="radio" name="label" value="ok"' in page
    assert "<kbd>j</kbd> / <kbd>k</kbd>" in page and "show or hide this help" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert(1)" not in page
    assert "<strong>Be fair.</strong>" in page and 'href="https://example.com"' in page
    assert "javascript:alert" not in page.split('class="markdown"')[1].split("</div>")[0].replace(
        "[x](javascript:alert(1))", ""
    )
    claim = ReviewClaim.objects.get()
    resp = client.post("/review/page/", {"action": "submit", "claim": claim.id, "rating": "2.5"})
    assert (
        resp.status_code == 400 and "rating: rating must be a whole number of stars" in resp.content.decode()
    )
    resp = client.post(
        "/review/page/", {"action": "submit", "claim": claim.id, "rating": "3", "label": "meh"}
    )
    assert resp.status_code == 400 and "Select a valid choice" in resp.content.decode()
    assert not Feedback.objects.exists()


@pytest.mark.django_db
def test_an_operator_edits_a_queues_guidelines_on_the_page_and_in_the_admin():
    done("a")
    queue = review_queue_create(name="edit", filters={"readiness": "any"}, rating_min=0, rating_max=10)
    op = Client()
    op.force_login(user_create(username="op", role="operator", password=PASSWORD))
    # when the operator edits it on the queues page (the builder's fields give the filters)
    page = op.get("/review/queues/?edit=edit").content.decode()
    assert "Edit queue edit" in page and 'name="rating_min"' not in page  # the schema stays
    resp = op.post(
        "/review/queues/?edit=edit",
        {
            "description": "now",
            "guidelines": "Be *kind*.",
            "reviews_per_item": "2",
            "readiness": "any",
            "channel": "val",
        },
    )
    assert resp.status_code == 302
    queue.refresh_from_db()
    assert (queue.description, queue.guidelines, queue.reviews_per_item) == ("now", "Be *kind*.", 2)
    assert queue.filters["channel"] == "val" and (queue.rating_min, queue.rating_max) == (0, 10)
    # and in the admin, where the guidelines alone are editable
    form = op.get(f"/admin/curation/reviewqueue/{queue.id}/change/").content.decode()
    assert 'name="guidelines"' in form and 'name="name"' not in form
    resp = op.post(f"/admin/curation/reviewqueue/{queue.id}/change/", {"guidelines": "# New"})
    assert resp.status_code == 302
    queue.refresh_from_db()
    assert (queue.guidelines, queue.name, queue.reviews_per_item) == ("# New", "edit", 2)
    # a reviewer cannot edit
    rev = Client()
    rev.force_login(reviewer("rita"))
    assert rev.post("/review/queues/?edit=edit", {"guidelines": "x"}).status_code == 403


@pytest.mark.django_db
def test_the_group_page_refuses_a_rank_given_twice_and_agreement_counts_the_best_picked():
    trajs = rollouts("g", 3)
    queue = review_queue_create(
        name="grp", filters={"readiness": "any"}, mode="group", group_reward="rank", reviews_per_item=2
    )
    alice, bob = reviewer("alice"), reviewer("bob")
    client = Client()
    client.force_login(alice)
    page = client.get("/review/grp/").content.decode()
    assert page.count('class="rollout card"') == 3 and "answer 2" in page
    claim = ReviewClaim.objects.get(user=alice)
    # a rank given twice is refused, naming the ranking, and nothing is written
    ranks = {f"rank-{trajs[0].id}": "1", f"rank-{trajs[1].id}": "1", f"rank-{trajs[2].id}": "2"}
    resp = client.post("/review/grp/", {"action": "submit", "claim": claim.id, **ranks})
    assert resp.status_code == 400 and "ranking: give each rank from 1 to 3 once" in resp.content.decode()
    assert not Feedback.objects.exists()
    # a full ranking is recorded
    ranks[f"rank-{trajs[1].id}"], ranks[f"rank-{trajs[2].id}"] = "3", "2"
    assert client.post("/review/grp/", {"action": "submit", "claim": claim.id, **ranks}).status_code == 302
    # bob picks the same best: 100 % agreement on the best rollout over one item
    cb = review_claim_next(queue=queue, user_id=bob.id)
    review_submit_group(
        claim_id=cb.id, user_id=bob.id, author="bob", ranking=[trajs[0].id, trajs[1].id, trajs[2].id]
    )
    assert review_agreement(queue)["best"] == {
        "metric": "percent agreement",
        "value": 100.0,
        "items": 1,
        "pairs": 1,
    }
    # the second review replaced the first's rewards: the last ranking is the reward
    assert [t.reward for t in Trajectory.objects.filter(group__uid="g").order_by("id")] == [1.0, 0.5, 0.0]


@pytest.mark.django_db
def test_the_default_queues_header_and_reviewers_panel_count_the_same_items():
    import re

    # given: four completed trajectories, two with feedback from the API, one reviewed here
    for uid in ("p", "q", "r", "s"):
        done(uid)
    for uid in ("p", "q"):
        Feedback.objects.create(trajectory=Trajectory.objects.get(uid=uid), rating=1, author="api")
    queue = review_queue_default()
    alice = reviewer("alice")
    claim = review_claim_next(queue=queue, user_id=alice.id)
    review_submit(claim_id=claim.id, user_id=alice.id, author="alice", rating=3)
    # when: alice opens the default queue's page
    client = Client()
    client.force_login(alice)
    page = client.get("/review/").content.decode()
    # then: the header's done count is what the panel's rows add up to
    done_count, total = map(int, re.search(r"data-progress>(\d+) / (\d+) done", page).groups())
    panel = page.split('aria-label="Reviewers"')[1].split("</table>")[0]
    rows = [int(n) for n in re.findall(r"<td data-done>(\d+)</td>", panel)]
    assert (done_count, total) == (3, 4) and sum(rows) == done_count and len(rows) == 2
    assert "Nobody reviewed" not in panel and "feedback given elsewhere" in panel
