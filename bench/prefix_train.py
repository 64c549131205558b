"""bench.prefix_train: forward + backward of a small Llama over W-agentic groups: tree-packed
vs padded vs per-step (CPU), with the parameters' gradients compared.

    python -m bench.prefix_train [--groups 1] [--scale 1.0] [--hidden 64] [--layers 2]
        [--threads 2] [--repeat 1] [--chunk 256] [--micro-batch 8] [--compare-scale 0.25]

Workload: W-agentic's sequence shape (``--scale 1``: 64 steps of 4,150 to 8,000 tokens per
group, 36,000 unique), token ids < 1,000 so that a small vocabulary fits; ``--groups N``
takes the first N groups of W-agentic-64 (the same generator, one rng). ``--scale`` shrinks
the prompt, answer and observation lengths (not the 8 x 8 steps) for quick runs.
Model: a randomly initialised Hugging Face Llama built locally (fp32, no download).
Loss: the token-mean negative log-likelihood of every step's response tokens, per group.
Each variant runs every group in turn and accumulates the gradients:

* per step: one forward + backward per step (batch 1, causal SDPA);
* padded:   the group's steps right-padded to its longest step, in micro-batches of
  ``--micro-batch`` steps, causal SDPA and no padding mask (right padding needs none: no
  real token attends a pad, so the gradients are exact and the baseline is SDPA's fastest);
* packed:   one forward + backward over the group's prefix tree (position ids + tree
  attention); building the tree and the attention plan is inside the timing.

Tree attention (the packed run uses ``blocks``; ``--compare-scale`` also times the others on
a smaller shape and reports what each gave):

* blocks: SDPA once per query chunk (``--chunk`` tokens, cut at every branch point) over
  only the keys that chunk can see (its ancestors and itself, from ``subtree_end``), with a
  chunk x keys mask. Work is about the tree's real (query, key) pairs; an autograd Function
  keeps the backward's key gradients in one buffer (see ``_tree_attention_function``).
* dense:  SDPA with the dense U x U tree mask (``claw_client.tree_attention_mask``): U^2
  work and memory, skipped when the mask would pass ``DENSE_MAX_TOKENS``.
* flex:   ``flex_attention`` with ``claw_client.tree_block_mask``; torch refuses its
  backward on CPU, and the bench records the refusal.

The variants run interleaved in the same process (the machine is shared, so only ratios of
the same run mean anything). Prints progress on stderr and one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .workloads import ANSWER, OBSERVATION, ROLLOUTS, SYSTEM, TURNS, w_agentic

VOCAB = 1000
GRAD_RTOL = 1e-4  # torch.allclose(packed, per_step, rtol, atol) on every parameter's gradient
GRAD_ATOL = 1e-7  # the gradients are ~1e-2 at most; fp32 reordering differs by ~1e-9
DENSE_MAX_TOKENS = 12_000  # a U x U mask past this needs gigabytes (bool mask + SDPA's float copy)
ATTENTION_NAME = "claw_tree_blocks"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Group:
    """One GRPO group: its steps' sequences, prompt lengths and response-token count."""

    seqs: list[list[int]]
    plens: list[int]

    @property
    def n_response(self) -> int:
        return sum(len(s) - p for s, p in zip(self.seqs, self.plens, strict=True))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--groups", type=int, default=1, help="first N groups of W-agentic-64")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of W-agentic's lengths")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="timed rounds (variants interleaved)")
    ap.add_argument("--chunk", type=int, default=256, help="query tokens per SDPA call (blocks)")
    ap.add_argument("--micro-batch", type=int, default=8, help="steps per padded forward")
    ap.add_argument(
        "--compare-scale", type=float, default=0.25, help="shape of the attention trials (0: none)"
    )
    args = ap.parse_args(argv)
    result = run(
        groups=args.groups,
        scale=args.scale,
        hidden=args.hidden,
        layers=args.layers,
        heads=args.heads,
        threads=args.threads,
        repeat=args.repeat,
        chunk=args.chunk,
        micro_batch=args.micro_batch,
        compare_scale=args.compare_scale,
    )
    print(json.dumps(result))


def run(
    *,
    groups: int = 1,
    scale: float = 1.0,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    threads: int = 2,
    repeat: int = 1,
    chunk: int = 256,
    micro_batch: int = 8,
    compare_scale: float = 0.0,
) -> dict[str, Any]:
    """Time the three variants interleaved, compare their gradients; the JSON figures."""
    import torch

    torch.set_num_threads(threads)
    work = workload(groups, scale)
    longest = max(len(s) for g in work for s in g.seqs)
    model = make_model(hidden=hidden, layers=layers, heads=heads, max_len=longest)
    variants: dict[str, Callable[[], None]] = {
        "packed": lambda: packed_step(model, work, chunk=chunk),
        "padded": lambda: padded_step(model, work, micro_batch=micro_batch),
        "per_step": lambda: per_step(model, work),
    }
    shape = token_counts(work, chunk=chunk)
    log(
        f"{groups} group(s), {shape['steps']} steps, {shape['per_step_tokens']:,} step tokens, "
        f"{shape['padded_tokens']:,} padded, {shape['packed_tokens']:,} packed; "
        f"model hidden={hidden} layers={layers}, {threads} torch threads"
    )
    warm = workload(1, 0.02)  # kernels and allocator warmed on a tiny group, untimed
    for fn in (
        lambda: packed_step(model, warm, chunk=chunk),
        lambda: padded_step(model, warm, micro_batch=micro_batch),
        lambda: per_step(model, warm),
    ):
        fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    grads: dict[str, list[torch.Tensor]] = {}
    names = list(variants)
    for r in range(repeat):
        for name in names[r % 3 :] + names[: r % 3]:  # rotate the order every round
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - t0)
            grads[name] = [p.grad.detach().clone() for p in model.parameters()]
            log(f"round {r + 1}: {name:8s} fwd+bwd {times[name][-1]:8.2f} s")
    t = {name: float(np.median(v)) for name, v in times.items()}
    diff_step = grad_diff(grads["packed"], grads["per_step"])
    diff_pad = grad_diff(grads["padded"], grads["per_step"])
    log(
        f"speed-up of packed: {t['padded'] / t['packed']:.2f}x over padded, "
        f"{t['per_step'] / t['packed']:.2f}x over per step; token ratios "
        f"{shape['packed_tokens'] / shape['padded_tokens']:.4f} (vs padded), "
        f"{shape['packed_tokens'] / shape['per_step_tokens']:.4f} (vs per step); "
        f"max |grad packed - grad per step| {diff_step['max_abs_diff']:.2e} "
        f"(max |grad| {diff_step['max_abs']:.2e}; allclose rtol={GRAD_RTOL} atol={GRAD_ATOL}: "
        f"{diff_step['allclose']})"
    )
    trials = attention_trials(model, compare_scale, chunk=chunk) if compare_scale > 0 else {}
    n_params = sum(p.numel() for p in model.parameters())
    return {
        "workload": (
            f"W-agentic-64, first {groups} group(s)" + ("" if scale == 1 else f", lengths x{scale}")
        ),
        "model": f"llama hidden={hidden} layers={layers} heads={heads} vocab={VOCAB} fp32 cpu",
        "model_params": n_params,
        "torch_threads": torch.get_num_threads(),
        "attention": f"{ATTENTION_NAME} (SDPA per {chunk}-token query chunk over its visible keys)",
        **shape,
        "packed_s": round(t["packed"], 3),
        "padded_s": round(t["padded"], 3),
        "per_step_s": round(t["per_step"], 3),
        "packed_over_padded_speedup": round(t["padded"] / t["packed"], 3),
        "packed_over_per_step_speedup": round(t["per_step"] / t["packed"], 3),
        "packed_over_padded_tokens": round(shape["packed_tokens"] / shape["padded_tokens"], 4),
        "packed_over_per_step_tokens": round(shape["packed_tokens"] / shape["per_step_tokens"], 4),
        "grad_max_abs_diff": diff_step["max_abs_diff"],
        "grad_max_abs": diff_step["max_abs"],
        "grad_allclose": diff_step["allclose"],
        "grad_tolerance": {"rtol": GRAD_RTOL, "atol": GRAD_ATOL},
        "padded_grad_max_abs_diff": diff_pad["max_abs_diff"],
        "padded_grad_allclose": diff_pad["allclose"],
        "micro_batch": micro_batch,
        "repeat": repeat,
        "attention_trials": trials,
    }


# --- workload and model ------------------------------------------------------------------------
def workload(groups: int, scale: float) -> list[Group]:
    """The first ``groups`` groups of W-agentic-64, lengths scaled by ``scale`` (>= 1 token)."""

    def size(n: int) -> int:
        return max(1, round(n * scale))

    steps = w_agentic(
        groups=groups,
        seed=0,
        system=size(SYSTEM),
        rollouts=ROLLOUTS,
        turns=TURNS,
        answer=size(ANSWER),
        observation=size(OBSERVATION),
        vocab=VOCAB,
    )
    out = []
    for g in range(groups):
        mine = [s for s in steps if s.group == g]
        out.append(Group([s.prompt + s.response for s in mine], [len(s.prompt) for s in mine]))
    return out


def make_model(*, hidden: int, layers: int, heads: int, max_len: int, kv_heads: int | None = None):
    import torch
    import transformers

    transformers.AttentionInterface.register(ATTENTION_NAME, tree_sdpa_attention)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(  # type: ignore[call-arg]  # (stubs lack attn_implementation)
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        max_position_embeddings=max(2048, max_len),
        attn_implementation="sdpa",
    )
    return transformers.LlamaForCausalLM(config).train()


def token_counts(work: Sequence[Group], *, chunk: int) -> dict[str, int]:
    """Tokens each variant runs, and the (query, key) pairs its attention computes."""
    from claw_client import build_prefix_tree

    per_step = padded = packed = 0
    pairs_step = pairs_pad = pairs_tree = pairs_blocks = 0
    for g in work:
        lens = np.array([len(s) for s in g.seqs], dtype=np.int64)
        tree = build_prefix_tree(g.seqs, g.plens)
        per_step += int(lens.sum())
        padded += len(lens) * int(lens.max())
        packed += len(tree.input_ids)
        pairs_step += int((lens * (lens + 1) // 2).sum())
        pairs_pad += len(lens) * int(lens.max()) * (int(lens.max()) + 1) // 2
        pairs_tree += int((tree.position_ids.astype(np.int64) + 1).sum())
        pairs_blocks += sum((b - a) * len(k) for a, b, k in _chunks(tree.subtree_end, tree.parent, chunk))
    return {
        "steps": sum(len(g.seqs) for g in work),
        "per_step_tokens": per_step,
        "padded_tokens": padded,
        "packed_tokens": packed,
        "per_step_attention_pairs": pairs_step,
        "padded_attention_pairs": pairs_pad,
        "tree_attention_pairs": pairs_tree,
        "blocks_attention_pairs": pairs_blocks,
    }


# --- the three variants ---------------------------------------------------------------------------
def per_step(model, work: Sequence[Group]) -> None:
    import torch

    for g in work:
        n = g.n_response
        for s, p in zip(g.seqs, g.plens, strict=True):
            ids = torch.tensor([s])
            logits = model(input_ids=ids).logits[0]
            lp = torch.log_softmax(logits[p - 1 : len(s) - 1], -1).gather(-1, ids[0, p:, None])
            (-lp.sum() / n).backward()


def padded_step(model, work: Sequence[Group], *, micro_batch: int) -> None:
    import torch

    for g in work:
        n = g.n_response
        longest = max(map(len, g.seqs))
        for i in range(0, len(g.seqs), micro_batch):
            seqs, plens = g.seqs[i : i + micro_batch], g.plens[i : i + micro_batch]
            ids = torch.zeros(len(seqs), longest, dtype=torch.long)
            weight = torch.zeros(len(seqs), longest - 1)
            for j, (s, p) in enumerate(zip(seqs, plens, strict=True)):
                ids[j, : len(s)] = torch.tensor(s)
                weight[j, p - 1 : len(s) - 1] = 1.0
            logits = model(input_ids=ids).logits
            lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
            (-(lp * weight).sum() / n).backward()


def packed_step(model, work: Sequence[Group], *, chunk: int, attention: str = "blocks") -> None:
    import torch

    from claw_client import build_prefix_tree, response_logprobs, tree_attention_mask, tree_block_mask

    for g in work:
        tree = build_prefix_tree(g.seqs, g.plens)
        kwargs: dict[str, Any] = {
            "input_ids": torch.from_numpy(tree.input_ids.astype(np.int64))[None],
            "position_ids": torch.from_numpy(tree.position_ids.astype(np.int64))[None],
        }
        if attention == "blocks":
            impl, kwargs["tree_plan"] = ATTENTION_NAME, tree_sdpa_plan(tree, chunk=chunk)
        elif attention == "dense":
            impl, kwargs["attention_mask"] = "sdpa", tree_attention_mask(tree)
        else:
            impl, kwargs["attention_mask"] = FLEX_NAME, tree_block_mask(tree)
        model.set_attn_implementation(impl)
        try:
            logits = model(**kwargs).logits[0]
        finally:
            model.set_attn_implementation("sdpa")
        (-torch.cat(response_logprobs(logits, tree)).sum() / g.n_response).backward()


# --- tree attention by query chunks ---------------------------------------------------------------
@dataclass(frozen=True)
class TreePlan:
    """Per query chunk ``[a, b)``: the keys it can see (a ``(start, stop)`` range or a tensor
    of packed indices), and the (b - a) x keys additive mask, 0 where the query attends the
    key and -inf elsewhere (None where the chunk's queries see all of them)."""

    chunks: list[tuple[int, int, Any, Any]]


def tree_sdpa_plan(tree, *, chunk: int = 256) -> TreePlan:
    """The chunked tree-attention plan of a packed layout: O(U^2 / chunk) integer work and
    one float per (query, visible key) pair of each chunk."""
    import torch

    se = tree.subtree_end.astype(np.int64)
    out = []
    for a, b, keys in _chunks(tree.subtree_end, tree.parent, chunk):
        q = np.arange(a, b)
        mask = (keys[None, :] <= q[:, None]) & (q[:, None] <= se[keys][None, :])
        contiguous = keys[-1] - keys[0] + 1 == len(keys)
        key_index: Any = (int(keys[0]), int(keys[-1]) + 1) if contiguous else torch.from_numpy(keys)
        additive = None
        if not mask.all():  # SDPA's flash kernel takes an additive float mask
            additive = torch.zeros(mask.shape).masked_fill_(torch.from_numpy(~mask), float("-inf"))
        out.append((a, b, key_index, additive))
    return TreePlan(out)


def _chunks(subtree_end: np.ndarray, parent: np.ndarray, chunk: int):
    """Query chunks ``(a, b, keys)``: cut at every branch point (a token whose parent is not
    the token before it) and every ``chunk`` tokens; ``keys`` are the packed indices ``k <
    b`` with ``subtree_end[k] >= a``, exactly the keys some query of the chunk attends."""
    se = subtree_end.astype(np.int64)
    u = len(se)
    cuts = np.flatnonzero(parent.astype(np.int64) != np.arange(u) - 1)
    bounds = np.union1d(np.union1d(cuts, np.arange(0, u, chunk)), [u])
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        yield a, b, np.flatnonzero(se[:b] >= a)


def tree_sdpa_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, tree_plan=None, **kwargs
):
    """A Hugging Face attention function (registered as ``claw_tree_blocks``): the tree
    attention of ``tree_plan`` (a :class:`TreePlan`, passed as a model kwarg), as one SDPA
    call per query chunk. Returns (batch, tokens, heads, dim) as the interface expects."""
    if tree_plan is None:
        raise ValueError(f"{ATTENTION_NAME} needs the model called with tree_plan=TreePlan")
    if query.shape[1] != key.shape[1]:  # grouped-query attention: one kv head per group
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = _TreeAttention.apply(query, key, value, tree_plan, scaling)
    return out.transpose(1, 2).contiguous(), None


def _tree_attention_function():
    """The autograd Function, built on first use (torch is imported lazily).

    Plain autograd over per-chunk slices and gathers would give every chunk a full-size
    zero gradient of K and V (O(U^2 / chunk) memory traffic); this backward writes each
    chunk's key gradients into one buffer instead. Forward and backward call SDPA's CPU
    flash kernels directly (the public SDPA calls the same ones), keeping each chunk's
    log-sum-exp for the backward, so nothing is recomputed.
    """
    import torch

    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    flash_bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

    def kv(t, keys):
        return t[:, :, keys[0] : keys[1]] if isinstance(keys, tuple) else t.index_select(2, keys)

    class TreeAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, query, key, value, plan, scale):
            out = torch.empty_like(query)
            lses = []
            for a, b, keys, mask in plan.chunks:
                o, lse = flash(query[:, :, a:b], kv(key, keys), kv(value, keys), attn_mask=mask, scale=scale)
                out[:, :, a:b] = o
                lses.append(lse)
            ctx.save_for_backward(query, key, value, out)
            ctx.plan, ctx.scale, ctx.lses = plan, scale, lses
            return out

        @staticmethod
        def backward(ctx, grad_out):
            query, key, value, out = ctx.saved_tensors
            dq, dk, dv = torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
            grad_out = grad_out.contiguous()
            for (a, b, keys, mask), lse in zip(ctx.plan.chunks, ctx.lses, strict=True):
                gq, gk, gv = flash_bwd(
                    grad_out[:, :, a:b],
                    query[:, :, a:b],
                    kv(key, keys),
                    kv(value, keys),
                    out[:, :, a:b],
                    lse,
                    0.0,
                    False,
                    attn_mask=mask,
                    scale=ctx.scale,
                )
                dq[:, :, a:b] = gq
                if isinstance(keys, tuple):
                    dk[:, :, keys[0] : keys[1]] += gk
                    dv[:, :, keys[0] : keys[1]] += gv
                else:
                    dk.index_add_(2, keys, gk)
                    dv.index_add_(2, keys, gv)
            return dq, dk, dv, None, None

    return TreeAttention


class _LazyFunction:
    fn: Any = None

    def apply(self, *args):
        if self.fn is None:
            self.fn = _tree_attention_function()
        return self.fn.apply(*args)


_TreeAttention = _LazyFunction()


# --- the other tree attentions, on a smaller shape ----------------------------------------------
FLEX_NAME = "claw_tree_flex"


def _flex_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    from torch.nn.attention.flex_attention import flex_attention

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = flex_attention(query, key, value, block_mask=attention_mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def attention_trials(model, scale: float, *, chunk: int) -> dict[str, Any]:
    """One packed forward + backward of one group at ``scale`` with each tree attention:
    seconds and the largest gradient difference from ``blocks``, or why it could not run."""
    import transformers

    transformers.AttentionInterface.register(FLEX_NAME, _flex_attention)
    work = workload(1, scale)
    u = token_counts(work, chunk=chunk)["packed_tokens"]
    out: dict[str, Any] = {"scale": scale, "packed_tokens": u}
    ref = None
    for name in ("blocks", "dense", "flex"):
        if name == "dense" and u > DENSE_MAX_TOKENS:
            out[name] = f"skipped: a {u} x {u} mask is {u * u / 1e9:.1f} GB as bool"
            continue
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        try:
            packed_step(model, work, chunk=chunk, attention=name)
        except (NotImplementedError, RuntimeError) as exc:
            out[name] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"
            log(f"attention {name}: {out[name]}")
            continue
        seconds = time.perf_counter() - t0
        grads = [p.grad.detach().clone() for p in model.parameters()]
        ref = ref or grads
        out[name] = {
            "s": round(seconds, 3),
            "grad_max_abs_diff_vs_blocks": grad_diff(grads, ref)["max_abs_diff"],
        }
        log(f"attention {name}: packed fwd+bwd {seconds:.2f} s at {u} tokens")
    return out


def grad_diff(a, b) -> dict[str, Any]:
    import torch

    return {
        "max_abs_diff": max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True)),
        "max_abs": max(float(y.abs().max()) for y in b),
        "allclose": all(
            torch.allclose(x, y, rtol=GRAD_RTOL, atol=GRAD_ATOL) for x, y in zip(a, b, strict=True)
        ),
    }


if __name__ == "__main__":
    main()
