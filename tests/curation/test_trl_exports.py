"""TRL exports (claw_client/integrations/trl.py): what an agent sent through the API comes
back from a ``steps`` pull as TRL's conversational SFT rows and preference pairs, compared
with the sent conversations field by field (which rollout, by reward, threshold and margin).
The training itself: tests/client/test_trl_train.py."""

from __future__ import annotations

import pytest

from claw_client import Batch
from claw_client.integrations.trl import to_dpo_pairs, to_sft_rows
from curation.services import dataset_create
from pool.models import Scope
from tests.client.chat_rollouts import GROUPS, ROLLOUTS, steps
from tests.conftest import client_for, post_steps

pytestmark = pytest.mark.django_db


def convo(traj: str) -> list[dict]:
    return ROLLOUTS[traj][2]


@pytest.fixture
def pulled(agent, make_key) -> Batch:
    """Everything the agent sent (groups, steps), pulled as one ``steps`` batch."""
    for g in GROUPS:
        assert agent.post("/api/v1/groups", g, format="json").status_code in (200, 201)
    resp = post_steps(agent, steps())
    assert resp.status_code in (200, 201), resp.content
    dataset_create(name="chat")
    trainer = client_for(make_key(Scope.CONSUME, name="trainer"))
    resp = trainer.post(
        "/api/v1/consumers/sft/pull", {"dataset": "chat", "batch_size": 10, "format": "steps"}, format="json"
    )
    assert resp.status_code == 200, resp.content
    batch = Batch(resp.content)
    assert {s["trajectory_uid"] for s in batch.batch["steps"]} == set(ROLLOUTS)
    return batch


def first_of(batch: Batch, group: str) -> str:
    """The group's trajectory that comes first in the batch (a tie goes to it)."""
    return next(s["trajectory_uid"] for s in batch.batch["steps"] if s["prompt_group_uid"] == group)


@pytest.mark.parametrize(
    "min_reward, expected",
    [
        (None, ["math-r0", "greet:first", "solo"]),  # the best rollout of each group
        (0.5, ["math-r0", "greet-r0", "greet-r1", "solo"]),
        (0.9, ["math-r0", "solo"]),
        (1.0, ["math-r0"]),
        (1.5, []),
    ],
)
def test_sft_rows_are_the_sent_conversations_of_the_chosen_rollouts(pulled, min_reward, expected):
    # given everything pulled; when it is turned into SFT rows
    rows = to_sft_rows(pulled, min_reward=min_reward)
    # then each row is exactly one sent conversation (tool calls and tool messages kept)
    want = [convo(first_of(pulled, "greet") if t == "greet:first" else t) for t in expected]
    assert sorted(rows, key=repr) == sorted(({"messages": m} for m in want), key=repr)
    assert all(set(r) == {"messages"} for r in rows)


@pytest.mark.parametrize(
    "margin, rejected",
    [
        (0.0, ["math-r1", "math-r2"]),  # greet's tie gives no pair, solo has no group
        (0.8, ["math-r1", "math-r2"]),
        (0.9, ["math-r2"]),
        (1.0, ["math-r2"]),
        (1.01, []),
    ],
)
def test_dpo_pairs_choose_the_best_rollout_against_those_a_margin_below(pulled, margin, rejected):
    # when the pull is turned into preference pairs
    pairs = to_dpo_pairs(pulled, margin=margin)
    # then math-r0 (1.0) is chosen against each rollout at least the margin below it; the
    # prompt is the shared question, the sides the rest of each conversation
    want = [
        {"prompt": convo("math-r0")[:1], "chosen": convo("math-r0")[1:], "rejected": convo(t)[1:]}
        for t in rejected
    ]
    assert sorted(pairs, key=repr) == sorted(want, key=repr)
    if pairs:
        assert pairs[0]["chosen"][0]["tool_calls"] == convo("math-r0")[1]["tool_calls"]
        assert [m["role"] for m in pairs[0]["chosen"]] == ["assistant", "tool", "assistant"]


def test_a_negative_margin_is_refused(pulled):
    with pytest.raises(ValueError, match="margin"):
        to_dpo_pairs(pulled, margin=-0.1)
