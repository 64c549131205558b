"""Late rewards after delivery (pool/services/delivery.py, pool.errors.RewardDelivered): once
a trajectory's steps were leased to a consumer or frozen into a snapshot, every door that
sets a reward answers 409 ``reward_delivered`` for a change and writes nothing; before that,
the same call applies. One table: each reward door x each kind of delivery."""

from __future__ import annotations

import pytest

from curation.services.datasets import dataset_create
from curation.services.snapshots import snapshot_build, snapshot_create
from pool import tasks
from pool.ingest.pipeline import steps_ingest
from pool.models import ApiKey, RewardEvent, Scope, Step, Trajectory
from pool.services.groups import group_upsert
from tests.conftest import client_for
from tests.pool.factories import step_in
from tests.pool.test_reward_functions import GSM8K, enqueued, rollout, run  # noqa: F401 (a fixture)

# transaction=True: the Claw-R1 door runs its database work on threads of its own.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def media_root(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"


def ready_group(uid: str, source_id: int) -> list[str]:
    """A complete, ready prompt group of two one-step rollouts; returns their trajectory uids."""
    group_upsert(uid=uid, expected_rollouts=2)
    trajs = [f"{uid}-r{r}" for r in range(2)]
    steps_ingest(
        steps=[
            step_in(t, 0, prompt=[1, 2, r], response=[3], group=uid, reward=float(r), is_last=True)
            for r, t in enumerate(trajs)
        ],
        source_id=source_id,
    )
    return trajs


# (door, call(client, trajectory uid, reward) -> response, which stored reward it moves)
DOORS = [
    (
        "POST trajectories/<uid>/complete",
        lambda c, t, r: c.post(f"/api/v1/trajectories/{t}/complete", {"reward": r}, format="json"),
        "trajectory",
    ),
    (
        "POST trajectory-completions",
        lambda c, t, r: c.post(
            "/api/v1/trajectory-completions", {"completions": [{"uid": t, "reward": r}]}, format="json"
        ),
        "trajectory",
    ),
    (
        "POST rewards (trajectory_uid)",
        lambda c, t, r: c.post("/api/v1/rewards", {"trajectory_uid": t, "reward": r}, format="json"),
        "trajectory",
    ),
    (
        "POST rewards (step_uid)",
        lambda c, t, r: c.post("/api/v1/rewards", {"step_uid": f"{t}:0", "reward": r}, format="json"),
        "step",
    ),
    (
        "Claw-R1 complete_trajectory",
        lambda c, t, r: c.post(f"/compat/claw-r1/complete_trajectory/{t}", {"reward": r}, format="json"),
        "trajectory",
    ),
]


def deliver_by_lease(trainer, case: str) -> None:
    resp = trainer.post(
        f"/api/v1/consumers/c-{case}/pull", {"dataset": "all", "batch_size": 100}, format="json"
    )
    assert resp.status_code == 200 and resp.json()["lease_id"], resp.content


def deliver_by_snapshot(trainer, case: str) -> None:
    snap = snapshot_build(snapshot_id=snapshot_create(dataset="all", actor=case).id)
    assert snap is not None and snap.status == "done"


DELIVERIES = [("lease", deliver_by_lease), ("snapshot", deliver_by_snapshot)]


def stored(t: str) -> tuple:
    traj = Trajectory.objects.get(uid=t)
    step = Step.objects.get(uid=f"{t}:0")
    return (traj.reward, step.reward, step.reward_status, step.effective_reward)


def test_a_reward_change_applies_before_delivery_and_is_refused_after(make_key):
    dataset_create(name="all")
    agent = client_for(make_key(Scope.INGEST, name="agent"))
    trainer = client_for(make_key(Scope.CONSUME, name="trainer"))
    source = ApiKey.objects.get(name="agent").source_id
    for n, ((door, call, moves), (how, deliver)) in enumerate([(d, v) for d in DOORS for v in DELIVERIES]):
        case = f"{how}-{n}"
        # given: a ready group of the agent's, not delivered yet
        t = ready_group(f"g-{case}", source)[0]
        # when: a door sets a reward before delivery
        resp = call(agent, t, 0.75)
        # then: it applies
        assert resp.status_code == 200, (door, how, resp.content)
        got = stored(t)
        assert (got[0] if moves == "trajectory" else got[1]) == 0.75, (door, how, got)
        # when: the group is delivered, and the door tries another reward
        deliver(trainer, case)
        assert Trajectory.objects.get(uid=t).delivered_at is not None
        events = RewardEvent.objects.count()
        resp = call(agent, t, 0.25)
        # then: 409 reward_delivered naming the item, and nothing changed
        assert resp.status_code == 409, (door, how, resp.content)
        err = resp.json()["error"]
        assert err["code"] == "reward_delivered", (door, how, err)
        assert t in err["message"] and "already delivered" in err["message"]
        assert stored(t) == got and RewardEvent.objects.count() == events, (door, how)
        # and: the same reward again is no change, so it still answers as before
        assert call(agent, t, 0.75).status_code == 200, (door, how)
        assert stored(t) == got


def test_a_reward_functions_late_score_for_a_delivered_trajectory_is_dropped(
    enqueued,  # noqa: F811 (the fixture imported above)
    django_capture_on_commit_callbacks,
):
    """docs/api.md: a reward function's late score for a delivered trajectory is dropped (the
    task ends quietly; the rollout keeps what was delivered)."""
    # given: a completed gsm8k rollout without a reward, frozen into a snapshot of a dataset
    # that admits unrewarded steps
    with django_capture_on_commit_callbacks(execute=True):
        rollout("late", "6 * 7 = 42\n#### 42", meta=GSM8K)
    dataset_create(
        name="any", spec={"filters": {"readiness": "any"}, "grouping": {"keep_groups_whole": False}}
    )
    assert snapshot_build(snapshot_id=snapshot_create(dataset="any").id).status == "done"
    assert Trajectory.objects.get(uid="late").delivered_at is not None
    before = [stored_row(s) for s in Step.objects.filter(trajectory__uid="late").order_by("step_index")]
    # when: the reward task runs
    run(tasks.trajectory_rewards_compute, enqueued["trajectory"].calls)
    # then: nothing changed, nothing was audited
    assert Trajectory.objects.get(uid="late").reward is None
    after = [stored_row(s) for s in Step.objects.filter(trajectory__uid="late").order_by("step_index")]
    assert after == before and not RewardEvent.objects.exists()


def stored_row(s: Step) -> tuple:
    return (s.uid, s.reward, s.reward_status, s.reward_source, s.effective_reward)
