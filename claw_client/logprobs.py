"""Per-step response logprobs from the logits of one packed tree forward.

In a flat forward the logit row at position ``p - 1`` predicts the token at ``p``. In the
packed layout the token before packed index ``q`` in its own sequence is ``parent[q]``, so
the logit row at ``parent[q]`` predicts ``input_ids[q]``. Each unique response token is
scored once, then handed to every step whose response contains it.

Works on torch tensors (differentiable: the gathers keep the graph) or numpy arrays.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from .prefix_tree import PrefixTree


def token_logprobs(logits: Any, tree: PrefixTree, indices: np.ndarray | None = None) -> Any:
    """log p(input_ids[q] | its ancestors) for the packed indices ``indices`` (default: all).

    ``logits`` is (U, V) or (1, U, V), torch or numpy; the result has the same kind, shape
    (len(indices),) and float32 or wider. A root token has no context: NaN.
    """
    idx = np.arange(len(tree.input_ids)) if indices is None else np.asarray(indices, dtype=np.int64)
    rows = tree.parent[idx].astype(np.int64)
    targets = tree.input_ids[idx].astype(np.int64)
    if hasattr(logits, "detach"):
        return _torch_logprobs(logits, rows, targets)
    return _numpy_logprobs(np.asarray(logits), rows, targets)


def response_logprobs(logits: Any, tree: PrefixTree) -> list[Any]:
    """One array per input sequence: the logprob of each of its response tokens, in order,
    equal (up to float rounding) to what a flat forward of that sequence alone gives."""
    scored = np.flatnonzero(tree.loss_mask)  # unique response tokens, ascending
    lp = token_logprobs(logits, tree, scored)
    where = np.searchsorted(scored, tree.response_index)
    if hasattr(lp, "detach"):
        import torch

        per_token = lp[torch.from_numpy(where).to(lp.device)]
        return list(torch.split(per_token, np.diff(tree.response_offsets).tolist()))
    per_token = lp[where]
    return np.split(per_token, tree.response_offsets[1:-1])


def _torch_logprobs(logits: Any, rows: np.ndarray, targets: np.ndarray) -> Any:
    import torch

    if logits.dim() == 3:
        if logits.shape[0] != 1:
            raise ValueError("packed logits must have batch size 1")
        logits = logits[0]
    dev = logits.device
    has_ctx = torch.from_numpy(rows >= 0).to(dev)
    sel = logits[torch.from_numpy(np.maximum(rows, 0)).to(dev)]
    if sel.dtype in (torch.float16, torch.bfloat16):
        sel = sel.float()
    picked = sel.gather(-1, torch.from_numpy(targets).to(dev)[:, None])[:, 0]
    lp = picked - torch.logsumexp(sel, dim=-1)
    return torch.where(has_ctx, lp, torch.full_like(lp, float("nan")))


def _numpy_logprobs(logits: np.ndarray, rows: np.ndarray, targets: np.ndarray) -> np.ndarray:
    if logits.ndim == 3:
        if logits.shape[0] != 1:
            raise ValueError("packed logits must have batch size 1")
        logits = logits[0]
    sel = logits[np.maximum(rows, 0)].astype(np.promote_types(logits.dtype, np.float32), copy=False)
    top = sel.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(sel - top).sum(axis=-1)) + top[:, 0]
    lp = sel[np.arange(len(rows)), targets] - lse
    lp[rows < 0] = np.nan
    return lp
