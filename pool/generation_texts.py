"""The upstream's text of generated response ids (Claw-R1's ``/generate``), kept so a later
submit_steps or compute_reward of the same ids has the text without a tokenizer."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import tokens
from .models import GenerationText


def response_ids_hash(ids: Sequence[int] | np.ndarray) -> bytes:
    """The key of a response: blake2b-128 of its ids as little-endian int32 (as seq_hash)."""
    return tokens.seq_hash(tokens.ids_to_bytes(np.asarray(ids, dtype=tokens.TOKEN_DTYPE)))


def generation_text_remember(*, source_id: int, response_ids: Sequence[int], text: str) -> None:
    """Remember ``text`` for these ids of this source. Idempotent: the first text stored for
    the same ids stays (an upstream's text for given ids does not change). One statement."""
    GenerationText.objects.bulk_create(
        [GenerationText(source_id=source_id, response_hash=response_ids_hash(response_ids), text=text)],
        ignore_conflicts=True,
    )
