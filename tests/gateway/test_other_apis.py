"""The API beyond the step round trip: idempotency details of POST /steps, trajectories,
groups, rewards, events, feedback, policy versions, stats and the list endpoints."""

from __future__ import annotations

import pytest

from pool.models import Event, Feedback, PolicyVersion, PromptGroup, RewardEvent, Scope, Step, Trajectory
from tests.conftest import client_for, make_step, post_steps
from tests.pool.factories import pool_counts

pytestmark = pytest.mark.django_db


def small(traj: str, index: int, **extra) -> dict:
    return make_step(traj, index, prompt=[10 + index, 20, 30], response=[40, 50 + index], **extra)


# --- steps: idempotency details ----------------------------------------------------------------
def test_identical_resubmission_is_200_duplicate_and_writes_nothing(agent):
    # given a stored batch
    batch = [
        small("idem", 0, reward=0.5, metadata={"k": [1, 2]}),
        small("idem", 1, rollout_logprobs=[-0.5, -1.5]),
    ]
    assert post_steps(agent, batch).status_code == 201
    before = pool_counts()
    stamps = list(Step.objects.order_by("id").values_list("updated_at", flat=True))
    # when the same batch is posted again
    resp = post_steps(agent, batch)
    # then 200, every step reported duplicate, and no row written or touched
    assert resp.status_code == 200
    assert resp.json() == {
        "created": 0,
        "duplicates": 2,
        "steps": [{"uid": "idem-s0", "status": "duplicate"}, {"uid": "idem-s1", "status": "duplicate"}],
    }
    assert pool_counts() == before
    assert list(Step.objects.order_by("id").values_list("updated_at", flat=True)) == stamps


def test_default_uid_is_trajectory_and_index_and_is_idempotent(agent):
    # given a step without a uid
    step = small("noid", 3)
    del step["uid"]
    # when posted twice
    first, second = post_steps(agent, [step]), post_steps(agent, [step])
    # then its uid is "<trajectory_uid>:<step_index>" and the second post is a duplicate
    assert first.status_code == 201 and first.json()["steps"] == [{"uid": "noid:3", "status": "created"}]
    assert second.status_code == 200 and second.json()["duplicates"] == 1
    assert agent.get("/api/v1/steps/noid:3").json()["step_index"] == 3


@pytest.mark.parametrize(
    "change",
    [
        {"prompt_ids": [10, 20, 31]},
        {"response_ids": [40]},
        {"response_ids": [40, 50, 60]},
        {"reward": 1.0},
        {"rollout_logprobs": [-0.1, -0.2]},
        {"metadata": {"k": 1}},
        {"is_last": True},
        {"finish_reason": "length"},
        {"policy_version": 2},
        {"messages": [{"role": "user", "content": "x"}]},
        {"response_text": "y"},
        {"prompt_group_uid": "other-g"},
    ],
    ids=lambda c: next(iter(c)),
)
def test_different_content_under_a_stored_uid_is_409_naming_it(agent, change):
    # given a stored step
    assert post_steps(agent, [small("conf", 0)]).status_code == 201
    before = pool_counts()
    # when a batch of two new steps and the changed step (third) is posted
    resp = post_steps(agent, [small("new-a", 0), small("new-b", 0), small("conf", 0, **change)])
    # then 409 names steps[2].uid and neither new step was written
    assert resp.status_code == 409, resp.content
    err = resp.json()["error"]
    assert err["type"] == "conflict_error" and err["param"] == "steps[2].uid"
    assert pool_counts() == before


def test_mixed_batch_reports_per_step_status_in_order(agent):
    # given two stored steps
    assert post_steps(agent, [small("mix", 0), small("mix", 1)]).status_code == 201
    # when a batch mixes them with two new ones
    resp = post_steps(agent, [small("mix", 2), small("mix", 0), small("mix-b", 0), small("mix", 1)])
    # then 201 with created/duplicate per step, in request order
    assert resp.status_code == 201
    assert resp.json() == {
        "created": 2,
        "duplicates": 2,
        "steps": [
            {"uid": "mix-s2", "status": "created"},
            {"uid": "mix-s0", "status": "duplicate"},
            {"uid": "mix-b-s0", "status": "created"},
            {"uid": "mix-s1", "status": "duplicate"},
        ],
    }
    assert Step.objects.filter(trajectory__uid="mix").count() == 3
    assert Trajectory.objects.get(uid="mix").step_count == 3


def test_resubmission_after_a_late_reward_and_completion_stays_a_duplicate(agent):
    # given a stored step that later got a reward and whose trajectory was completed
    step = small("late", 0)
    assert post_steps(agent, [step]).status_code == 201
    assert (
        agent.post("/api/v1/rewards", {"step_uid": "late-s0", "reward": 2.0}, format="json").status_code
        == 200
    )
    assert agent.post("/api/v1/trajectories/late/complete", {}, format="json").status_code == 200
    # when the original submission is retried (e.g. a client retry after a timeout)
    resp = post_steps(agent, [step])
    # then it is a duplicate and the later reward and is_last survive
    assert resp.status_code == 200 and resp.json()["duplicates"] == 1
    got = agent.get("/api/v1/steps/late-s0").json()
    assert (got["reward"], got["reward_status"], got["is_last"]) == (2.0, "final", True)


def test_new_steps_on_an_ended_trajectory_are_409(agent):
    # given a trajectory ended by an is_last step
    assert post_steps(agent, [small("ended", 0, is_last=True)]).status_code == 201
    # when another step is posted to it
    resp = post_steps(agent, [small("ended", 1)])
    # then 409 names a field of that step (its index lies past the trajectory's end)
    assert resp.status_code == 409
    assert resp.json()["error"]["param"] in ("steps[0].step_index", "steps[0].trajectory_uid")
    assert not Step.objects.filter(uid="ended-s1").exists()


def test_unknown_step_is_404_in_the_error_shape(agent):
    resp = agent.get("/api/v1/steps/does-not-exist")
    assert resp.status_code == 404
    assert resp.json()["error"]["type"] == "not_found_error"


# --- trajectories -------------------------------------------------------------------------------
def test_trajectory_create_get_and_idempotent_recreate(agent):
    # given a new trajectory with every field
    body = {
        "uid": "run/1",
        "prompt_group_uid": "g-run",
        "channel": "val",
        "policy_version": 3,
        "metadata": {"env": "bash"},
    }
    # when it is created twice and read
    first = agent.post("/api/v1/trajectories", body, format="json")
    second = agent.post("/api/v1/trajectories", body, format="json")
    got = agent.get("/api/v1/trajectories/run/1")
    # then 201 then 200, and the representation holds what was sent
    assert first.status_code == 201 and second.status_code == 200
    data = got.json()
    assert {k: data[k] for k in body} == body
    assert data["status"] == "running" and data["step_count"] == 0 and data["source"] == "agent"
    assert Trajectory.objects.count() == 1 and PolicyVersion.objects.filter(version=3).exists()


def test_trajectory_recreated_in_another_group_is_409(agent):
    assert (
        agent.post("/api/v1/trajectories", {"uid": "tg", "prompt_group_uid": "g1"}, format="json").status_code
        == 201
    )
    resp = agent.post("/api/v1/trajectories", {"uid": "tg", "prompt_group_uid": "g2"}, format="json")
    assert resp.status_code == 409 and resp.json()["error"]["param"] == "prompt_group_uid"


def test_trajectory_without_uid_gets_one(agent):
    resp = agent.post("/api/v1/trajectories", {}, format="json")
    assert resp.status_code == 201 and len(resp.json()["uid"]) == 32


def test_complete_with_reward_marks_last_step_and_audits(agent):
    # given a running trajectory with three steps
    assert post_steps(agent, [small("cmp", i) for i in range(3)]).status_code == 201
    # when it is completed with a final reward
    resp = agent.post(
        "/api/v1/trajectories/cmp/complete", {"reward": 1.5, "reward_source": "rule"}, format="json"
    )
    # then it is completed, its last step is_last, and the reward change is audited
    assert resp.status_code == 200, resp.content
    data = resp.json()
    assert (data["status"], data["reward"]) == ("completed", 1.5) and data["completed_at"]
    assert list(
        Step.objects.filter(trajectory__uid="cmp", is_last=True).values_list("step_index", flat=True)
    ) == [2]
    ev = RewardEvent.objects.get()
    assert (ev.trajectory.uid, ev.old_reward, ev.new_reward, ev.reward_source) == ("cmp", None, 1.5, "rule")
    # and completing again with the same reward changes nothing, while another status is 409
    assert agent.post("/api/v1/trajectories/cmp/complete", {"reward": 1.5}, format="json").status_code == 200
    assert RewardEvent.objects.count() == 1
    failed = agent.post("/api/v1/trajectories/cmp/complete", {"status": "failed"}, format="json")
    assert failed.status_code == 409 and failed.json()["error"]["param"] == "status"


def test_complete_with_empty_body(agent):
    # given a running trajectory
    assert post_steps(agent, [small("cmp-empty", 0)]).status_code == 201
    # when completed with no body at all
    resp = agent.post("/api/v1/trajectories/cmp-empty/complete")
    # then it is completed without a reward
    assert resp.status_code == 200, resp.content
    assert resp.json()["status"] == "completed" and resp.json()["reward"] is None


def test_trajectory_list_filters_and_pagination(agent):
    # given trajectories in two groups and two statuses
    for i in range(5):
        agent.post(
            "/api/v1/trajectories",
            {
                "uid": f"lt{i}",
                "prompt_group_uid": "A" if i < 3 else "B",
                "channel": "train" if i % 2 else "val",
            },
            format="json",
        )
    agent.post("/api/v1/trajectories/lt0/complete", {}, format="json")

    # when listed with filters
    def uids(query: str) -> list[str]:
        return [t["uid"] for t in agent.get(f"/api/v1/trajectories?{query}").json()["results"]]

    # then each filter selects exactly its rows, and pages do not overlap
    assert uids("prompt_group_uid=A") == ["lt0", "lt1", "lt2"]
    assert uids("status=completed") == ["lt0"]
    assert uids("channel=train") == ["lt1", "lt3"]
    page = agent.get("/api/v1/trajectories?page_size=2").json()
    seen = [t["uid"] for t in page["results"]]
    while page["next"]:
        page = agent.get(page["next"]).json()
        seen += [t["uid"] for t in page["results"]]
    assert seen == [f"lt{i}" for i in range(5)]


def test_trajectory_list_query_count_is_constant(agent, django_assert_max_num_queries):
    # given 30 trajectories with groups and a source
    for i in range(30):
        agent.post("/api/v1/trajectories", {"uid": f"q{i}", "prompt_group_uid": f"g{i % 3}"}, format="json")
    # when a page of all of them is listed
    # then a constant handful of queries is used (no query per row)
    with django_assert_max_num_queries(4):
        resp = agent.get("/api/v1/trajectories?page_size=100")
    assert len(resp.json()["results"]) == 30


# --- groups -------------------------------------------------------------------------------------
def test_group_upsert_and_completion(agent):
    # given a group expecting two rollouts
    resp = agent.post(
        "/api/v1/groups",
        {"uid": "gc", "expected_rollouts": 2, "dataset": "gsm8k", "ground_truth": {"answer": 42}},
        format="json",
    )
    assert resp.status_code == 200 and resp.json()["status"] == "open"
    # when both rollouts end
    post_steps(agent, [small("gc-r0", 0, group="gc", is_last=True)])
    assert agent.get("/api/v1/groups/gc").json()["status"] == "open"
    post_steps(agent, [small("gc-r1", 0, group="gc", is_last=True)])
    # then the group is complete, with its dataset fields intact
    got = agent.get("/api/v1/groups/gc").json()
    assert got["status"] == "complete" and got["completed_at"]
    assert (got["dataset"], got["ground_truth"], got["expected_rollouts"]) == ("gsm8k", {"answer": 42}, 2)
    assert [g["uid"] for g in agent.get("/api/v1/groups?status=complete").json()["results"]] == ["gc"]


# --- rewards ------------------------------------------------------------------------------------
def test_late_rewards_for_steps_and_trajectories(agent):
    # given two pending steps in a trajectory
    post_steps(agent, [small("rw", 0), small("rw", 1)])
    # when a batch of rewards arrives for a step and for the trajectory
    body = {
        "rewards": [
            {"step_uid": "rw-s0", "reward": 1.0, "source": "human", "metadata": {"by": "ann"}},
            {"trajectory_uid": "rw", "reward": 0.5, "source": "model"},
        ]
    }
    resp = agent.post("/api/v1/rewards", body, format="json")
    # then both apply, the step becomes final with its source, and each change is audited
    assert resp.status_code == 200 and resp.json() == {"applied": 2, "received": 2}
    got = agent.get("/api/v1/steps/rw-s0").json()
    assert (got["reward"], got["reward_status"], got["reward_source"]) == (1.0, "final", "human")
    assert agent.get("/api/v1/trajectories/rw").json()["reward"] == 0.5
    assert [s["uid"] for s in agent.get("/api/v1/steps?reward_status=pending").json()["results"]] == ["rw-s1"]
    assert RewardEvent.objects.count() == 2
    # and the same rewards again apply nothing
    assert agent.post("/api/v1/rewards", body, format="json").json() == {"applied": 0, "received": 2}
    assert RewardEvent.objects.count() == 2


def test_non_final_reward_keeps_the_step_pending(agent):
    post_steps(agent, [small("nf", 0)])
    resp = agent.post("/api/v1/rewards", {"step_uid": "nf-s0", "reward": 0.1, "final": False}, format="json")
    assert resp.status_code == 200
    got = agent.get("/api/v1/steps/nf-s0").json()
    assert (got["reward"], got["reward_status"]) == (0.1, "pending")


# --- events and feedback --------------------------------------------------------------------------
def test_events_single_and_batch_then_listed_with_filters(agent):
    # given a stored step
    post_steps(agent, [small("ev", 0)])
    # when one event and then a batch are posted
    one = agent.post(
        "/api/v1/events",
        {
            "type": "tool_call",
            "payload": {"tool": "bash"},
            "step_uid": "ev-s0",
            "occurred_at": "2026-01-02T03:04:05Z",
        },
        format="json",
    )
    batch = agent.post(
        "/api/v1/events",
        {"events": [{"type": "env_reset", "trajectory_uid": "ev"}, {"type": "tool_call"}]},
        format="json",
    )
    # then they are recorded and listed with their fields and filters
    assert one.status_code == 201 and one.json()["recorded"] == 1
    assert batch.status_code == 201 and batch.json()["recorded"] == 2
    listed = agent.get("/api/v1/events?type=tool_call").json()["results"]
    assert [e["step_uid"] for e in listed] == ["ev-s0", None]
    assert listed[0]["payload"] == {"tool": "bash"} and listed[0]["occurred_at"] == "2026-01-02T03:04:05Z"
    assert [e["type"] for e in agent.get("/api/v1/events?trajectory_uid=ev").json()["results"]] == [
        "env_reset"
    ]
    assert Event.objects.get(type="env_reset").source.name == "agent"


def test_feedback_on_step_and_trajectory(agent):
    # given a stored step
    post_steps(agent, [small("fb", 0)])
    # when feedback is posted on the step and on its trajectory
    a = agent.post(
        "/api/v1/feedback",
        {
            "step_uid": "fb-s0",
            "rating": -1.0,
            "label": "wrong",
            "correction": "ls -la",
            "comment": "missed a flag",
            "author": "ann",
        },
        format="json",
    )
    b = agent.post("/api/v1/feedback", {"trajectory_uid": "fb", "rating": 0.5, "label": "ok"}, format="json")
    # then both are stored and listed with filters
    assert a.status_code == 201 and b.status_code == 201
    rows = agent.get("/api/v1/feedback?label=wrong").json()["results"]
    assert len(rows) == 1
    row = rows[0]
    assert (row["step_uid"], row["rating"], row["correction"], row["comment"], row["author"]) == (
        "fb-s0",
        -1.0,
        "ls -la",
        "missed a flag",
        "ann",
    )
    assert [f["label"] for f in agent.get("/api/v1/feedback?trajectory_uid=fb").json()["results"]] == ["ok"]
    assert Feedback.objects.count() == 2


# --- policy versions ------------------------------------------------------------------------------
def test_policy_versions_exactly_one_current(make_key, agent):
    # given versions 1 and 2 posted in turn by a trainer (consume + policy)
    trainer = client_for(make_key(Scope.CONSUME, Scope.POLICY, name="trainer"))
    assert trainer.post("/api/v1/policy-versions", {"version": 1}, format="json").status_code == 200
    assert trainer.post(
        "/api/v1/policy-versions", {"version": 2, "metadata": {"ckpt": "s2"}}, format="json"
    ).json() == {"version": 2, "is_current": True, "metadata": {"ckpt": "s2"}}
    # when version 3 is registered without becoming current, then 1 is made current again
    # (moving back: an admin's forced change, tests/gateway/test_policy_versions.py)
    trainer.post("/api/v1/policy-versions", {"version": 3, "current": False}, format="json")
    listed = {p["version"]: p["is_current"] for p in agent.get("/api/v1/policy-versions").json()}
    assert listed == {1: False, 2: True, 3: False}
    admin = client_for(make_key(Scope.ADMIN, name="admin"))
    resp = admin.post("/api/v1/policy-versions", {"version": 1, "force": True}, format="json")
    assert resp.status_code == 200, resp.content
    # then exactly one version is current at each point, and stats report it
    assert list(PolicyVersion.objects.filter(is_current=True).values_list("version", flat=True)) == [1]
    assert agent.get("/api/v1/stats").json()["current_policy_version"] == 1


# --- stats --------------------------------------------------------------------------------------
def test_stats_counts(agent):
    # given 3 steps (one rewarded), 2 trajectories, 1 group, 1 event and 1 feedback
    post_steps(
        agent,
        [small("st", 0, group="sg"), small("st", 1, group="sg", reward=1.0), small("st2", 0, group=None)],
    )
    agent.post("/api/v1/events", {"type": "x"}, format="json")
    agent.post("/api/v1/feedback", {"step_uid": "st-s0", "rating": 1.0}, format="json")
    # when stats are read
    stats = agent.get("/api/v1/stats").json()
    # then every count matches; all three await a reward: st is running, so st's 1.0 is a
    # process reward of its step 1 until st's outcome is known (issue 18: it is no longer
    # served to step 0 as its branch's), and st2 has none
    assert (stats["steps"], stats["steps_reward_pending"], stats["trajectories"], stats["groups"]) == (
        3,
        3,
        2,
        1,
    )
    assert (stats["events"], stats["feedback"]) == (1, 1)
    assert stats["trajectories_by_status"] == {"running": 2}
    assert stats["tokens"]["step_tokens"] == 15
    assert stats["tokens"]["naive_bytes"] == 60
    assert 0 < stats["tokens"]["stored_bytes"] <= 60
    assert PromptGroup.objects.count() == 1


def test_feedback_from_an_operator_session_records_the_user(operator):
    # given an operator signed in (session) and a stored step
    from rest_framework.test import APIClient

    from pool.ingest.pipeline import steps_ingest
    from pool.models import Feedback
    from tests.pool.factories import step_in

    steps_ingest(steps=[step_in("fb-t", 0, prompt=[1, 2, 3], response=[4])])
    client = APIClient()
    client.force_login(operator)
    # when the operator posts feedback
    resp = client.post("/api/v1/feedback", {"step_uid": "fb-t:0", "rating": 2, "label": "bad"}, format="json")
    # then it is attributed to the operator
    assert resp.status_code == 201, resp.content
    assert Feedback.objects.get(id=resp.json()["id"]).user_id == operator.id
