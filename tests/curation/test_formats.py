"""Batch formats (curation/formats.py) pulled through POST /api/v1/consumers/{name}/pull:
``padded`` and ``tree`` hold exactly the steps the ``steps`` format serves, and replay of
every format is byte-identical.

README: "Formats (curation/formats.py): every format serves the same steps in the same
order." """

from __future__ import annotations

import hashlib

import numpy as np
import orjson
import pytest

from curation import formats
from curation.services.datasets import dataset_create
from pool.ingest.pipeline import steps_ingest
from pool.services.groups import group_upsert
from tests.conftest import client_for
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db

# Rollout 0 (reward 0.0) fails reward_min: the group has 2 of 3 valid rollouts and is served
# whole with rollout 0's steps masked.
SPEC = {"filters": {"reward_min": 0.5}, "grouping": {"short_groups": "mask", "min_rollouts": 3}}


def write_group(uid: str, rewards: list[float], *, steps: int = 2) -> dict[str, tuple[list[int], list[int]]]:
    """A ready group whose rollouts share a prompt prefix, with prompts and responses of
    different lengths and logprobs on all but rollout 1; returns {step uid: (prompt, response)}."""
    group_upsert(uid=uid, expected_rollouts=len(rewards))
    batch, source = [], {}
    for r, reward in enumerate(rewards):
        prompt = [1, 2, 3] + [10 + r] * r
        for i in range(steps):
            response = [20 + r, 30 + i] + [7] * r
            logprobs = None if r == 1 else [-0.125 * (k + 1) - r for k in range(len(response))]
            s = step_in(
                f"{uid}-r{r}",
                i,
                prompt=prompt,
                response=response,
                group=uid,
                reward=reward,
                is_last=i == steps - 1,
                rollout_logprobs=logprobs,
            )
            batch.append(s)
            source[s.uid] = (prompt, response)
            prompt = prompt + response + [9]
    steps_ingest(steps=batch)
    return source


@pytest.fixture
def trainer(make_key):
    from pool.models import Scope

    return client_for(make_key(Scope.CONSUME, name="trainer"))


@pytest.fixture
def source():
    dataset_create(name="d", spec=SPEC)
    return write_group("g1", [0.0, 1.0, 2.0])


def pull(client, consumer: str, fmt: str):
    resp = client.post(
        f"/api/v1/consumers/{consumer}/pull", {"dataset": "d", "format": fmt, "batch_size": 8}, format="json"
    )
    assert resp.status_code == 200, resp.content
    return resp


def test_padded_rows_unpad_to_exactly_the_source_steps(trainer, source):
    """README: "padded is verl-style: prompts left-padded and responses right-padded with pad
    id 0, input_ids (prompts then responses), attention_mask (1 on real tokens), position_ids
    (0 at each row's first real token), response_mask, rollout_logprobs (aligned with the
    response tokens, 0.0 on padding) and token_level_rewards (the step's reward on its last
    response token, 0.0 elsewhere)."
    README: "A masked step keeps its tokens but its response_mask row is all 0."
    README: "In padded and tree such a step's logprobs are 0.0 and its has_rollout_logprobs
    is false." """
    # given the same units pulled as steps by one consumer and padded by another
    rows = pull(trainer, "s", "steps").json()["batch"]["steps"]
    b = pull(trainer, "p", "padded").json()["batch"]
    # then every row is its step, in the same order
    assert b["uid"] == [r["uid"] for r in rows] and len(rows) == 6
    for f in formats.ROW_FIELDS + ("reward",):
        assert b[f] == [r[f] for r in rows], f
    assert any(b["mask"]) and not all(b["mask"])
    assert b["pad_token_id"] == 0
    width_p = len(b["prompts"][0])
    width_r = len(b["responses"][0])
    assert width_p == max(len(r["prompt_ids"]) for r in rows)
    assert width_r == max(len(r["response_ids"]) for r in rows)
    for i, r in enumerate(rows):
        prompt, response = source[r["uid"]]
        assert (r["prompt_ids"], r["response_ids"]) == (prompt, response)
        lp, lr = len(prompt), len(response)
        pad_p, pad_r = width_p - lp, width_r - lr
        ids, am = np.array(b["input_ids"][i]), np.array(b["attention_mask"][i])
        # unpadding input_ids gives exactly prompt + response
        assert ids[am == 1].tolist() == prompt + response
        assert ids[am == 0].tolist() == [0] * (pad_p + pad_r)
        # prompts left-padded, responses right-padded
        assert b["prompts"][i] == [0] * pad_p + prompt
        assert b["responses"][i] == response + [0] * pad_r
        assert b["input_ids"][i] == b["prompts"][i] + b["responses"][i]
        assert am.tolist() == [0] * pad_p + [1] * (lp + lr) + [0] * pad_r
        assert b["position_ids"][i] == [0] * pad_p + list(range(lp + lr)) + [lp + lr - 1] * pad_r
        # loss only on an unmasked step's real response tokens
        want = [0] * width_r if r["mask"] else [1] * lr + [0] * pad_r
        assert b["response_mask"][i] == want
        # logprobs aligned with the response tokens, 0.0 on padding
        logprobs = r["rollout_logprobs"] or [0.0] * lr
        assert b["rollout_logprobs"][i] == logprobs + [0.0] * pad_r
        assert b["has_rollout_logprobs"][i] == (r["rollout_logprobs"] is not None)
        # the reward at the last real response token only
        assert b["token_level_rewards"][i] == [0.0] * (lr - 1) + [r["reward"]] + [0.0] * pad_r


def test_padded_null_reward_is_zero_and_dtypes_are_numpy():
    """README: "... token_level_rewards (the step's reward on its last response token, 0.0
    elsewhere)": a null reward puts none (0.0 everywhere), ``reward`` keeps the null."""
    # given rendered rows, one with a null reward and no logprobs, one with an empty response
    rows = [
        _row("a", [5, 6], [7, 8, 9], reward=None, logprobs=None),
        _row("b", [5], [], reward=1.5, logprobs=np.zeros(0)),
    ]
    b = formats.padded(rows)
    assert b["token_level_rewards"].tolist() == [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert b["reward"] == [None, 1.5] and b["has_rollout_logprobs"] == [False, True]
    assert b["input_ids"].tolist() == [[5, 6, 7, 8, 9], [0, 5, 0, 0, 0]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 0, 0]]
    for k in ("input_ids", "attention_mask", "response_mask", "position_ids", "prompts", "responses"):
        assert b[k].dtype == np.int32, k
    assert b["rollout_logprobs"].dtype == b["token_level_rewards"].dtype == np.float64


def test_tree_rebuilds_every_step_and_stores_shared_prefixes_once(trainer, source):
    """README: "tree is the batch as one packed prefix tree from claw_client.prefix_tree:
    input_ids, position_ids, parent and subtree_end for tree attention, a response_mask, each
    step's last_index (its ancestors are the step's sequence) and response slices
    (response_offsets, response_index, with rollout_logprobs aligned), and stats with unique
    vs total tokens."
    README: "In padded and tree such a step's logprobs are 0.0 and its has_rollout_logprobs
    is false." """
    rows = pull(trainer, "s", "steps").json()["batch"]["steps"]
    t = {
        k: np.array(v) if isinstance(v, list) else v
        for k, v in pull(trainer, "t", "tree").json()["batch"].items()
    }
    assert t["uid"].tolist() == [r["uid"] for r in rows]
    u = len(t["input_ids"])
    for k in ("position_ids", "parent", "subtree_end", "response_mask"):
        assert len(t[k]) == u, k
    covered = np.zeros(u, dtype=int)
    for i, r in enumerate(rows):
        seq = r["prompt_ids"] + r["response_ids"]
        # the ancestor chain of the step's last token is its exact sequence
        path = [int(t["last_index"][i])]
        while t["parent"][path[-1]] >= 0:
            path.append(int(t["parent"][path[-1]]))
        path.reverse()
        assert t["input_ids"][path].tolist() == seq
        assert t["position_ids"][path].tolist() == list(range(len(seq)))
        assert (t["lengths"][i], t["prompt_lens"][i]) == (len(seq), len(r["prompt_ids"]))
        # tree attention: every token on the path attends every earlier one
        for q_at, q in enumerate(path):
            assert all(k <= q <= t["subtree_end"][k] for k in path[: q_at + 1])
        # the response tokens, their logprobs aligned, in the loss unless the step is masked
        lo, hi = t["response_offsets"][i], t["response_offsets"][i + 1]
        resp = t["response_index"][lo:hi]
        assert resp.tolist() == path[len(r["prompt_ids"]) :]
        assert t["input_ids"][resp].tolist() == r["response_ids"]
        assert t["rollout_logprobs"][lo:hi].tolist() == (r["rollout_logprobs"] or [0.0] * len(resp))
        if not r["mask"]:
            covered[resp] = 1
        assert t["reward"][i] == r["reward"] and t["mask"][i] == r["mask"]
        assert t["has_rollout_logprobs"][i] == (r["rollout_logprobs"] is not None)
    assert t["response_mask"].tolist() == covered.tolist()
    assert any(t["mask"]) and covered.sum() > 0
    assert not all(t["has_rollout_logprobs"]) and any(t["has_rollout_logprobs"])
    # shared prompts and earlier turns are stored once
    stats = t["stats"]
    assert stats["total_tokens"] == sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows)
    assert stats["unique_tokens"] == u < stats["total_tokens"]
    assert stats["n_sequences"] == len(rows)


@pytest.mark.parametrize("fmt", ["steps", "padded", "tree"])
def test_every_format_replays_byte_identically_with_its_hash(trainer, source, fmt):
    first = pull(trainer, "c", fmt)
    body = first.json()
    assert body["manifest"]["format"] == fmt and len(body["manifest"]["step_uids"]) == 6
    assert trainer.post(f"/api/v1/leases/{body['lease_id']}/ack").status_code == 200
    replay = trainer.get(f"/api/v1/leases/{body['lease_id']}/batch")
    assert replay.status_code == 200 and replay.content == first.content
    payload = first.content[first.content.index(b'"batch":') + len(b'"batch":') : -1]
    assert hashlib.sha256(payload).hexdigest() == body["manifest"]["content_hash"]
    assert orjson.loads(payload) == body["batch"]


def _row(uid: str, prompt: list[int], response: list[int], *, reward, logprobs) -> dict:
    return {
        "uid": uid,
        "trajectory_uid": f"t-{uid}",
        "prompt_group_uid": None,
        "step_index": 0,
        "prompt_ids": np.array(prompt, dtype=np.int32),
        "response_ids": np.array(response, dtype=np.int32),
        "rollout_logprobs": logprobs,
        "reward": reward,
        "reward_scope": "step" if reward is not None else None,
        "reward_source": "env" if reward is not None else None,
        "policy_version": None,
        "staleness": None,
        "mask": False,
    }
