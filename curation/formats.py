"""Batch formats a trainer can pull: ``steps``, ``padded`` and ``tree``.

Each public function takes the rendered step rows of one batch (``pool.selectors.steps_render``
with ``mask`` and ``staleness`` added, in batch order) and returns the JSON-able ``batch``
dict. Token and float arrays are numpy, which ``claw_kit.web.renderers.dumps`` (orjson) writes
without a Python object per element. Per-row metadata lists are in row order in every format.

Every format serves a step's *effective* reward (pool/services/effective_reward.py: its own,
else its branch's outcome) with ``reward_scope`` saying which, after the dataset's
``grouping.reward_assignment``, and beside it the two kinds apart: ``outcome_reward`` (its
branch's outcome) and ``process_reward`` (its own reward when it does not end its branch).

* ``steps``: the rows as read (``{"steps": rows}``), each with its ordered ``images``
  (``{sha256, media_type, width, height, url, ...}``; the bytes are ``GET <url>``).
* ``padded``: verl-style 2-D arrays, prompts LEFT-padded and responses RIGHT-padded with
  token id ``PAD_TOKEN_ID`` (0). A masked step (``mask`` true) keeps its tokens but its
  ``response_mask`` row is all 0. A null reward is written as 0.0 in ``token_level_rewards``
  (``reward`` keeps the null). A step's ``token_rewards`` are placed token by token, the
  assigned reward added at its last response token.
* ``tree``: the batch's full sequences (prompt + response) merged into the packed prefix-tree
  layout of ``claw_client.prefix_tree`` (one forward over the unique tokens), with each
  step's place in it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from claw_client import build_prefix_tree, padding

PAD_TOKEN_ID = 0
TOKEN_DTYPE = np.int32  # ids, masks, positions and packed indices
FLOAT_DTYPE = np.float64  # logprobs and rewards: as stored, no rounding
VERSION_DTYPE = np.int64  # versions behind, per token (policy versions are 64-bit)

Row = dict[str, Any]
# The per-row fields every non-``steps`` format carries as plain lists, in row order.
ROW_FIELDS = (
    "uid",
    "trajectory_uid",
    "prompt_group_uid",
    "step_index",
    "policy_version",
    "staleness",
    "mask",
)


def steps(rows: Sequence[Row]) -> dict[str, Any]:
    """``{"steps": rows}``: every field of each step, its token arrays exact."""
    return {"steps": list(rows)}


def padded(rows: Sequence[Row]) -> dict[str, Any]:
    """verl-style padded batch: N rows, P = longest prompt, R = longest response.

    Arrays (int32 unless said): ``prompts`` (N, P) left-padded; ``responses`` (N, R)
    right-padded; ``input_ids`` (N, P + R) = prompts | responses; ``attention_mask``
    (N, P + R) 1 on real tokens; ``response_mask`` (N, R) 1 on real response tokens of
    unmasked steps; ``position_ids`` (N, P + R) = cumsum(attention_mask) - 1 clipped at 0;
    ``rollout_logprobs`` (N, R) float64, 0.0 on padding and for steps without logprobs (see
    ``has_rollout_logprobs``); ``token_level_rewards`` (N, R) float64: a step's
    ``token_rewards`` token by token (0.0 where it has none), plus its reward added at its last
    response token (a null reward, or a step without response tokens, adds none);
    ``token_versions_behind`` (N, R) int64, how many policy versions behind the current one
    each response token is (from ``token_policy_versions``, else the step's
    ``versions_behind``), -1 on padding and where unknown.
    Per row lists: ``ROW_FIELDS``, ``reward`` (the effective reward, null kept),
    ``reward_scope``, ``reward_source``, ``outcome_reward``, ``process_reward``,
    ``has_rollout_logprobs``, ``has_token_rewards`` and ``images`` (each row's
    ordered image references, ``{sha256, media_type, width, height, url, ...}``).
    """
    n = len(rows)
    lay = padding.layout(
        [r["prompt_ids"] for r in rows],
        [r["response_ids"] for r in rows],
        pad_id=PAD_TOKEN_ID,
        dtype=TOKEN_DTYPE,
    )
    w = lay.response_width
    # A step without logprobs is an empty row: the fill (0.0) covers its columns.
    logprobs = padding.right(
        [r["rollout_logprobs"] if r["rollout_logprobs"] is not None else () for r in rows],
        w,
        fill=0.0,
        dtype=FLOAT_DTYPE,
    )
    rewards = padding.right([token_level_rewards(r) for r in rows], w, fill=0.0, dtype=FLOAT_DTYPE)
    behind = padding.right([token_versions_behind(r) for r in rows], w, fill=-1, dtype=VERSION_DTYPE)
    unmasked = ~np.fromiter((bool(r["mask"]) for r in rows), dtype=bool, count=n)
    return {
        "pad_token_id": PAD_TOKEN_ID,
        "input_ids": lay.input_ids,
        "attention_mask": lay.attention_mask,
        "response_mask": (lay.response_real & unmasked[:, None]).astype(TOKEN_DTYPE),
        "position_ids": lay.position_ids,
        "prompts": lay.prompts,
        "responses": lay.responses,
        "rollout_logprobs": logprobs,
        "token_level_rewards": rewards,
        "token_versions_behind": behind,
        **_row_fields(rows),
    }


def token_level_rewards(r: Row) -> np.ndarray:
    """A step's reward per response token: its ``token_rewards`` (0.0 where it has none),
    plus its reward (the effective reward, as assigned) added at its last response token."""
    n = len(r["response_ids"])
    given = r.get("token_rewards")
    out = np.array(given, dtype=FLOAT_DTYPE) if given is not None else np.zeros(n, dtype=FLOAT_DTYPE)
    if n and r["reward"] is not None:
        out[n - 1] += r["reward"]
    return out


def token_versions_behind(r: Row) -> np.ndarray:
    """Per response token, the policy versions behind the current one at pull time: the
    step's ``token_versions_behind`` where it has token_policy_versions, else its
    ``versions_behind`` on every token; -1 where unknown."""
    n = len(r["response_ids"])
    per_token = r.get("token_versions_behind")
    if per_token is not None:
        return np.asarray(per_token, dtype=VERSION_DTYPE)
    v = r.get("versions_behind")
    return np.full(n, -1 if v is None else v, dtype=VERSION_DTYPE)


def tree(rows: Sequence[Row]) -> dict[str, Any]:
    """The batch as one packed prefix tree (``claw_client.prefix_tree`` layout, U unique
    tokens, N steps, S response tokens over all steps).

    Packed arrays (U,), int32: ``input_ids``, ``position_ids``, ``parent`` (-1 at a root),
    ``subtree_end`` (query q attends key k iff k <= q <= subtree_end[k]) and
    ``response_mask`` (1 on a response token of at least one unmasked step).
    Per step (N,), int32: ``lengths``, ``prompt_lens`` and ``last_index``, the packed index of
    the step's last token (-1 for an empty step): following ``parent`` from it back to a root
    gives the step's whole sequence, reversed. Response tokens, CSR in row order:
    ``response_offsets`` (N + 1,) and ``response_index`` (S,) give step i's response tokens'
    packed indices, ``response_index[response_offsets[i]:response_offsets[i + 1]]``, and
    ``rollout_logprobs`` (S,) float64, ``token_level_rewards`` (S,) float64 and
    ``token_versions_behind`` (S,) int64 are aligned with them, as in ``padded`` (0.0 where a
    step has no logprobs; token rewards plus the reward at the last token; -1 where unknown).
    ``stats``: n_sequences, total_tokens, unique_tokens, ratio and savings.
    Per row lists: ``ROW_FIELDS``, ``reward`` (the effective reward, null kept),
    ``reward_scope``, ``reward_source``, ``outcome_reward``, ``process_reward``,
    ``has_rollout_logprobs`` and ``has_token_rewards``.
    """
    n = len(rows)
    t = build_prefix_tree(
        [np.concatenate([r["prompt_ids"], r["response_ids"]]) for r in rows],
        prompt_lens=[len(r["prompt_ids"]) for r in rows],
    )
    masked = np.fromiter((bool(r["mask"]) for r in rows), dtype=bool, count=n)
    counts = np.diff(t.response_offsets)
    response_mask = np.zeros(len(t.input_ids), dtype=TOKEN_DTYPE)
    response_mask[t.response_index[np.repeat(~masked, counts)]] = 1
    last_index = np.full(n, -1, dtype=TOKEN_DTYPE)
    for i in range(n):
        if t.lengths[i]:
            last_index[i] = t.sequence_indices(i)[-1]
    total = int(t.response_offsets[-1])
    logprobs = np.zeros(total, dtype=FLOAT_DTYPE)
    rewards = np.zeros(total, dtype=FLOAT_DTYPE)
    behind = np.full(total, -1, dtype=VERSION_DTYPE)
    for i, r in enumerate(rows):
        at = slice(t.response_offsets[i], t.response_offsets[i + 1])
        if r["rollout_logprobs"] is not None:
            logprobs[at] = r["rollout_logprobs"]
        rewards[at] = token_level_rewards(r)
        behind[at] = token_versions_behind(r)
    return {
        "input_ids": t.input_ids,
        "position_ids": t.position_ids,
        "parent": t.parent,
        "subtree_end": t.subtree_end,
        "response_mask": response_mask,
        "lengths": t.lengths.astype(TOKEN_DTYPE),
        "prompt_lens": t.prompt_lens.astype(TOKEN_DTYPE),
        "last_index": last_index,
        "response_offsets": t.response_offsets.astype(TOKEN_DTYPE),
        "response_index": t.response_index,
        "rollout_logprobs": logprobs,
        "token_level_rewards": rewards,
        "token_versions_behind": behind,
        "stats": t.stats.as_dict(),
        **_row_fields(rows),
    }


def _row_fields(rows: Sequence[Row]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {f: [r[f] for r in rows] for f in ROW_FIELDS}
    out["reward"] = [r["reward"] for r in rows]
    out["reward_scope"] = [r["reward_scope"] for r in rows]
    out["reward_source"] = [r["reward_source"] for r in rows]
    # The two kinds apart, whatever the assignment (pool/services/effective_reward.py).
    out["outcome_reward"] = [r.get("outcome_reward") for r in rows]
    out["process_reward"] = [r.get("process_reward") for r in rows]
    out["has_rollout_logprobs"] = [r["rollout_logprobs"] is not None for r in rows]
    out["has_token_rewards"] = [r.get("token_rewards") is not None for r in rows]
    # Policy versions behind the current one at pull time (null: the step has none).
    out["versions_behind"] = [r.get("versions_behind") for r in rows]
    # Each row's images in order (pool.selectors.steps.step_images): [{sha256, media_type,
    # width, height, url, ...}], [] for a row without; the bytes are GET <url>.
    out["images"] = [r.get("images") or [] for r in rows]
    return out


RENDERERS: dict[str, Callable[[Sequence[Row]], dict[str, Any]]] = {
    "steps": steps,
    "padded": padded,
    "tree": tree,
}
