"""Tree attention: one packed forward gives the same response logprobs as flat per-step forwards.

A tiny randomly initialised Llama (built locally, no download) runs on CPU in fp32 over a
small agentic workload (shared system prompt, 2 rollouts x 3 turns, plus a duplicated step).
Flat: one forward per step. Packed: one forward over the prefix tree with its position ids
and tree mask, through SDPA (boolean mask), eager attention (additive mask) and FlexAttention
(our analytic BlockMask). Every response-token logprob must agree to 1e-4.

README: "claw_client (no Django dependency) builds the same tree trainer-side, turns it into a
boolean SDPA mask or a FlexAttention BlockMask, and recovers per-step response logprobs from
the packed logits; a test shows they match the flat per-step forward of a small transformer
to 1e-4 in fp32." (without Django: tests/client/test_client_package.py)
"""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bench.workloads import w_agentic  # noqa: E402
from claw_client import (  # noqa: E402
    build_prefix_tree,
    response_logprobs,
    token_logprobs,
    tree_attention_mask,
    tree_block_mask,
    tree_block_tables,
    tree_mask_mod,
)

VOCAB = 1000
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention, as real models use
        max_position_embeddings=512,
        attn_implementation="sdpa",
    )
    m = transformers.LlamaForCausalLM(config).eval()
    return m


@pytest.fixture(scope="module")
def workload():
    steps = w_agentic(groups=1, seed=0, system=24, rollouts=2, turns=3, answer=5, observation=7, vocab=VOCAB)
    seqs = [s.prompt + s.response for s in steps]
    plens = [len(s.prompt) for s in steps]
    # an identical resubmission of a step shares every packed position with it
    seqs.append(list(seqs[1]))
    plens.append(plens[1])
    return seqs, plens


def flat_logprobs(model, seqs, plens) -> list[torch.Tensor]:
    out = []
    with torch.no_grad():
        for s, p in zip(seqs, plens, strict=True):
            ids = torch.tensor([s])
            logits = model(input_ids=ids).logits[0]
            lp = torch.log_softmax(logits[p - 1 : len(s) - 1], dim=-1)
            out.append(lp.gather(-1, ids[0, p:, None])[:, 0])
    return out


def packed_logits(model, tree, attention_mask) -> torch.Tensor:
    with torch.no_grad():
        return model(
            input_ids=torch.from_numpy(tree.input_ids.astype(np.int64))[None],
            position_ids=torch.from_numpy(tree.position_ids.astype(np.int64))[None],
            attention_mask=attention_mask,
        ).logits[0]


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    assert [len(x) for x in a] == [len(y) for y in b]
    return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))


def test_packed_sdpa_matches_flat(model, workload):
    # given a tiny Llama and an agentic workload, scored flat, one step at a time
    seqs, plens = workload
    flat = flat_logprobs(model, seqs, plens)
    # when the steps are merged and run as ONE packed forward with the dense tree mask
    tree = build_prefix_tree(seqs, plens)
    assert tree.stats.unique_tokens < tree.stats.total_tokens / 2
    logits = packed_logits(model, tree, tree_attention_mask(tree))
    packed = response_logprobs(logits, tree)
    # then every response-token logprob agrees
    assert max_diff(flat, packed) <= TOLERANCE
    # and a plain causal mask over the same packed tokens would not (the test can fail)
    causal = torch.ones(len(tree.input_ids), len(tree.input_ids), dtype=torch.bool).tril()[None, None]
    assert max_diff(flat, response_logprobs(packed_logits(model, tree, causal), tree)) > 1e-2


def test_packed_eager_additive_mask_matches_flat(model, workload):
    seqs, plens = workload
    flat = flat_logprobs(model, seqs, plens)
    tree = build_prefix_tree(seqs, plens)
    model.set_attn_implementation("eager")
    try:
        logits = packed_logits(model, tree, tree_attention_mask(tree, additive=True))
    finally:
        model.set_attn_implementation("sdpa")
    assert max_diff(flat, response_logprobs(logits, tree)) <= TOLERANCE


def _flex_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention through torch's flex_attention with the BlockMask passed as the mask.

    Uncompiled (CPU, no inductor), so it exercises the mask_mod and the BlockMask plumbing;
    the block tables themselves are checked against create_block_mask below.
    """
    from torch.nn.attention.flex_attention import flex_attention

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = flex_attention(
            query,
            key,
            value,
            block_mask=attention_mask,
            scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1],
        )
    return out.transpose(1, 2).contiguous(), None


def test_packed_flex_attention_matches_flat(model, workload):
    seqs, plens = workload
    flat = flat_logprobs(model, seqs, plens)
    tree = build_prefix_tree(seqs, plens)
    transformers.AttentionInterface.register("claw_tree_flex", _flex_forward)
    model.set_attn_implementation("claw_tree_flex")
    try:
        logits = packed_logits(model, tree, tree_block_mask(tree, block_size=16))
    finally:
        model.set_attn_implementation("sdpa")
    assert max_diff(flat, response_logprobs(logits, tree)) <= TOLERANCE


def random_tree(rng: random.Random):
    system = [rng.randrange(7) for _ in range(rng.randint(0, 40))]
    seqs = []
    for _ in range(rng.randint(1, 8)):
        base = rng.choice(seqs) if seqs and rng.random() < 0.5 else system
        cut = rng.randint(0, len(base))
        seqs.append(base[:cut] + [rng.randrange(7) for _ in range(rng.randint(0, 50))])
    return build_prefix_tree(seqs, [rng.randint(0, len(s)) for s in seqs])


def test_dense_mask_is_ancestor_or_self():
    rng = random.Random(1)
    for _ in range(40):
        tree = random_tree(rng)
        u = len(tree.input_ids)
        mask = tree_attention_mask(tree)[0, 0].numpy()
        brute = np.zeros((u, u), dtype=bool)
        for q in range(u):
            k = q
            while k >= 0:
                brute[q, k] = True
                k = int(tree.parent[k])
        assert np.array_equal(mask, brute)


@pytest.mark.parametrize("block_size", [8, 16, 128])
def test_block_mask_equals_create_block_mask(block_size):
    """Our analytic block tables are exactly what create_block_mask computes by evaluating
    the mask_mod on every pair (partial and full blocks, both directions)."""
    from torch.nn.attention.flex_attention import create_block_mask

    rng = random.Random(block_size)
    for _ in range(25):
        tree = random_tree(rng)
        u = len(tree.input_ids)
        if u == 0:
            continue
        ours = tree_block_mask(tree, block_size=block_size)
        ref = create_block_mask(tree_mask_mod(tree), 1, 1, u, u, device="cpu", BLOCK_SIZE=block_size)
        assert torch.equal(ours.to_dense(), ref.to_dense())
        for num, idx in (
            ("kv_num_blocks", "kv_indices"),
            ("full_kv_num_blocks", "full_kv_indices"),
            ("q_num_blocks", "q_indices"),
            ("full_q_num_blocks", "full_q_indices"),
        ):
            a_num, b_num = getattr(ours, num)[0, 0], getattr(ref, num)[0, 0]
            assert torch.equal(a_num, b_num), num
            a_idx, b_idx = getattr(ours, idx)[0, 0], getattr(ref, idx)[0, 0]
            for row, n in enumerate(a_num.tolist()):
                assert sorted(a_idx[row, :n].tolist()) == sorted(b_idx[row, :n].tolist()), (idx, row)
        # the numpy tables (no torch) are the same forward tables
        kv_num, kv_idx, full_num, full_idx = tree_block_tables(tree, block_size=block_size)
        assert kv_num.tolist() == ours.kv_num_blocks[0, 0].tolist()
        assert full_num.tolist() == ours.full_kv_num_blocks[0, 0].tolist()


def test_flex_attention_with_tree_block_mask_equals_sdpa_with_dense_mask():
    from torch.nn.attention.flex_attention import flex_attention

    rng = random.Random(2)
    torch.manual_seed(2)
    tree = random_tree(rng)
    u = len(tree.input_ids)
    q, k, v = (torch.randn(1, 2, u, 16) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flex = flex_attention(q, k, v, block_mask=tree_block_mask(tree, block_size=16))
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=tree_attention_mask(tree))
    assert float((flex - dense).abs().max()) < 1e-5


def test_logprobs_numpy_and_torch_agree_and_keep_gradients():
    rng = random.Random(4)
    tree = random_tree(rng)
    u = len(tree.input_ids)
    torch.manual_seed(4)
    logits = torch.randn(u, 9, requires_grad=True)
    per_step_t = response_logprobs(logits, tree)
    per_step_n = response_logprobs(logits.detach().numpy(), tree)
    for a, b in zip(per_step_t, per_step_n, strict=True):
        assert np.allclose(a.detach().numpy(), b, equal_nan=True, atol=1e-6)
    # by definition: the parent's logit row scores the token
    q = int(np.flatnonzero(tree.parent >= 0)[0]) if (tree.parent >= 0).any() else None
    if q is not None:
        expect = torch.log_softmax(logits[tree.parent[q]], -1)[tree.input_ids[q]]
        assert torch.allclose(token_logprobs(logits, tree, [q])[0], expect)
    # a root token has no context
    assert torch.isnan(token_logprobs(logits, tree, [0])[0])
    # gradients flow back to the logits
    total = sum(x[~torch.isnan(x)].sum() for x in per_step_t if len(x))
    if isinstance(total, torch.Tensor):
        total.backward()
        assert logits.grad is not None and logits.grad.abs().sum() > 0
