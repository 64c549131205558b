"""Torch tensors of a batch's steps (torch imported when first used): a client Batch of any
format (its ``steps``), or a ``steps`` format answer.

Prompts are left-padded and responses right-padded, so every response starts at the same
column (``input_ids = cat(prompts, responses)``), the layout of verl-style PPO trainers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import padding


def collate_steps(batch: Any, *, pad_id: int = 0) -> dict[str, Any]:
    """Tensors of the steps of ``batch`` (a client Batch, a pull answer or its ``{"steps": [...]}``
    or a list of steps), one row per step:

    - ``prompts`` (B, P) left-padded, ``responses`` (B, R) right-padded, int64;
    - ``input_ids`` (B, P + R), ``attention_mask`` (B, P + R) and ``position_ids`` (B, P + R,
      0 at each row's first real token);
    - ``response_mask`` (B, R) bool: the real response tokens of the steps trained on (a
      masked step's row is all False, as in the ``padded`` format); ``rollout_logprobs``
      (B, R) float32 (0 where absent);
    - ``rewards`` (B,) float32 (0 where None) with ``has_reward`` (B,) bool;
    - ``step_mask`` (B,) bool: the step is trained on (False: a masked step, served only to
      keep its group whole: the batch's ``mask`` true);
    - ``step_uids``: the uids, in row order.
    """
    import torch

    steps = _steps_of(batch)
    lay = padding.layout(
        [_ints(s["prompt_ids"]) for s in steps], [_ints(s["response_ids"]) for s in steps], pad_id=pad_id
    )
    w = lay.response_width
    unmasked = np.array([not s.get("mask", False) for s in steps], dtype=bool)
    logprobs = padding.right(
        [
            _floats(s["rollout_logprobs"])
            if s.get("rollout_logprobs") is not None
            else np.zeros(0, np.float32)
            for s in steps
        ],
        w,
        fill=0.0,
        dtype=np.float32,
    )
    prompts, responses = torch.from_numpy(lay.prompts), torch.from_numpy(lay.responses)
    response_mask = torch.from_numpy(lay.response_real & unmasked.reshape(-1, 1))
    attention_mask = torch.from_numpy(lay.attention_mask.astype(bool))
    position_ids = torch.from_numpy(lay.position_ids)
    logprobs = torch.from_numpy(logprobs)
    rewards = [s.get("reward") for s in steps]
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": response_mask,
        "rollout_logprobs": logprobs,
        "rewards": torch.tensor([x if x is not None else 0.0 for x in rewards], dtype=torch.float32),
        "has_reward": torch.tensor([x is not None for x in rewards], dtype=torch.bool),
        "step_mask": torch.tensor([not s.get("mask", False) for s in steps], dtype=torch.bool),
        "step_uids": [s.get("uid") for s in steps],
    }


def _steps_of(batch: Any) -> list[dict[str, Any]]:
    if hasattr(batch, "steps") and not isinstance(batch, dict):
        return batch.steps  # a client Batch: token arrays already numpy
    if isinstance(batch, dict):
        if "steps" in batch:  # the batch of a pull answer
            return list(batch["steps"])
        return list((batch.get("batch") or {}).get("steps") or [])  # a whole pull answer
    return list(batch)


def _ints(x: Any) -> Any:
    return np.asarray(x, dtype=np.int64)


def _floats(x: Any) -> Any:
    return np.asarray(x, dtype=np.float32)
