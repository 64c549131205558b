"""TRL exports (claw_client/integrations/trl.py): what an agent sent through the API comes
back from a ``steps`` pull as TRL's conversational SFT rows and preference pairs, compared
with the sent conversations field by field (which rollout, by reward, threshold and margin).
The training itself: tests/client/test_trl_train.py."""

from __future__ import annotations

import hashlib

import orjson
import pytest

from claw_client import Batch
from claw_client.integrations.trl import rollouts, to_dpo_pairs, to_sft_rows
from curation.models import Snapshot
from curation.services.datasets import dataset_create
from curation.services.snapshots import snapshot_build
from pool.models import Scope
from tests.client.chat_rollouts import GROUPS, ROLLOUTS, steps
from tests.conftest import client_for, post_steps

pytestmark = pytest.mark.django_db


def convo(traj: str) -> list[dict]:
    return ROLLOUTS[traj][2]


@pytest.fixture
def trainer(make_key):
    return client_for(make_key(Scope.CONSUME, name="trainer"))


@pytest.fixture
def sent(agent) -> None:
    """Everything the agent sends (groups, steps), and dataset "chat" admitting it all."""
    for g in GROUPS:
        assert agent.post("/api/v1/groups", g, format="json").status_code in (200, 201)
    resp = post_steps(agent, steps())
    assert resp.status_code in (200, 201), resp.content
    dataset_create(name="chat")


@pytest.fixture
def pulled(sent, trainer) -> Batch:
    """Everything the agent sent, pulled as one ``steps`` batch."""
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


# --- the snapshot formats ---------------------------------------------------------------------
@pytest.fixture
def media(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT


def snapshot_export(trainer, body: dict) -> tuple[dict, list[dict]]:
    """POST /api/v1/snapshots with ``body``, the build run, then the status and the export
    downloaded as ``?format=<body's format>``, parsed line by line."""
    resp = trainer.post("/api/v1/snapshots", {"dataset": "chat", **body}, format="json")
    assert resp.status_code == 202, resp.content
    sid = resp.json()["id"]
    snapshot_build(snapshot_id=sid)
    status = trainer.get(f"/api/v1/snapshots/{sid}").json()
    resp = trainer.get(f"/api/v1/snapshots/{sid}/download", {"format": body["format"]})
    assert resp.status_code == 200
    assert resp["Content-Type"] == "application/x-ndjson"
    assert f'filename="chat-v1-{sid}.{body["format"]}.jsonl"' in resp["Content-Disposition"]
    raw = b"".join(resp.streaming_content)
    assert status["manifest"]["export"]["sha256"] == hashlib.sha256(raw).hexdigest()
    return status, [orjson.loads(line) for line in raw.splitlines()]


@pytest.mark.parametrize(
    "body, expected",
    [
        ({"format": "sft"}, {"min_reward": None, "rows": [["math-r0"], ["greet-r0"], ["solo"]]}),
        (
            {"format": "sft", "min_reward": 0.5},
            {"min_reward": 0.5, "rows": [["math-r0"], ["greet-r0"], ["greet-r1"], ["solo"]]},
        ),
        ({"format": "sft", "min_reward": 1}, {"min_reward": 1.0, "rows": [["math-r0"]]}),
        ({"format": "dpo"}, {"margin": 0.0, "rows": [["math-r0", "math-r1"], ["math-r0", "math-r2"]]}),
        ({"format": "dpo", "margin": 0.9}, {"margin": 0.9, "rows": [["math-r0", "math-r2"]]}),
        ({"format": "dpo", "margin": 2}, {"margin": 2.0, "rows": []}),
    ],
)
def test_a_snapshot_with_a_trl_format_holds_the_export(sent, trainer, media, body, expected):
    """README: "With "format": "sft" (optional min_reward) or "format": "dpo" (optional
    margin, default 0) the snapshot also holds that TRL export, downloaded with ?format=sft
    or ?format=dpo (see "TRL" below), and its manifest's export gives the options, the row
    count and the file's sha256."
    """
    # given everything the agent sent, admitted by dataset "chat"
    # when a snapshot is requested with a TRL format and built
    status, rows = snapshot_export(trainer, body)
    # then the export file holds the rows of the chosen rollouts (steps in id order: greet-r0
    # comes first, so it wins greet's tie), and the manifest says what was asked and written
    fmt = body["format"]
    if fmt == "sft":
        want = [{"messages": convo(t)} for (t,) in expected["rows"]]
    else:
        want = [
            {"prompt": convo(c)[:1], "chosen": convo(c)[1:], "rejected": convo(r)[1:]}
            for c, r in expected["rows"]
        ]
    assert sorted(rows, key=repr) == sorted(want, key=repr)
    export = status["manifest"]["export"]
    option = "min_reward" if fmt == "sft" else "margin"
    assert export["format"] == fmt and export[option] == expected[option] and export["rows"] == len(want)
    assert status["formats"] == sorted(["jsonl", "parquet", fmt])
    assert status["manifest"]["steps"] == len(steps())  # the step files are the same as ever


@pytest.mark.parametrize(
    "body, param",
    [
        ({"format": "csv"}, "format"),
        ({"format": "jsonl"}, "format"),
        ({"format": "sft", "margin": 0.5}, "margin"),
        ({"format": "dpo", "min_reward": 0.5}, "min_reward"),
        ({"format": "dpo", "margin": -0.1}, "margin"),
        ({"format": "dpo", "margin": "0.5"}, "margin"),
        ({"format": "sft", "min_reward": True}, "min_reward"),
        ({"min_reward": 0.5}, "min_reward"),
        ({"margin": 0.5}, "margin"),
    ],
)
def test_a_bad_export_request_is_refused_naming_the_field_and_stores_nothing(sent, trainer, body, param):
    before = Snapshot.objects.count()
    resp = trainer.post("/api/v1/snapshots", {"dataset": "chat", **body}, format="json")
    assert resp.status_code == 400, resp.content
    assert resp.json()["error"]["param"] == param
    assert Snapshot.objects.count() == before


def test_a_snapshot_without_the_export_refuses_its_download(sent, trainer, media):
    resp = trainer.post("/api/v1/snapshots", {"dataset": "chat"}, format="json")
    sid = resp.json()["id"]
    snapshot_build(snapshot_id=sid)
    for fmt in ("sft", "dpo"):
        resp = trainer.get(f"/api/v1/snapshots/{sid}/download", {"format": fmt})
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "format"
    assert "export" not in trainer.get(f"/api/v1/snapshots/{sid}").json()["manifest"]


# --- which rollouts count (the steps format's rows, as a pull serves them) -----------------------
def served(traj: str, reward, *, branch: int = 0, index: int = 0, text: str | None = None, **extra) -> dict:
    return {
        "trajectory_uid": traj,
        "prompt_group_uid": "g",
        "branch": branch,
        "step_index": index,
        "reward": reward,
        "mask": False,
        "messages": [QUESTION_ROW],
        "response_text": text if text is not None else traj,
        "metadata": {},
        **extra,
    }


QUESTION_ROW = {"role": "user", "content": "q"}


@pytest.mark.parametrize(
    "rows, sft, pairs",
    [
        # the best (1.0) against the others; an earlier step of a rollout does not count
        (
            [served("a", 0.0, text="a0"), served("a", 1.0, index=1), served("b", 0.5)],
            ["a"],
            [("a", "b")],
        ),
        # a masked final step, a null reward, no messages: left out
        (
            [
                served("a", 1.0, mask=True),
                served("b", None),
                served("c", 0.9, messages=None),
                served("d", 0.1),
            ],
            ["d"],
            [],
        ),
        # two branches of one trajectory are two rollouts
        ([served("a", 0.2), served("a", 0.8, branch=1, text="a1")], ["a1"], [("a1", "a")]),
    ],
)
def test_the_rollouts_that_count(rows, sft, pairs):
    """README: "Its reward is the final step's effective reward; rollouts with no messages, a
    null reward or mask true are left out, and rollouts are compared within their prompt group
    (a trajectory without a group is its own group).\""""

    def reply(text: str) -> list[dict]:
        return [QUESTION_ROW, {"role": "assistant", "content": text}]

    assert to_sft_rows(rows) == [{"messages": reply(t)} for t in sft]
    assert to_dpo_pairs(rows) == [
        {"prompt": [QUESTION_ROW], "chosen": reply(c)[1:], "rejected": reply(r)[1:]} for c, r in pairs
    ]


def test_the_rollouts_carry_the_two_kinds_of_reward():
    """The TRL rollouts (claw_client.integrations.trl.rollouts) and, asked for, the SFT rows
    carry the outcome of each rollout's branch and the process rewards of its steps beside
    the reward they were chosen by (docs/trainers.md: "the TRL rollouts")."""
    # given: a rollout of two steps, a process reward 0.3 on step 0 and the outcome 1.0 on its
    # final step; another whose outcome came from its trajectory
    rows = [
        served("a", 0.3, text="a0", outcome_reward=1.0, process_reward=0.3),
        served("a", 1.0, index=1, outcome_reward=1.0, process_reward=None),
        served("b", 0.5, outcome_reward=0.5, process_reward=None),
    ]
    # when: read as rollouts and SFT rows with their rewards
    got = [
        (r["trajectory_uid"], r["reward"], r["outcome_reward"], r["process_rewards"]) for r in rollouts(rows)
    ]
    sft = to_sft_rows(rows, rewards=True)
    # then: each rollout's outcome and its steps' process rewards, by step index
    assert got == [("a", 1.0, 1.0, {0: 0.3}), ("b", 0.5, 0.5, {})]
    assert [(r["reward"], r["outcome_reward"], r["process_rewards"]) for r in sft] == [(1.0, 1.0, {0: 0.3})]
    assert set(sft[0]) == {"messages", "reward", "outcome_reward", "process_rewards"}
