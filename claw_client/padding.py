"""The one padder: prompts left-padded and responses right-padded, so every response starts at
the same column (``input_ids = prompts | responses``), the layout of verl-style PPO trainers.

The server's ``padded`` format (curation/formats.py), ``collate_steps`` (torch tensors) and the
verl integration (a DataProto) all lay their batches out here, in numpy, one vectorized fill
per array: a row's values land in its real columns in one masked assignment, with no Python
loop over tokens.

    lay = layout(prompt_ids, response_ids)           # lists of id sequences, one per step
    lay.prompts, lay.responses, lay.input_ids        # (N, P), (N, R), (N, P + R)
    lay.attention_mask, lay.position_ids             # (N, P + R): 1 on real tokens; 0 at each
                                                     # row's first real token, clipped at 0
    lay.response_real                                # (N, R) bool: the real response tokens
    right(per_token_values, lay.response_width, fill=0.0, dtype=np.float32)  # (N, R) values
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np


def _lengths(rows: Sequence[Any]) -> np.ndarray:
    return np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))


def width_of(lengths: np.ndarray, fixed: int | None, what: str) -> int:
    """The longest row, or ``fixed`` when given (a ValueError when a row is longer)."""
    longest = int(lengths.max(initial=0))
    if fixed is None:
        return longest
    if longest > fixed:
        raise ValueError(f"a {what} of {longest} tokens is longer than {what}_length={fixed}")
    return fixed


def _fill(
    rows: Sequence[Any], lengths: np.ndarray, width: int, *, left: bool, fill: Any, dtype: Any
) -> np.ndarray:
    out = np.full((len(rows), width), fill, dtype=dtype)
    total = int(lengths.sum())
    if total:
        cols = np.arange(width)[None, :]
        real = cols >= (width - lengths)[:, None] if left else cols < lengths[:, None]
        # Row-major order: each row's values land in its real columns, in order.
        out[real] = np.concatenate([np.asarray(r, dtype=dtype).reshape(-1) for r in rows if len(r)])
    return out


def left(rows: Sequence[Any], width: int, *, fill: Any = 0, dtype: Any = np.int64) -> np.ndarray:
    """(N, width): each row at the right end, ``fill`` before it."""
    return _fill(rows, _lengths(rows), width, left=True, fill=fill, dtype=dtype)


def right(rows: Sequence[Any], width: int, *, fill: Any = 0, dtype: Any = np.int64) -> np.ndarray:
    """(N, width): each row at the left end, ``fill`` after it."""
    return _fill(rows, _lengths(rows), width, left=False, fill=fill, dtype=dtype)


class Layout(NamedTuple):
    prompts: np.ndarray  # (N, P) left-padded
    responses: np.ndarray  # (N, R) right-padded
    input_ids: np.ndarray  # (N, P + R)
    attention_mask: np.ndarray  # (N, P + R), 1 on real tokens (the ids' dtype)
    position_ids: np.ndarray  # (N, P + R), cumsum(attention_mask) - 1 clipped at 0
    response_real: np.ndarray  # (N, R) bool
    prompt_lengths: np.ndarray  # (N,) int64
    response_lengths: np.ndarray  # (N,) int64

    @property
    def response_width(self) -> int:
        return self.responses.shape[1]


def layout(
    prompts: Sequence[Any],
    responses: Sequence[Any],
    *,
    prompt_width: int | None = None,
    response_width: int | None = None,
    pad_id: int = 0,
    dtype: Any = np.int64,
) -> Layout:
    """The padded layout of N steps' prompt and response ids (widths: the longest, or fixed)."""
    plen, rlen = _lengths(prompts), _lengths(responses)
    p = width_of(plen, prompt_width, "prompt")
    w = width_of(rlen, response_width, "response")
    padded_prompts = _fill(prompts, plen, p, left=True, fill=pad_id, dtype=dtype)
    padded_responses = _fill(responses, rlen, w, left=False, fill=pad_id, dtype=dtype)
    prompt_real = np.arange(p)[None, :] >= (p - plen)[:, None]
    response_real = np.arange(w)[None, :] < rlen[:, None]
    attention = np.concatenate([prompt_real, response_real], axis=1).astype(dtype)
    positions = np.maximum(np.cumsum(attention, axis=1, dtype=dtype) - 1, 0).astype(dtype)
    return Layout(
        prompts=padded_prompts,
        responses=padded_responses,
        input_ids=np.concatenate([padded_prompts, padded_responses], axis=1),
        attention_mask=attention,
        position_ids=positions,
        response_real=response_real,
        prompt_lengths=plen,
        response_lengths=rlen,
    )
