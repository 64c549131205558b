"""claw_client.formats reads back every batch format the server writes (curation/formats.py):
the same steps, field by field, from ``steps``, ``padded`` and ``tree`` JSON. The live
round trip through a pull is tests/client/test_client_api.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from claw_client import Batch, batch_steps
from claw_kit.web.renderers import dumps
from curation.formats import RENDERERS


def row(uid: str, prompt: list[int], response: list[int], logprobs: list[float] | None, **kw) -> dict:
    return {
        "uid": uid,
        "trajectory_uid": uid.split(":")[0],
        "prompt_group_uid": kw.get("group"),
        "step_index": int(uid.split(":")[1]),
        "policy_version": kw.get("policy_version"),
        "staleness": None,
        "mask": kw.get("mask", False),
        "prompt_ids": np.asarray(prompt, dtype=np.int32),
        "response_ids": np.asarray(response, dtype=np.int32),
        "rollout_logprobs": None if logprobs is None else np.asarray(logprobs, dtype=np.float64),
        "reward": kw.get("reward"),
        "reward_scope": "step" if kw.get("reward") is not None else "none",
        "reward_source": "rule",
        "images": kw.get("images", []),
    }


# Cases a naive reader gets wrong: token id 0 (the pad id) inside a prompt and a response,
# a masked step, a step without logprobs and one with a null reward, two identical steps
# (one packed sequence in the tree), a step whose prompt is another's whole sequence, an
# empty response, and images.
ROWS = [
    row("a:0", [0, 1, 2], [0, 5], [-0.5, -0.25], group="g", reward=1.0, policy_version=3),
    row("a:1", [0, 1, 2, 0, 5, 7], [8], [-0.125], group="g", reward=0.5),
    row("b:0", [0, 1, 2], [0, 5], None, group="g", reward=0.0, mask=True),
    row("c:0", [0, 1, 2], [0, 5], [-1.0, -2.0], group="g"),
    row("d:0", [9], [], None, reward=2.0, images=[{"sha256": "0" * 64, "media_type": "image/png"}]),
]
FORMATS = sorted(RENDERERS)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_reads_back_the_steps_it_was_written_from(fmt):
    # given a batch written in fmt by the server's renderer, as JSON over the wire
    served = json.loads(dumps(RENDERERS[fmt](ROWS)))
    # when the client reads its steps
    got = batch_steps(served, fmt)
    # then they are the rows, in order, field by field, arrays as numpy
    assert [s["uid"] for s in got] == [r["uid"] for r in ROWS]
    for s, r in zip(got, ROWS, strict=True):
        for field in ("trajectory_uid", "prompt_group_uid", "step_index", "policy_version", "mask"):
            assert s[field] == r[field], (fmt, r["uid"], field)
        assert (s["reward"], s["reward_scope"], s["reward_source"]) == (
            r["reward"],
            r["reward_scope"],
            r["reward_source"],
        )
        assert s["images"] == r["images"]
        assert s["prompt_ids"].dtype == np.int32 and s["response_ids"].dtype == np.int32
        assert s["prompt_ids"].tolist() == r["prompt_ids"].tolist(), (fmt, r["uid"])
        assert s["response_ids"].tolist() == r["response_ids"].tolist(), (fmt, r["uid"])
        if r["rollout_logprobs"] is None:
            assert s["rollout_logprobs"] is None
        else:
            assert s["rollout_logprobs"].dtype == np.float64
            assert s["rollout_logprobs"].tolist() == r["rollout_logprobs"].tolist()
    # and the format is also told by the batch's own keys
    assert [s["uid"] for s in batch_steps(served)] == [r["uid"] for r in ROWS]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_batch_of_any_format_has_its_len_repr_steps_and_iteration(fmt):
    body = {
        "lease_id": "L",
        "manifest": {"format": fmt, "step_uids": [r["uid"] for r in ROWS]},
        "batch": RENDERERS[fmt](ROWS),
    }
    batch = Batch(dumps(body))
    assert len(batch) == len(ROWS) and batch.format == fmt
    assert repr(batch) == f"Batch(lease_id='L', format='{fmt}', steps={len(ROWS)})"
    assert [s["uid"] for s in batch] == [s["uid"] for s in batch.steps] == body["manifest"]["step_uids"]


def test_a_format_the_client_does_not_know_loads_but_has_no_step_view():
    """README: "For a format the client does not know, batch.steps raises TypeError naming it
    (batch.batch holds its JSON)." """
    body = {"lease_id": "L", "manifest": {"format": "columns", "step_uids": ["x:0"]}, "batch": {"cols": []}}
    batch = Batch(json.dumps(body).encode())
    assert len(batch) == 1 and "columns" in repr(batch)
    with pytest.raises(TypeError, match="'columns' batch format"):
        _ = batch.steps
    assert batch.batch == {"cols": []}


def test_a_tree_whose_walk_does_not_reach_a_root_is_refused():
    served = json.loads(dumps(RENDERERS["tree"](ROWS[:1])))
    served["lengths"] = [served["lengths"][0] - 1]  # one token short of its root
    served["prompt_lens"] = [2]
    with pytest.raises(ValueError, match="well-formed tree"):
        batch_steps(served, "tree")


@pytest.mark.parametrize("fmt", ["padded", "tree"])
def test_collate_steps_of_a_padded_or_tree_batch_is_that_of_its_steps_batch(fmt):
    pytest.importorskip("torch")
    from claw_client import collate_steps

    def pulled(f: str) -> Batch:
        manifest = {"format": f, "step_uids": [r["uid"] for r in ROWS]}
        return Batch(dumps({"lease_id": "L", "manifest": manifest, "batch": RENDERERS[f](ROWS)}))

    want, got = collate_steps(pulled("steps")), collate_steps(pulled(fmt))
    for name in ("input_ids", "attention_mask", "position_ids", "response_mask", "rollout_logprobs"):
        assert got[name].tolist() == want[name].tolist(), name
    assert got["rewards"].tolist() == want["rewards"].tolist() and got["step_uids"] == want["step_uids"]
