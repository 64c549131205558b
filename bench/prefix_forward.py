"""bench.prefix_forward: a tiny model's forward over an agentic group, flat vs tree-packed (CPU).

    python -m bench.prefix_forward [--repeat 5] [--hidden 128] [--layers 2] [--threads 1]

Workload: W-agentic's shape, scaled down (shared 256-token prompt, 4 rollouts x 4 turns,
32-token answers, 64-token observations, ids < 1000). Model: a randomly initialised
Hugging Face Llama built locally (fp32, SDPA attention, no download).

* flat (per step):   one forward per step, batch size 1;
* flat (padded):     all steps in one right-padded batch;
* packed:            one forward over the prefix tree (position ids + dense tree mask).

Prints the time ratio next to the token ratio, checks that the response logprobs agree, then
one JSON line on stdout. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from .workloads import w_agentic

VOCAB = 1000


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    import torch
    import transformers

    from claw_client import build_prefix_tree, response_logprobs, tree_attention_mask

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1: steadier on a shared machine)"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    steps = w_agentic(
        groups=1, seed=0, system=256, rollouts=4, turns=4, answer=32, observation=64, vocab=VOCAB
    )
    seqs = [s.prompt + s.response for s in steps]
    plens = [len(s.prompt) for s in steps]
    tree = build_prefix_tree(seqs, plens)
    total, unique = tree.stats.total_tokens, tree.stats.unique_tokens
    log(f"{len(seqs)} steps, {total} step tokens, {unique} unique (token ratio {unique / total:.3f})")

    torch.manual_seed(0)
    config = transformers.LlamaConfig(  # type: ignore[call-arg]  # (stubs lack attn_implementation)
        vocab_size=VOCAB,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        attn_implementation="sdpa",
    )
    model = transformers.LlamaForCausalLM(config).eval()

    flat_ids = [torch.tensor([s]) for s in seqs]
    longest = max(map(len, seqs))
    padded = torch.zeros(len(seqs), longest, dtype=torch.long)
    pad_mask = torch.zeros(len(seqs), longest, dtype=torch.long)
    for i, s in enumerate(seqs):
        padded[i, : len(s)] = torch.tensor(s)
        pad_mask[i, : len(s)] = 1
    packed_ids = torch.from_numpy(tree.input_ids.astype(np.int64))[None]
    packed_pos = torch.from_numpy(tree.position_ids.astype(np.int64))[None]

    def flat_each():
        return [model(input_ids=ids).logits[0] for ids in flat_ids]

    def flat_padded():
        return model(input_ids=padded, attention_mask=pad_mask).logits

    def packed():
        mask = tree_attention_mask(tree)  # built inside the timing: part of the packed cost
        return model(input_ids=packed_ids, position_ids=packed_pos, attention_mask=mask).logits[0]

    def timed(fn):
        fn()  # warm-up
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            out = fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times), out

    with torch.no_grad():
        t_each, each_logits = timed(flat_each)
        log(f"flat (per step): {t_each * 1e3:8.1f} ms")
        t_pad, _ = timed(flat_padded)
        log(f"flat (padded):   {t_pad * 1e3:8.1f} ms  ({len(seqs) * longest} padded tokens)")
        t_packed, packed_logits = timed(packed)
        log(f"packed (tree):   {t_packed * 1e3:8.1f} ms")

    flat_lp = [
        torch.log_softmax(lg[p - 1 : len(s) - 1], -1).gather(-1, torch.tensor(s[p:])[:, None])[:, 0]
        for lg, s, p in zip(each_logits, seqs, plens, strict=True)
    ]
    diff = max(
        float((a - b).abs().max())
        for a, b in zip(flat_lp, response_logprobs(packed_logits, tree), strict=True)
    )
    log(
        f"time ratio packed/flat-per-step {t_packed / t_each:.3f}, packed/flat-padded {t_packed / t_pad:.3f}, "
        f"token ratio {unique / total:.3f}; max |logprob diff| {diff:.2e}"
    )
    print(
        json.dumps(
            {
                "workload": "W-agentic-mini (S=256, R=4, T=4, A=32, O=64)",
                "model": f"llama hidden={args.hidden} layers={args.layers} fp32 cpu sdpa",
                "torch_threads": torch.get_num_threads(),
                "steps": len(seqs),
                "total_tokens": total,
                "unique_tokens": unique,
                "token_ratio": round(unique / total, 4),
                "flat_ms": round(t_each * 1e3, 2),
                "flat_padded_ms": round(t_pad * 1e3, 2),
                "packed_ms": round(t_packed * 1e3, 2),
                "time_ratio": round(t_packed / t_each, 4),
                "time_ratio_vs_padded": round(t_packed / t_pad, 4),
                "max_logprob_diff": diff,
            }
        )
    )


if __name__ == "__main__":
    main()
