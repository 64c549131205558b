"""POST/GET /api/v1/steps: round trip, idempotency, atomicity, filters."""

from __future__ import annotations

import json
import random

import pytest

from pool.models import PromptGroup, Step, Trajectory
from tests.conftest import make_step, post_steps

pytestmark = pytest.mark.django_db


def test_round_trip_returns_exactly_what_was_written(agent):
    # given a step with every field set
    rng = random.Random(7)
    step = make_step(
        "traj-a",
        0,
        prompt=[rng.randrange(2**31) for _ in range(500)],
        response=[rng.randrange(2**31) for _ in range(50)],
        rollout_logprobs=[-rng.random() * 5 for _ in range(50)],
        reward=0.25,
        policy_version=3,
        is_last=False,
        finish_reason="stop",
        messages=[{"role": "user", "content": "hi"}],
        response_text="hello",
        metadata={"env": "bash", "nested": {"a": [1, 2]}},
    )
    # when it is submitted and read back
    resp = post_steps(agent, [step])
    assert resp.status_code == 201, resp.content
    assert resp.json()["created"] == 1
    got = agent.get(f"/api/v1/steps/{step['uid']}").json()
    # then every written field comes back identical
    for key, value in step.items():
        assert got[key] == value, key
    # its own 0.25 is a process reward while the trajectory runs: the step is reward-final
    # once its branch's outcome is (issue 18), and the two kinds are told apart
    assert (got["reward_status"], got["process_reward"], got["outcome_reward"]) == ("pending", 0.25, None)
    assert got["token_source"] == "client"


# Token id arrays in each JSON spelling a client may send: the parser reads them as text
# (pool/ingest/contract.py _json_ids), so each spelling must give the same ids.
ID_SPELLINGS = [
    ("compact", lambda ids: json.dumps(ids, separators=(",", ":"))),
    ("spaced", lambda ids: json.dumps(ids)),
    ("pretty", lambda ids: json.dumps(ids, indent=2)),
    ("tabs-and-crlf", lambda ids: "[\t" + ",\r\n\t".join(map(str, ids)) + " ]"),
]


@pytest.mark.parametrize("spelling", [s[1] for s in ID_SPELLINGS], ids=[s[0] for s in ID_SPELLINGS])
def test_token_ids_in_any_json_spelling_are_read_exactly(agent, spelling):
    # given ids spanning the whole id range, the extremes included, and an empty response
    rng = random.Random(11)
    prompt = [0, 2**31 - 1, *(rng.randrange(2**31) for _ in range(300)), 10, 9]
    cases = {"with-response": [2**31 - 1, 0, 7], "empty-response": []}
    for name, response in cases.items():
        ids = f'"prompt_ids": {spelling(prompt)}, "response_ids": {spelling(response)}'
        body = '{"steps": [{"trajectory_uid": "sp-' + name + '", "step_index": 0, ' + ids + "}]}"
        # when the body is posted as written
        resp = agent.post("/api/v1/steps", body, content_type="application/json")
        assert resp.status_code == 201, resp.content
        # then the stored ids are exactly those sent
        got = agent.get(f"/api/v1/steps/sp-{name}:0").json()
        assert (got["prompt_ids"], got["response_ids"]) == (prompt, response), name


@pytest.mark.parametrize("length", [128, 150, 160])
def test_a_step_uid_may_be_as_long_as_its_column(agent, length):
    # given an explicit step uid of up to 160 characters (the column; 161 is a 400, test_bad_input)
    step = dict(make_step("traj-long-uid", 0), uid="u" * length)
    # when it is submitted and read back
    assert post_steps(agent, [step]).status_code == 201
    # then it is stored under that uid
    assert agent.get(f"/api/v1/steps/{step['uid']}").json()["uid"] == "u" * length


def test_resubmission_is_a_duplicate_and_different_content_is_409(agent):
    step = make_step("traj-b", 0)
    assert post_steps(agent, [step]).status_code == 201
    again = post_steps(agent, [step])
    assert again.status_code == 200
    assert again.json() == {
        "created": 0,
        "duplicates": 1,
        "steps": [{"uid": step["uid"], "status": "duplicate"}],
    }
    changed = dict(step, response_ids=[1, 2, 3])
    conflict = post_steps(agent, [changed])
    assert conflict.status_code == 409
    assert conflict.json()["error"]["param"] == "steps[0].uid"
    assert Step.objects.count() == 1


def test_batch_is_atomic(agent):
    good = make_step("traj-c", 0)
    bad = make_step("traj-c", 1, prompt=[1, -5])
    resp = post_steps(agent, [good, bad])
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "steps[1].prompt_ids[1]"
    assert Step.objects.count() == 0 and Trajectory.objects.count() == 0


def test_conflict_late_in_batch_writes_nothing(agent):
    assert post_steps(agent, [make_step("traj-d", 0)]).status_code == 201
    # a new step, then a different step claiming an occupied (trajectory, step_index)
    resp = post_steps(agent, [make_step("traj-e", 0), make_step("traj-d", 0, uid="other-uid")])
    assert resp.status_code == 409
    assert resp.json()["error"]["param"] == "steps[1].step_index"
    assert not Trajectory.objects.filter(uid="traj-e").exists()


def test_creates_trajectories_and_groups_on_first_sight(agent):
    resp = post_steps(
        agent,
        [
            make_step("t1", 0, group="g"),
            make_step("t2", 0, group="g"),
            make_step("t1", 1, group="g", is_last=True),
        ],
    )
    assert resp.status_code == 201
    assert PromptGroup.objects.get(uid="g").trajectories.count() == 2
    t1 = Trajectory.objects.get(uid="t1")
    assert t1.step_count == 2 and t1.status == "completed"


def test_shared_prefixes_are_stored_once_and_read_back_exactly(agent):
    rng = random.Random(1)
    system = [rng.randrange(150_000) for _ in range(400)]
    steps = []
    for r in range(3):
        ctx = list(system)
        for t in range(4):
            resp = [rng.randrange(150_000) for _ in range(20)]
            steps.append(make_step(f"r{r}", t, group="grp", prompt=list(ctx), response=resp))
            ctx = ctx + resp + [rng.randrange(150_000) for _ in range(30)]
    # submitted across several batches, so parents are found both in-batch and in the DB
    for chunk in (steps[:3], steps[3:7], steps[7:]):
        assert post_steps(agent, chunk).status_code == 201
    unique = 400 + 3 * (3 * 50 + 20)
    stored = sum(len(bytes(b)) for b in Step.objects.values_list("seq_delta", flat=True)) // 4
    assert stored == unique
    for st in steps:
        got = agent.get(f"/api/v1/steps/{st['uid']}").json()
        assert got["prompt_ids"] == st["prompt_ids"] and got["response_ids"] == st["response_ids"]


def test_list_filters_and_cursor_pagination(agent, django_assert_max_num_queries):
    post_steps(agent, [make_step("fa", i, group="G1", policy_version=1) for i in range(5)])
    post_steps(agent, [make_step("fb", i, group="G2", policy_version=2, reward=1.0) for i in range(3)])
    assert len(agent.get("/api/v1/steps?trajectory_uid=fa").json()["results"]) == 5
    assert len(agent.get("/api/v1/steps?prompt_group_uid=G2").json()["results"]) == 3
    assert len(agent.get("/api/v1/steps?policy_version=1").json()["results"]) == 5
    assert len(agent.get("/api/v1/steps?reward_status=final").json()["results"]) == 3
    page = agent.get("/api/v1/steps?page_size=3").json()
    assert len(page["results"]) == 3 and page["next"]
    seen = [s["uid"] for s in page["results"]]
    while page["next"]:
        page = agent.get(page["next"]).json()
        seen += [s["uid"] for s in page["results"]]
    assert len(seen) == len(set(seen)) == 8
    with django_assert_max_num_queries(4):
        agent.get("/api/v1/steps?page_size=100")
