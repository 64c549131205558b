"""Tree attention for a packed prefix-tree layout (PyTorch; imported lazily).

The whole mask is one rule over O(U) integers: query ``q`` may attend key ``k`` iff
``k <= q <= subtree_end[k]`` (k is an ancestor of q, or q itself, in the pre-order layout).
Together with the layout's ``position_ids`` (each token's depth) a packed forward computes,
for every token, exactly what the flat forward of any sequence containing it computes.

* :func:`tree_attention_mask`: the dense (1, 1, U, U) mask for SDPA/eager attention. U x U
  memory: use it for small trees (a few thousand tokens).
* :func:`tree_mask_mod` / :func:`tree_block_mask`: the same rule for FlexAttention. The
  BlockMask is computed analytically from ``subtree_end`` (O(U) work plus one entry per
  block pair, (U/B)^2) instead of evaluating the mask on all U x U pairs the way
  ``create_block_mask`` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    from .prefix_tree import PrefixTree

DEFAULT_BLOCK_SIZE = 128  # FlexAttention's default tile


def _subtree_end_of(tree_or_subtree_end: PrefixTree | Any) -> np.ndarray:
    se = getattr(tree_or_subtree_end, "subtree_end", tree_or_subtree_end)
    if hasattr(se, "detach"):  # a torch tensor
        se = se.detach().cpu().numpy()
    return np.asarray(se, dtype=np.int64)


def tree_attention_mask(
    tree_or_subtree_end: PrefixTree | Any,
    *,
    additive: bool = False,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The dense tree mask, shaped (1, 1, U, U) as Hugging Face models take a custom mask.

    Boolean (True = may attend) for SDPA; with ``additive=True`` a float mask of 0 and the
    dtype's most negative value (``dtype`` defaults to float32) for eager attention. Every
    row attends at least itself, so no row is fully masked.
    """
    import torch

    se = torch.as_tensor(_subtree_end_of(tree_or_subtree_end), device=device)
    idx = torch.arange(len(se), device=device)
    mask = (idx[None, :] <= idx[:, None]) & (idx[:, None] <= se[None, :])
    if additive:
        dtype = dtype or torch.float32
        bias = torch.zeros(mask.shape, dtype=dtype, device=device)
        bias.masked_fill_(~mask, torch.finfo(dtype).min)
        return bias[None, None]
    return mask[None, None]


def tree_mask_mod(tree_or_subtree_end: PrefixTree | Any, *, device: torch.device | str | None = None):
    """A FlexAttention ``mask_mod(b, h, q_idx, kv_idx)`` implementing the tree rule.

    Indices past the tree (FlexAttention pads to whole blocks) are never attended.
    """
    import torch

    se = torch.as_tensor(_subtree_end_of(tree_or_subtree_end), device=device)
    last = max(len(se) - 1, 0)

    def mask_mod(b, h, q_idx, kv_idx):
        inside = kv_idx <= last
        return inside & (kv_idx <= q_idx) & (q_idx <= se[kv_idx.clamp(max=last)])

    return mask_mod


def tree_block_tables(
    tree_or_subtree_end: PrefixTree | Any, *, block_size: int = DEFAULT_BLOCK_SIZE
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Block sparsity of the tree mask, per query block (numpy, no torch).

    Returns ``(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)`` in
    FlexAttention's layout: query block i needs the mask on kv blocks
    ``kv_indices[i, :kv_num_blocks[i]]`` and attends every pair of the kv blocks
    ``full_kv_indices[i, :full_kv_num_blocks[i]]``.
    """
    partial, full = _block_states(_subtree_end_of(tree_or_subtree_end), block_size)
    return (*_to_indices(partial), *_to_indices(full))


def _block_states(se: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(partial, full): (q blocks x kv blocks) booleans.

    Derivation: the keys of kv block j are visible to the queries ``[j*B, max(subtree_end)]``
    (subtrees are contiguous and every key sees itself), so q block i is non-empty iff
    ``j <= i <= max_se // B``; it is full iff ``i > j`` and every key's subtree reaches the
    end of q block i, ``(i + 1) * B - 1 <= min_se``. Padding keys are never visible, so a
    block holding padding is never full.
    """
    u = len(se)
    nb = max(-(-u // block_size), 1)
    padded = np.full(nb * block_size, -1, dtype=np.int64)
    padded[:u] = se
    blocks = padded.reshape(nb, block_size)
    reach = blocks.max(axis=1) // block_size  # last q block some key of block j reaches
    full_reach = (blocks.min(axis=1) + 1) // block_size - 1  # last q block all keys reach
    q_block = np.arange(nb)[:, None]
    kv_block = np.arange(nb)[None, :]
    full = (q_block > kv_block) & (q_block <= full_reach[None, :])
    partial = (q_block >= kv_block) & (q_block <= reach[None, :]) & ~full
    if u == 0:
        partial[:] = False
    return partial, full


def _to_indices(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    counts = rows.sum(axis=1).astype(np.int32)
    # A stable argsort of "not selected" lists the selected columns first, ascending.
    indices = np.argsort(~rows, axis=1, kind="stable").astype(np.int32)
    return counts, indices


def tree_block_mask(
    tree_or_subtree_end: PrefixTree | Any,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    device: torch.device | str | None = None,
) -> BlockMask:
    """A FlexAttention BlockMask for the tree, shaped (1, 1, U, U), built without
    evaluating the mask on U x U pairs (see :func:`_block_states`).

    Both directions (kv blocks per q block for the forward, q blocks per kv block for the
    backward) come from the same numpy tables, so torch only receives finished arrays.
    """
    import torch
    from torch.nn.attention.flex_attention import BlockMask

    se = _subtree_end_of(tree_or_subtree_end)
    partial, full = _block_states(se, block_size)

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(device)[None, None]

    kv_num, kv_idx = _to_indices(partial)
    full_num, full_idx = _to_indices(full)
    q_num, q_idx = _to_indices(np.ascontiguousarray(partial.T))
    full_q_num, full_q_idx = _to_indices(np.ascontiguousarray(full.T))
    return BlockMask(
        seq_lengths=(len(se), len(se)),
        kv_num_blocks=t(kv_num),
        kv_indices=t(kv_idx),
        full_kv_num_blocks=t(full_num),
        full_kv_indices=t(full_idx),
        q_num_blocks=t(q_num),
        q_indices=t(q_idx),
        full_q_num_blocks=t(full_q_num),
        full_q_indices=t(full_q_idx),
        BLOCK_SIZE=(block_size, block_size),
        mask_mod=tree_mask_mod(se, device=device),
    )
