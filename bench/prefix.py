"""bench.prefix: prefix-tree merge throughput, ours against a plain per-token dict trie.

    python -m bench.prefix [--repeat 5] [--no-baseline]

Workloads W-agentic and W-agentic-64 (bench/workloads.py). Each build is timed from the
token arrays as the pool stores them (a list of little-endian int32 ``bytes`` per step,
with prompt lengths) to the finished layout: input ids, position ids, parent, subtree end,
per-step token and response indices, and stats. Ours runs once to warm up and then
``--repeat`` times (median wall time reported; the cold and best runs and the median
process CPU time alongside, since a shared machine inflates wall time); the baseline
(bench/baseline_trie.py) runs once per workload in the same process, with the cyclic
garbage collector paused (which only helps it).

The attention structure is the FlexAttention BlockMask of the W-agentic tree
(claw_client.tree_block_mask): its wall time, and its peak memory measured as the
tracemalloc peak (numpy and Python allocations) plus the bytes of the torch tensors it
holds (torch allocations are invisible to tracemalloc). Without torch, the numpy block
tables alone are timed.

Progress goes to stderr; stdout gets one JSON line (headline: W-agentic-64).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

from claw_client import build_prefix_tree, tree_block_tables

from .baseline_trie import dict_trie_layout
from .workloads import W_AGENTIC_TOTAL_TOKENS, W_AGENTIC_UNIQUE_TOKENS, as_pool_bytes, w_agentic


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def bench_workload(name: str, groups: int, *, repeat: int, baseline: bool) -> tuple[dict, object]:
    log(f"{name}: generating {groups} group(s) ...")
    sequences, prompt_lens = as_pool_bytes(w_agentic(groups=groups, seed=0))
    total = sum(len(s) for s in sequences) // 4
    log(f"{name}: {len(sequences)} steps, {total:,} step tokens")

    times, cpu_times = [], []
    tree = None
    for i in range(repeat + 1):
        tree = None
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        tree = build_prefix_tree(sequences, prompt_lens)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
        log(
            f"  ours   run {i}: {times[-1] * 1e3:8.1f} ms  {total / times[-1] / 1e6:7.1f} M tok/s"
            f"  (cpu {cpu_times[-1] * 1e3:.1f} ms)" + (" (cold)" if i == 0 else "")
        )
    assert tree is not None
    warm = statistics.median(times[1:])
    stats = tree.stats
    out = {
        "workload": name,
        "steps": len(sequences),
        "total_tokens": stats.total_tokens,
        "unique_tokens": stats.unique_tokens,
        "ratio": round(stats.ratio, 6),
        "savings": round(stats.savings, 6),
        "mtok_per_s": round(total / warm / 1e6, 2),
        "mtok_per_s_cold": round(total / times[0] / 1e6, 2),
        "mtok_per_s_best": round(total / min(times) / 1e6, 2),
        # CPU time of this process: what the build costs when the machine is not shared.
        "mtok_per_cpu_s": round(total / statistics.median(cpu_times[1:]) / 1e6, 2),
        "build_ms": round(warm * 1e3, 2),
    }
    if baseline:
        gc.collect()
        gc.disable()  # the cyclic GC would rescan millions of dicts: leave it out, in the baseline's favour
        try:
            t0 = time.perf_counter()
            trie = dict_trie_layout(sequences)
            dt = time.perf_counter() - t0
        finally:
            gc.enable()
        log(f"  dict trie:    {dt * 1e3:8.1f} ms  {total / dt / 1e6:7.1f} M tok/s")
        if trie.unique_tokens != stats.unique_tokens:
            raise SystemExit(
                f"unique tokens disagree: ours {stats.unique_tokens}, dict trie {trie.unique_tokens}"
            )
        out["baseline_mtok_per_s"] = round(total / dt / 1e6, 2)
        out["speedup"] = round(dt / warm, 1)
        del trie
        gc.collect()
    log(f"  unique {stats.unique_tokens:,} of {stats.total_tokens:,} ({stats.savings:.2%} saved)")
    return out, tree


def bench_attention(tree) -> dict:
    """Time and peak memory of the FlexAttention structure for ``tree``."""
    build: Callable[..., Any]
    try:
        import torch  # noqa: F401

        from claw_client import tree_block_mask

        build, kind = tree_block_mask, "flex BlockMask (torch)"
    except ImportError:  # pragma: no cover - torch is optional
        build, kind = tree_block_tables, "block tables (numpy, no torch)"
    build(tree)  # warm-up: first torch call imports and initialises kernels
    gc.collect()
    tracemalloc.start()
    t0 = time.perf_counter()
    result = build(tree)
    dt = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    held = 0
    for attr in (
        "kv_num_blocks",
        "kv_indices",
        "full_kv_num_blocks",
        "full_kv_indices",
        "q_num_blocks",
        "q_indices",
        "full_q_num_blocks",
        "full_q_indices",
    ):
        t = getattr(result, attr, None)
        if t is not None:
            held += t.numel() * t.element_size()
    u = len(tree.input_ids)
    log(
        f"attention ({kind}) for {u:,} tokens: {dt * 1e3:.1f} ms, peak {(peak + held) / 2**20:.2f} MiB "
        f"(a dense bool mask would be {u * u / 2**20:,.0f} MiB)"
    )
    return {
        "attn_ms": round(dt * 1e3, 2),
        "attn_peak_mb": round((peak + held) / 2**20, 3),
        "attn_kind": kind,
        "attn_dense_mask_mb": round(u * u / 2**20, 1),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="timed runs of ours after one warm-up")
    ap.add_argument("--no-baseline", action="store_true", help="skip the dict trie")
    args = ap.parse_args(argv)

    small, tree = bench_workload("W-agentic", 1, repeat=args.repeat, baseline=not args.no_baseline)
    if (small["total_tokens"], small["unique_tokens"]) != (W_AGENTIC_TOTAL_TOKENS, W_AGENTIC_UNIQUE_TOKENS):
        raise SystemExit(f"W-agentic totals are wrong: {small['total_tokens']} / {small['unique_tokens']}")
    attn = bench_attention(tree)
    del tree
    big, _ = bench_workload("W-agentic-64", 64, repeat=args.repeat, baseline=not args.no_baseline)
    result = {
        "workload": big["workload"],
        "mtok_per_s": big["mtok_per_s"],
        "baseline_mtok_per_s": big.get("baseline_mtok_per_s"),
        "speedup": big.get("speedup"),
        "total_tokens": big["total_tokens"],
        "unique_tokens": big["unique_tokens"],
        "savings": big["savings"],
        "attn_ms": attn["attn_ms"],
        "attn_peak_mb": attn["attn_peak_mb"],
        "attn_workload": "W-agentic",
        "attn_kind": attn["attn_kind"],
        "mtok_per_s_cold": big["mtok_per_s_cold"],
        "mtok_per_s_best": big["mtok_per_s_best"],
        "mtok_per_cpu_s": big["mtok_per_cpu_s"],
        "w_agentic": {k: v for k, v in small.items() if k != "workload"},
        "numpy": np.__version__,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
