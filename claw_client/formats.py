"""Step views of a pulled batch, in every format the server serves (curation/formats.py
writes them): one dict per step, in batch order, token ids as int32 arrays and rollout
logprobs as float64 arrays (None for a step stored without them). numpy only.

* ``steps``: each step as served (every field of a step read), its arrays as numpy.
* ``padded``: each row cut back to its real tokens by ``attention_mask`` (never by the pad
  id, which a real token may equal); its logprobs are the row's first ``len(response_ids)``
  columns.
* ``tree``: each step's sequence read back from the packed tree: from its ``last_index``,
  following ``parent`` to a root gives its tokens in reverse, and ``prompt_lens`` splits them
  into prompt and response; its logprobs are its ``response_offsets`` slice.

A ``padded`` or ``tree`` step has the fields those formats carry per row: ``uid``,
``trajectory_uid``, ``prompt_group_uid``, ``step_index``, ``policy_version``, ``staleness``,
``mask``, ``reward``, ``reward_scope``, ``reward_source``, ``outcome_reward``,
``process_reward``, ``versions_behind`` and ``images``, with ``prompt_ids``,
``response_ids`` and ``rollout_logprobs``. The steps' other fields (``metadata``,
``token_source``, ...) are in the ``steps`` format only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from .prefix_tree import TOKEN_DTYPE

# The server stores rollout logprobs as little-endian float64 (pool.tokens.LOGPROB_DTYPE).
LOGPROB_DTYPE = np.dtype("<f8")
# The per-row lists of the padded and tree formats that a step view carries as they are.
ROW_FIELDS = (
    "uid",
    "trajectory_uid",
    "prompt_group_uid",
    "step_index",
    "policy_version",
    "staleness",
    "mask",
    "reward",
    "reward_scope",
    "reward_source",
)
# Per-row lists a server of this version serves too (the two reward kinds apart, the versions
# behind at pull time), carried where the batch has them.
OPTIONAL_ROW_FIELDS = ("outcome_reward", "process_reward", "versions_behind")


def batch_steps(batch: Mapping[str, Any], format: str | None = None) -> list[dict[str, Any]]:
    """The steps of ``batch`` (a pull answer's ``batch`` part) served in ``format`` (the
    manifest's ``format``; None: told by the batch's keys). Raises TypeError naming the
    format for one this client has no step view of."""
    if format is None:
        format = _format_of(batch)
    view = STEP_VIEWS.get(format)
    if view is None:
        raise TypeError(
            f"no step view of the {format!r} batch format (this client reads {sorted(STEP_VIEWS)}); "
            "its JSON is Batch.batch"
        )
    return view(batch)


def steps_to_numpy(steps: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``steps`` (the steps format) with ``prompt_ids`` and ``response_ids`` as int32
    arrays and ``rollout_logprobs`` as float64 arrays (None stays None)."""
    out = []
    for s in steps:
        row = dict(s)
        row["prompt_ids"] = np.asarray(s["prompt_ids"], dtype=TOKEN_DTYPE)
        row["response_ids"] = np.asarray(s["response_ids"], dtype=TOKEN_DTYPE)
        if s.get("rollout_logprobs") is not None:
            row["rollout_logprobs"] = np.asarray(s["rollout_logprobs"], dtype=LOGPROB_DTYPE)
        out.append(row)
    return out


def padded_steps(b: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The steps of a ``padded`` batch: prompts are left-padded and responses right-padded,
    so row i's prompt is its last ``sum(attention_mask[i, :P])`` prompt columns and its
    response its first ``sum(attention_mask[i, P:])`` response columns."""
    n = len(b["uid"])
    prompts = np.asarray(b["prompts"], dtype=TOKEN_DTYPE).reshape(n, -1)
    responses = np.asarray(b["responses"], dtype=TOKEN_DTYPE).reshape(n, -1)
    attention = np.asarray(b["attention_mask"]).reshape(n, -1)
    logprobs = np.asarray(b["rollout_logprobs"], dtype=LOGPROB_DTYPE).reshape(n, -1)
    p = prompts.shape[1]
    plens = attention[:, :p].sum(axis=1)
    rlens = attention[:, p:].sum(axis=1)
    out = _row_fields(b, n)
    for i, row in enumerate(out):
        lp, lr = int(plens[i]), int(rlens[i])
        row["prompt_ids"] = prompts[i, p - lp :]
        row["response_ids"] = responses[i, :lr]
        row["rollout_logprobs"] = logprobs[i, :lr] if b["has_rollout_logprobs"][i] else None
    return out


def tree_steps(b: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The steps of a ``tree`` batch, each sequence read back from the packed layout: all
    steps walk ``parent`` together, one token per step per round (rounds = the longest
    sequence, each a few numpy operations over the steps). Raises ValueError on a layout
    whose walks do not end at a root after ``lengths`` tokens."""
    ids = np.asarray(b["input_ids"], dtype=TOKEN_DTYPE)
    parent = np.asarray(b["parent"], dtype=np.int64)
    lengths = np.asarray(b["lengths"], dtype=np.int64)
    plens = np.asarray(b["prompt_lens"], dtype=np.int64)
    offsets = np.asarray(b["response_offsets"], dtype=np.int64)
    logprobs = np.asarray(b["rollout_logprobs"], dtype=LOGPROB_DTYPE)
    n = len(lengths)
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    flat = np.empty(int(starts[-1]), dtype=TOKEN_DTYPE)  # every step's sequence, end to end
    at = np.asarray(b["last_index"], dtype=np.int64).copy()
    pos = lengths - 1
    live = np.flatnonzero(pos >= 0)
    while live.size:
        flat[starts[live] + pos[live]] = ids[at[live]]
        at[live] = parent[at[live]]
        pos[live] -= 1
        live = live[pos[live] >= 0]
    if np.any(at[lengths > 0] != -1):
        raise ValueError("not a well-formed tree batch: a step's walk does not end at a root")
    out = _row_fields(b, n)
    for i, row in enumerate(out):
        seq = flat[starts[i] : starts[i + 1]]
        row["prompt_ids"] = seq[: plens[i]]
        row["response_ids"] = seq[plens[i] :]
        lp = logprobs[offsets[i] : offsets[i + 1]]
        row["rollout_logprobs"] = lp if b["has_rollout_logprobs"][i] else None
    return out


def _row_fields(b: Mapping[str, Any], n: int) -> list[dict[str, Any]]:
    images = b.get("images") or [[] for _ in range(n)]
    fields = ROW_FIELDS + tuple(f for f in OPTIONAL_ROW_FIELDS if f in b)
    return [{**{f: b[f][i] for f in fields}, "images": images[i]} for i in range(n)]


def _format_of(batch: Mapping[str, Any]) -> str:
    if "steps" in batch:
        return "steps"
    if "subtree_end" in batch:
        return "tree"
    if "attention_mask" in batch:
        return "padded"
    return "unknown"


STEP_VIEWS: dict[str, Callable[[Mapping[str, Any]], list[dict[str, Any]]]] = {
    "steps": lambda b: steps_to_numpy(b["steps"]),
    "padded": padded_steps,
    "tree": tree_steps,
}
