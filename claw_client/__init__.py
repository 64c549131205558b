"""Claw-R1 client utilities for trainers. No Django dependency; torch is optional.

Prefix-tree merge (numpy only)::

    tree = build_prefix_tree(sequences, prompt_lens)    # int32 bytes or int arrays
    tree.input_ids, tree.position_ids, tree.parent, tree.subtree_end, tree.stats

Tree attention and logprobs (torch, imported when first used)::

    mask = tree_attention_mask(tree)          # (1, 1, U, U) bool for SDPA, small trees
    block_mask = tree_block_mask(tree)        # FlexAttention BlockMask, O(U) + O((U/B)^2)
    logits = model(input_ids=..., position_ids=..., attention_mask=mask).logits[0]
    per_step = response_logprobs(logits, tree) # list of (response_len,) tensors

Compact step submission (msgspec)::

    body = encode_step_batch(steps)   # MessagePack, token arrays as packed int32
    httpx.post(url + "/api/v1/steps", content=body, headers={"Content-Type": MSGPACK, ...})

Talking to the server (httpx, imported when first used)::

    with ClawClient(url, key) as claw:
        claw.submit_steps(steps, msgpack=True)
        with claw.pull("train", consumer="ppo", batch_size=8) as batch:  # ack, or nack if it raises
            tensors = collate_steps(batch)                             # torch, left/right padded
"""

from typing import TYPE_CHECKING, Any

from .attention import tree_attention_mask, tree_block_mask, tree_block_tables, tree_mask_mod
from .logprobs import response_logprobs, token_logprobs
from .prefix_tree import TOKEN_DTYPE, PrefixTree, PrefixTreeStats, build_prefix_tree
from .wire import MSGPACK, encode_step_batch

if TYPE_CHECKING:
    from .client import Batch, ClawClient, ClawError, ReplayedBatch, Run
    from .collate import collate_steps
    from .formats import batch_steps, steps_to_numpy
    from .media import MediaCache

# Imported on first use: the client needs httpx, collate needs torch.
_LAZY = {
    "Batch": "client",
    "ClawClient": "client",
    "ClawError": "client",
    "ReplayedBatch": "client",
    "Run": "client",
    "steps_to_numpy": "formats",
    "batch_steps": "formats",
    "collate_steps": "collate",
    "MediaCache": "media",
}

__all__ = [
    "MSGPACK",
    "Batch",
    "ClawClient",
    "ClawError",
    "MediaCache",
    "TOKEN_DTYPE",
    "PrefixTree",
    "PrefixTreeStats",
    "ReplayedBatch",
    "Run",
    "batch_steps",
    "build_prefix_tree",
    "collate_steps",
    "encode_step_batch",
    "response_logprobs",
    "steps_to_numpy",
    "token_logprobs",
    "tree_attention_mask",
    "tree_block_mask",
    "tree_block_tables",
    "tree_mask_mod",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
