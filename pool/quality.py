"""Quality signals of one step, computed when it is stored (pool/ingest/plan.py builds every
row through ``step_quality``). The group signals (duplicate responses, zero reward variance)
need the whole group and are set by pool/services/readiness.py."""

from __future__ import annotations

import hashlib

import numpy as np
from django.conf import settings

from .flags import Quality

# Degenerate repetition: fewer than this share of the response's 4-grams are distinct. Text
# from a healthy model sits above 0.8; a loop of period p over L tokens gives about p / L. A
# long loop after a sound start (100 tokens, then 400 looping with period 8) gives 0.22.
REPETITION_NGRAM = 4
REPETITION_MIN_TOKENS = 32
REPETITION_MAX_DISTINCT_RATIO = 0.3


def step_quality(
    response: np.ndarray,
    *,
    finish_reason: str | None,
    drift: bool,
    has_logprobs: bool,
) -> int:
    """The step's own quality flags (``Quality`` bits)."""
    flags = 0
    n = len(response)
    if n == 0:
        flags |= Quality.EMPTY
    if finish_reason == "length":
        flags |= Quality.TRUNCATED
    if drift:
        flags |= Quality.DRIFT
    if not has_logprobs:
        flags |= Quality.MISSING_LOGPROBS
    if n > settings.CLAW_QUALITY_MAX_RESPONSE_TOKENS:
        flags |= Quality.TOO_LONG
    if is_repetitive(response):
        flags |= Quality.REPETITION
    return int(flags)


def is_repetitive(ids: np.ndarray) -> bool:
    """Whether few of the response's 4-grams are distinct (vectorised: one pass, one sort)."""
    n = len(ids)
    if n < REPETITION_MIN_TOKENS:
        return False
    a = np.asarray(ids, dtype=np.uint64)
    k = REPETITION_NGRAM
    # A 4-gram as one 64-bit key (wrapping multiply-add: collisions only merge n-grams, and
    # at 2^-64 odds they never decide the flag).
    key = a[: n - k + 1].copy()
    for j in range(1, k):
        key = key * np.uint64(0x9E3779B97F4A7C15) + a[j : n - k + 1 + j]
    distinct = len(np.unique(key))
    return distinct < REPETITION_MAX_DISTINCT_RATIO * (n - k + 1)


def response_hash(response: np.ndarray) -> bytes:
    """8-byte fingerprint of the response ids: "the same response" within a group."""
    return hashlib.blake2b(np.ascontiguousarray(response, dtype="<i4").tobytes(), digest_size=8).digest()
