"""bench.prefix_train at a tiny size: the tree-packed forward + backward gives the per-step
run's parameter gradients (allclose at fp32, the bench's own tolerance), and the bench's
JSON line carries the figures the benchmark notes quote (the bench itself runs W-agentic's
full shape)."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bench import prefix_train  # noqa: E402
from claw_client import build_prefix_tree, response_logprobs  # noqa: E402

SCALE = 0.01  # 64 steps of 7 to 20 tokens


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as the bench runs on a shared machine (the bench sets it itself)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def grads(model):
    return [p.grad.detach().clone() for p in model.parameters()]


def test_packed_gradients_equal_per_step_and_padded():
    # given a tiny Llama and one tiny W-agentic group
    work = prefix_train.workload(1, SCALE)
    longest = max(map(len, work[0].seqs))
    # (grouped-query attention, 2 kv heads for 4 query heads, as real models use)
    model = prefix_train.make_model(hidden=32, layers=2, heads=4, kv_heads=2, max_len=longest)
    # when each variant runs forward + backward (chunks of 8 tokens, so the plan has many)
    runs = {}
    for name, fn in (
        ("per_step", lambda: prefix_train.per_step(model, work)),
        ("padded", lambda: prefix_train.padded_step(model, work, micro_batch=3)),
        ("packed", lambda: prefix_train.packed_step(model, work, chunk=8)),
        ("dense", lambda: prefix_train.packed_step(model, work, chunk=8, attention="dense")),
    ):
        model.zero_grad(set_to_none=True)
        fn()
        runs[name] = grads(model)
    # then every parameter's gradient agrees with the per-step run's
    for name in ("padded", "packed", "dense"):
        for got, want in zip(runs[name], runs["per_step"], strict=True):
            assert torch.allclose(got, want, rtol=prefix_train.GRAD_RTOL, atol=prefix_train.GRAD_ATOL), name
    # and the check can fail: a plain causal mask over the packed tokens gives other gradients
    tree = build_prefix_tree(work[0].seqs, work[0].plens)
    u = len(tree.input_ids)
    model.zero_grad(set_to_none=True)
    causal_mask = torch.full((u, u), float("-inf")).triu(1)
    causal = prefix_train.TreePlan([(0, u, (0, u), causal_mask)])
    model.set_attn_implementation(prefix_train.ATTENTION_NAME)
    try:
        logits = model(
            input_ids=torch.from_numpy(tree.input_ids.astype(np.int64))[None],
            position_ids=torch.from_numpy(tree.position_ids.astype(np.int64))[None],
            tree_plan=causal,
        ).logits[0]
    finally:
        model.set_attn_implementation("sdpa")
    (-torch.cat(response_logprobs(logits, tree)).sum() / work[0].n_response).backward()
    assert not prefix_train.grad_diff(grads(model), runs["per_step"])["allclose"]


def test_plan_keys_are_what_each_chunk_attends():
    # given a tiny group's tree, cut into chunks of 8 query tokens
    work = prefix_train.workload(1, SCALE)
    tree = build_prefix_tree(work[0].seqs, work[0].plens)
    u = len(tree.input_ids)
    plan = prefix_train.tree_sdpa_plan(tree, chunk=8)
    # then the chunks tile the packed tokens, and each chunk's keys and mask are exactly the
    # ancestor-or-self pairs of the tree (walked up through parent)
    assert [c[0] for c in plan.chunks] == sorted(c[0] for c in plan.chunks)
    assert plan.chunks[0][0] == 0 and plan.chunks[-1][1] == u
    assert all(x[1] == y[0] for x, y in zip(plan.chunks[:-1], plan.chunks[1:], strict=True))
    for a, b, keys, mask in plan.chunks:
        key_list = list(range(*keys)) if isinstance(keys, tuple) else keys.tolist()
        dense = np.ones((b - a, len(key_list)), dtype=bool) if mask is None else mask.numpy() == 0
        for row, q in enumerate(range(a, b)):
            seen, k = set(), q
            while k >= 0:
                seen.add(k)
                k = int(tree.parent[k])
            assert {key_list[j] for j in np.flatnonzero(dense[row])} == seen
        assert dense.any(axis=0).all()  # no key is gathered for nothing


def test_bench_prints_one_json_line(capsys):
    # when the bench runs at a tiny size
    prefix_train.main(
        [
            "--scale",
            str(SCALE),
            "--hidden",
            "16",
            "--layers",
            "1",
            "--threads",
            "1",
            "--compare-scale",
            str(SCALE),
        ]
    )
    out = capsys.readouterr().out.strip().splitlines()
    # then its last line is the JSON the benchmark notes quote
    fig = json.loads(out[-1])
    assert fig["steps"] == 64 and fig["grad_allclose"] is True
    assert fig["grad_max_abs_diff"] <= prefix_train.GRAD_RTOL * fig["grad_max_abs"] + prefix_train.GRAD_ATOL
    assert fig["grad_tolerance"] == {"rtol": prefix_train.GRAD_RTOL, "atol": prefix_train.GRAD_ATOL}
    assert fig["packed_tokens"] < fig["per_step_tokens"] < fig["padded_tokens"]
    assert fig["packed_over_per_step_tokens"] == round(fig["packed_tokens"] / fig["per_step_tokens"], 4)
    for key in ("packed_over_padded_speedup", "packed_over_per_step_speedup", "model_params"):
        assert fig[key] > 0
    assert fig["attention"].startswith(prefix_train.ATTENTION_NAME)
    trials = fig["attention_trials"]
    assert trials["blocks"]["grad_max_abs_diff_vs_blocks"] == 0.0
    assert trials["dense"]["grad_max_abs_diff_vs_blocks"] <= 1e-6
