"""Per-token fields of a white-box step (pool/ingest/contract.py): ``token_rewards`` (one
finite float per response token) and ``token_policy_versions`` (run-length encoded
``[[version, count], ...]``). Both doors (JSON, MessagePack with packed floats) store them
compactly and a read returns them as sent; a bad one is a 400 naming the field, and nothing
of the batch is written."""

from __future__ import annotations

import numpy as np
import pytest

from claw_client import MSGPACK, encode_step_batch
from pool.ingest.plan import pack
from pool.models import Step, Trajectory
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db

TOKEN_REWARDS = [0.5, -0.25, 1.5e-3]
RUNS = [[3, 2], [4, 1]]


def good(**extra) -> dict:
    return {
        "trajectory_uid": "t",
        "step_index": 0,
        "prompt_ids": [1, 2],
        "response_ids": [3, 4, 5],
        "token_rewards": TOKEN_REWARDS,
        "token_policy_versions": RUNS,
        **extra,
    }


def post_json(agent, steps):
    return agent.post("/api/v1/steps", {"steps": steps}, format="json")


def post_msgpack(agent, steps):
    return agent.generic("POST", "/api/v1/steps", encode_step_batch(steps), content_type=MSGPACK)


DOORS = {"json": post_json, "msgpack": post_msgpack}


@pytest.mark.parametrize("door", DOORS)
def test_a_step_with_per_token_fields_reads_back_as_sent(agent, reader, door):
    # given a step with token rewards and a partial rollout over two policy versions, and one
    # without either, through this door
    resp = DOORS[door](
        agent, [good(), good(trajectory_uid="bare", token_rewards=None, token_policy_versions=None)]
    )
    assert resp.status_code in (200, 201), resp.content
    # then a read returns them exactly as sent, and null for the step without them
    got = reader.get("/api/v1/steps/t:0").json()
    assert got["token_rewards"] == TOKEN_REWARDS
    assert got["token_policy_versions"] == RUNS
    bare = reader.get("/api/v1/steps/bare:0").json()
    assert bare["token_rewards"] is None and bare["token_policy_versions"] is None
    # and they are stored compactly: float64 and (version, count) int64 pairs
    row = Step.objects.get(uid="t:0")
    assert len(bytes(row.token_rewards)) == 8 * 3 and len(bytes(row.token_versions)) == 16 * 2
    # and resending the same step is a duplicate, a different token reward a conflict
    assert DOORS[door](agent, [good()]).status_code in (200, 201)
    changed = DOORS[door](agent, [good(token_rewards=[0.5, -0.25, 2.0])])
    assert changed.status_code == 409, changed.content


BAD = [
    pytest.param({"token_rewards": [0.5, 1.0]}, "steps[1].token_rewards", id="rewards-short"),
    pytest.param({"token_rewards": [0.5, 1.0, 2.0, 3.0]}, "steps[1].token_rewards", id="rewards-long"),
    pytest.param({"token_policy_versions": [[3, 2]]}, "steps[1].token_policy_versions", id="runs-short"),
    pytest.param(
        {"token_policy_versions": [[3, 2], [4, 2]]}, "steps[1].token_policy_versions", id="runs-long"
    ),
    pytest.param(
        {"token_policy_versions": [[3, 3], [4, 0]]},
        "steps[1].token_policy_versions[1][1]",
        id="runs-zero-count",
    ),
    pytest.param(
        {"token_policy_versions": [[3, 1, 2]]}, "steps[1].token_policy_versions[0]", id="runs-not-a-pair"
    ),
    pytest.param(
        {"token_policy_versions": [[-1, 3]]}, "steps[1].token_policy_versions[0][0]", id="runs-negative"
    ),
]


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize(("extra", "field"), BAD)
def test_a_bad_per_token_field_is_a_400_naming_it_and_nothing_is_written(agent, door, extra, field):
    """README: "Token-level rewards and per-token policy versions: a white-box step may carry
    token_rewards, one finite float per response token, and token_policy_versions, the policy
    version of each response token run-length encoded as [[version, count], ...] with counts
    summing to the response length (a partial rollout continued under a newer policy); a
    length that does not match is a 400 naming the field (steps[0].token_rewards), and nothing
    of the batch is written." """
    # given a batch whose second step has a bad per-token field
    resp = DOORS[door](agent, [good(trajectory_uid="ok"), good(**extra)])
    # then the answer names the field, and neither step (nor a trajectory) is stored
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["param"] == field
    assert not Step.objects.exists() and not Trajectory.objects.exists()


def test_a_non_finite_token_reward_is_a_400_naming_its_index(agent):
    resp = agent.post(
        "/api/v1/steps",
        data=b'{"steps": [{"trajectory_uid": "t", "step_index": 0, "prompt_ids": [1], "response_ids": [2, 3],'
        b' "token_rewards": [0.5, NaN]}]}',
        content_type="application/json",
    )
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["param"].startswith("steps[0].token_rewards")
    assert not Step.objects.exists()
    packed = encode_step_batch([good(token_rewards=[0.5, float("inf"), 1.0])])
    resp = agent.generic("POST", "/api/v1/steps", packed, content_type=MSGPACK)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "steps[0].token_rewards[1]"
    assert not Step.objects.exists()


def test_the_fingerprint_covers_the_per_token_fields_only_when_given():
    def s(**extra):
        return step_in("t", 0, prompt=[1], response=[2, 3], **extra)

    bare = pack(s()).content_hash
    rewards = pack(s(token_rewards=np.array([0.5, 1.0]))).content_hash
    other = pack(s(token_rewards=np.array([0.5, 2.0]))).content_hash
    runs = pack(s(token_policy_versions=[(3, 2)])).content_hash
    other_runs = pack(s(token_policy_versions=[(3, 1), (4, 1)])).content_hash
    assert len({bare, rewards, other, runs, other_runs}) == 5
