"""verl takes a pulled batch unmodified: ``claw_client.integrations.verl.to_dataproto`` against a
real server process (tests/live.py; PostgreSQL in CI's second pass).

Steps with known tokens, rewards, logprobs and prompt groups are seeded through the REST API,
pulled under a lease in the ``padded`` and the ``steps`` format, turned into a verl
``DataProto`` and compared field by field with what was sent; then verl's own
``compute_grpo_outcome_advantage`` and vanilla policy loss run on it with logprobs of a tiny
randomly initialised torch model, and a backward step gives finite, non-zero gradients.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ray")  # verl.protocol imports it
pytest.importorskip("verl")

from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402
from verl.workers.config import ActorConfig  # noqa: E402

from claw_client import ClawClient  # noqa: E402
from claw_client.integrations.verl import to_dataproto  # noqa: E402
from tests.live import ROOT, LiveServer, live_server  # noqa: E402

pytestmark = pytest.mark.live

KEYS = """
from pool.services.api_keys import api_key_create
for name, scope in (("agent", "ingest"), ("trainer", "consume"), ("admin", "admin")):
    print(api_key_create(name=name, scopes=[scope])[1])
"""
VOCAB = 64
# (group, rollout) -> reward of that single-turn rollout.
REWARDS = {("g0", 0): 1.0, ("g0", 1): 0.0, ("g0", 2): 0.5, ("g1", 0): 2.0, ("g1", 1): -1.0}


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[LiveServer, dict[str, str]]]:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp, live_server(Path(tmp)) as srv:
        names = ("agent", "trainer", "admin")
        keys = dict(zip(names, srv.manage("shell", "-c", KEYS).strip().splitlines()[-3:], strict=True))
        yield srv, keys


def sent_steps(prefix: str) -> list[dict]:
    """One single-turn rollout per (group, k): prompts of different lengths (left padding
    differs per row), responses of different lengths, logprobs per response token."""
    steps = []
    for (group, k), reward in REWARDS.items():
        g = int(group[1])
        prompt = [3 + g, *range(10, 13 + k + 2 * g)]
        response = [20 + k + 5 * g + t for t in range(2 + (k + g) % 3)]
        steps.append(
            {
                "trajectory_uid": f"{prefix}-{group}-r{k}",
                "prompt_group_uid": f"{prefix}-{group}",
                "step_index": 0,
                "prompt_ids": prompt,
                "response_ids": response,
                "rollout_logprobs": [-0.25 - 0.125 * t - 0.5 * k for t in range(len(response))],
                "reward": reward,
                "is_last": True,
                "policy_version": 3,
            }
        )
    return steps


def seed(srv: LiveServer, keys: dict[str, str], prefix: str) -> list[dict]:
    steps = sent_steps(prefix)
    with ClawClient(srv.url, keys["agent"]) as agent, ClawClient(srv.url, keys["admin"]) as admin:
        admin.set_policy_version(3)
        for group in sorted({s["prompt_group_uid"] for s in steps}):
            n = sum(s["prompt_group_uid"] == group for s in steps)
            agent._json("POST", "/groups", json={"uid": group, "expected_rollouts": n})
        assert agent.submit_steps(steps)["created"] == len(steps)
        admin.create_dataset(prefix)
    return steps


class TinyLM(torch.nn.Module):
    """Embedding, one hidden layer, vocabulary logits: a token's logits depend on the token."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 16)
        self.out = torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Linear(16, VOCAB))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.emb(input_ids))


def response_log_probs(model: TinyLM, data: DataProto) -> torch.Tensor:
    """log p(response token t | the token before it), (N, R), as verl's actor lays them out."""
    input_ids = data.batch["input_ids"]
    r = data.batch["responses"].shape[1]
    logits = model(input_ids)[:, -r - 1 : -1]
    return torch.log_softmax(logits, dim=-1).gather(-1, data.batch["responses"].unsqueeze(-1)).squeeze(-1)


def expected_advantages(rows: list[dict], eps: float = 1e-6) -> list[float]:
    """verl's GRPO by hand: (r - mean) / (std + eps) per group (unbiased std; one row: r)."""
    out = []
    for r in rows:
        group = [x["reward"] for x in rows if x["prompt_group_uid"] == r["prompt_group_uid"]]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((x - mean) ** 2 for x in group) / (len(group) - 1)) if len(group) > 1 else 1.0
        out.append((r["reward"] - mean) / (std + eps) if len(group) > 1 else r["reward"])
    return out


def test_a_pulled_batch_is_verls_dataproto_and_trains_a_grpo_step(server):
    """README (verl): "claw_client.integrations.verl.to_dataproto(batch) turns a pulled batch
    (steps or padded format: the same DataProto) into verl's DataProto (verl 0.9), laid out as
    verl's agent loop lays out its rollouts, so verl's reward, advantage and actor code take
    it as it is:" "Tensors, one row per step: prompts left-padded and responses right-padded
    with pad_token_id (0), input_ids, attention_mask, position_ids (verl's
    compute_position_id_with_mask) and response_mask, all int64; rollout_log_probs float32
    (present when every step trained on has logprobs); token_level_scores,
    token_level_rewards and rm_scores float32, the effective reward on the last response
    token and 0.0 elsewhere." "Non-tensor columns: uid is the prompt group uid (verl's GRPO
    index; a trajectory without a group is its own group), with prompt_uids,
    trajectory_uids, step_indices, step_uids, policy_versions, staleness, reward,
    reward_scope, outcome_rewards, process_rewards and has_rollout_logprobs." "meta_info holds the lease id, dataset version,
    policy versions and staleness of the manifest." "verl's GRPO normalises per row, so give
    it single-turn rollouts or a last_step dataset; Claw-R1's trainer sums a trajectory's
    steps first (next section)." (The groupless-trajectory and logprob-presence rules:
    test_fixed_widths_pad_and_a_masked_step_trains_nothing.)"""
    srv, keys = server
    sent = {s["trajectory_uid"]: s for s in seed(srv, keys, "verl-a")}
    with ClawClient(srv.url, keys["trainer"]) as trainer:
        got = {}
        for fmt in ("padded", "steps"):
            with trainer.pull("verl-a", consumer=f"verl-{fmt}", batch_size=8, format=fmt) as batch:
                assert batch
                got[fmt] = (to_dataproto(batch), batch.lease_id, batch.manifest)
    data, lease_id, manifest = got["padded"]
    other = got["steps"][0]

    # both formats give the same DataProto
    assert sorted(data.batch.keys()) == sorted(other.batch.keys())
    for key in data.batch.keys():
        assert torch.equal(data.batch[key], other.batch[key]), key
    assert data.non_tensor_batch.keys() == other.non_tensor_batch.keys()
    for key, value in data.non_tensor_batch.items():
        assert list(value) == list(other.non_tensor_batch[key]), key

    # every row is a sent step, field by field
    n = len(sent)
    b, nt = data.batch, data.non_tensor_batch
    assert len(data) == n and sorted(nt["trajectory_uids"]) == sorted(sent)
    p = max(len(s["prompt_ids"]) for s in sent.values())
    w = max(len(s["response_ids"]) for s in sent.values())
    assert b["prompts"].shape == (n, p) and b["responses"].shape == (n, w)
    assert b["input_ids"].shape == b["attention_mask"].shape == b["position_ids"].shape == (n, p + w)
    for key in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask"):
        assert b[key].dtype == torch.int64, key
    for key in ("rollout_log_probs", "token_level_scores", "token_level_rewards", "rm_scores"):
        assert b[key].dtype == torch.float32 and b[key].shape == (n, w), key
    for i, traj in enumerate(nt["trajectory_uids"]):
        s = sent[traj]
        lp, lr = len(s["prompt_ids"]), len(s["response_ids"])
        assert b["prompts"][i].tolist() == [0] * (p - lp) + s["prompt_ids"]  # left-padded
        assert b["responses"][i].tolist() == s["response_ids"] + [0] * (w - lr)  # right-padded
        assert b["input_ids"][i].tolist() == b["prompts"][i].tolist() + b["responses"][i].tolist()
        assert b["attention_mask"][i].tolist() == [0] * (p - lp) + [1] * (lp + lr) + [0] * (w - lr)
        positions = [0] * (p - lp) + list(range(lp + lr)) + [lp + lr - 1] * (w - lr)
        assert b["position_ids"][i].tolist() == positions
        assert b["response_mask"][i].tolist() == [1] * lr + [0] * (w - lr)
        want_lp = torch.tensor(s["rollout_logprobs"] + [0.0] * (w - lr), dtype=torch.float32)
        assert torch.equal(b["rollout_log_probs"][i], want_lp)
        want_r = [0.0] * w
        want_r[lr - 1] = s["reward"]
        for key in ("token_level_scores", "token_level_rewards", "rm_scores"):
            assert b[key][i].tolist() == want_r, key
        assert nt["uid"][i] == nt["prompt_uids"][i] == s["prompt_group_uid"]
        assert nt["step_indices"][i] == 0 and nt["step_uids"][i] == f"{traj}:0"
        assert nt["policy_versions"][i] == 3 and nt["staleness"][i] == 0
        assert nt["reward"][i] == s["reward"] and nt["reward_scope"][i] == "step"
        # one step, the final one of its branch: its reward is the outcome, no process reward
        assert nt["outcome_rewards"][i] == s["reward"] and nt["process_rewards"][i] is None
        assert nt["has_rollout_logprobs"][i]
    assert data.meta_info == {
        "lease_id": lease_id,
        "dataset_version": manifest["dataset_version"],
        "policy_versions": {"3": n},
        "staleness": manifest["staleness"],
    }
    assert manifest["staleness"] == {"min": 0, "max": 0}

    # verl's GRPO advantages equal the hand computation per group
    adv, returns = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=b["token_level_rewards"], response_mask=b["response_mask"], index=nt["uid"]
    )
    rows = [sent[t] for t in nt["trajectory_uids"]]
    for i, want in enumerate(expected_advantages(rows)):
        lr = len(rows[i]["response_ids"])
        assert adv[i, :lr].tolist() == pytest.approx([want] * lr, abs=1e-5)
        assert adv[i, lr:].abs().sum() == 0
    assert torch.equal(adv, returns)

    # verl's vanilla policy loss on a tiny random model's logprobs; one backward step
    torch.manual_seed(0)
    model = TinyLM()
    log_prob = response_log_probs(model, data)
    config = ActorConfig(strategy="fsdp", rollout_n=3, ppo_mini_batch_size=n, ppo_micro_batch_size_per_gpu=n)
    loss, metrics = core_algos.get_policy_loss_fn("vanilla")(
        old_log_prob=b["rollout_log_probs"],
        log_prob=log_prob,
        advantages=adv,
        response_mask=b["response_mask"],
        loss_agg_mode="token-mean",
        config=config,
    )
    loss.backward()
    assert math.isfinite(loss.item()) and "actor/pg_clipfrac" in metrics
    grads = [q.grad for q in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"prompt_length": 3}, "a prompt of 6 tokens is longer than prompt_length=3"),
        ({"response_length": 1}, "a response of 3 tokens is longer than response_length=1"),
    ],
)
def test_fixed_widths_refuse_a_longer_row(kwargs, error):
    rows = [{"trajectory_uid": "t", "step_index": 0, "prompt_ids": [1] * 6, "response_ids": [2] * 3}]
    with pytest.raises(ValueError, match=re.escape(error)):
        to_dataproto(rows, **kwargs)


def test_fixed_widths_pad_and_a_masked_step_trains_nothing():
    """README (verl): "A masked step's response_mask row is all 0." A groupless trajectory is
    its own GRPO group, and rollout_log_probs is left out when a step trained on has none."""
    rows = [
        {"trajectory_uid": "t0", "step_index": 0, "prompt_ids": [5, 6], "response_ids": [7], "reward": 1.0},
        {"trajectory_uid": "t1", "step_index": 1, "prompt_ids": [5], "response_ids": [8, 9], "mask": True},
    ]
    data = to_dataproto(rows, prompt_length=4, response_length=3, pad_token_id=2)
    assert data.batch["prompts"].tolist() == [[2, 2, 5, 6], [2, 2, 2, 5]]
    assert data.batch["responses"].tolist() == [[7, 2, 2], [8, 9, 2]]
    assert data.batch["response_mask"].tolist() == [[1, 0, 0], [0, 0, 0]]
    assert data.batch["token_level_scores"].tolist() == [[1.0, 0, 0], [0, 0, 0]]
    assert list(data.non_tensor_batch["uid"]) == ["t0", "t1"]  # no group: its own
    assert "rollout_log_probs" not in data.batch.keys()  # t0 is trained on and has none
    assert list(data.non_tensor_batch["has_rollout_logprobs"]) == [False, False]


@pytest.mark.parametrize(
    "batch, error",
    [
        ({"subtree_end": []}, "the tree format is not a verl batch"),
        ({"steps": []}, "the batch has no steps"),
        ([{"prompt_ids": [1], "response_ids": [2]}], "step 0 lacks trajectory_uid, step_index"),
    ],
)
def test_what_is_not_a_verl_batch_is_refused(batch, error):
    with pytest.raises(ValueError, match=re.escape(error)):
        to_dataproto(batch)


def readme_block(heading: str) -> str:
    """The first fenced python block under ``heading`` in docs/trainers.md (moved from the README)."""
    text = (ROOT / "docs" / "trainers.md").read_text()
    at = text.index(f"\n{heading}\n")
    return re.search(r"```python\n(.*?)```", text[at:], re.S).group(1)


def test_the_readme_verl_snippet_runs_verbatim(server, monkeypatch):
    srv, keys = server
    sent = {s["trajectory_uid"] for s in seed(srv, keys, "grpo")}
    monkeypatch.setenv("CLAW_URL", srv.url)
    monkeypatch.setenv("CLAW_KEY", keys["trainer"])
    scope: dict = {}
    exec(compile(readme_block("### verl: a DataProto"), "docs/trainers.md", "exec"), scope)
    data = scope["data"]
    assert data.meta_info["lease_id"]
    # the dataset admits every ready step: this test's and those of the test above
    assert sent <= set(data.non_tensor_batch["trajectory_uids"]) and len(data) <= 2 * len(sent)
    want, _ = core_algos.compute_grpo_outcome_advantage(
        data.batch["token_level_rewards"], data.batch["response_mask"], data.non_tensor_batch["uid"]
    )
    assert torch.equal(data.batch["advantages"], want)
    # the block acked its lease: nothing is left for its consumer
    with ClawClient(srv.url, keys["trainer"]) as trainer:
        assert not trainer.pull("grpo", consumer="verl", batch_size=8)


def test_verls_tensors_give_the_trainers_verdicts_and_a_drifting_step_is_flagged(server):
    """Lineage: ``open_run`` records verl's config; ``post_verdicts`` sends each trained
    step's importance ratio, rollout/training KL (k3), clipped fraction and advantage, from
    verl's own old_log_probs, rollout_log_probs and advantages, by lease; a KL above the
    dataset's serving.policy_mismatch_kl flags the step."""
    from omegaconf import OmegaConf

    from claw_client.integrations.verl import open_run, post_verdicts, verdicts_of

    srv, keys = server
    sent = {s["trajectory_uid"]: s for s in sent_steps("verdict")}
    since = datetime.now(UTC).isoformat()  # the server shares this machine's clock
    seed(srv, keys, "verdict")
    with ClawClient(srv.url, keys["admin"]) as admin, ClawClient(srv.url, keys["trainer"]) as trainer:
        body = {
            "name": "verdict-kl",
            "filters": {"created_after": since},
            "serving": {"policy_mismatch_kl": 0.01},
        }
        admin._json("POST", "/datasets", json=body)
        run = open_run(
            trainer, consumer="verl-v", dataset="verdict-kl", config=OmegaConf.create({"lr": 1e-6})
        )
        assert run.info["config"] == {"lr": 1e-6} and run.info["code_version"].startswith("verl-")
        with trainer.pull("verdict-kl", consumer="verl-v", batch_size=8, format="padded") as batch:
            data = to_dataproto(batch)
            torch.manual_seed(0)
            data.batch["old_log_probs"] = response_log_probs(TinyLM(), data).detach()
            data.batch["advantages"], _ = core_algos.compute_grpo_outcome_advantage(
                data.batch["token_level_rewards"], data.batch["response_mask"], data.non_tensor_batch["uid"]
            )
            items = verdicts_of(data, clip_ratio=0.2, per_token=True)
            answers = post_verdicts(trainer, data, clip_ratio=0.2)
        # each item is the hand computation over the row's real response tokens
        assert [x["uid"] for x in items] == [f"{t}:0" for t in data.non_tensor_batch["trajectory_uids"]]
        for i, item in enumerate(items):
            s = sent[data.non_tensor_batch["trajectory_uids"][i]]
            n = len(s["response_ids"])
            lp = data.batch["old_log_probs"][i, :n].double().tolist()
            d = [a - b for a, b in zip(lp, s["rollout_logprobs"], strict=True)]
            r = [math.exp(x) for x in d]
            assert item["importance_ratio"] == pytest.approx(math.exp(sum(d) / n), rel=1e-5)
            assert item["logprob_kl"] == pytest.approx(
                sum(x - 1 - y for x, y in zip(r, d, strict=True)) / n, rel=1e-5
            )
            assert item["clipped_fraction"] == sum(not 0.8 <= x <= 1.2 for x in r) / n
            assert item["advantage"] == pytest.approx(float(data.batch["advantages"][i, 0]), rel=1e-5)
            assert item["tokens"]["importance_ratio"] == pytest.approx(r, rel=1e-5)
        # posted by lease; the steps above the threshold are flagged, the others not
        drifting = {x["uid"] for x in items if x["logprob_kl"] > 0.01}
        assert answers == {
            batch.lease_id: {"stored": len(items), "flagged": len(drifting), "policy_mismatch_kl": 0.01}
        }
        assert drifting
        for x in items:
            flags = admin._json("GET", f"/steps/{x['uid']}")["quality_flags"]
            assert ("policy_mismatch" in flags) == (x["uid"] in drifting)
