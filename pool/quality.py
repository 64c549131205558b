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
# The bits as plain ints: an IntFlag operator costs microseconds, and this runs per step.
_EMPTY, _TRUNCATED, _DRIFT, _MISSING_LOGPROBS, _TOO_LONG, _REPETITION = (
    int(f)
    for f in (
        Quality.EMPTY,
        Quality.TRUNCATED,
        Quality.DRIFT,
        Quality.MISSING_LOGPROBS,
        Quality.TOO_LONG,
        Quality.REPETITION,
    )
)


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
        flags |= _EMPTY
    if finish_reason == "length":
        flags |= _TRUNCATED
    if drift:
        flags |= _DRIFT
    if not has_logprobs:
        flags |= _MISSING_LOGPROBS
    if n > settings.CLAW_QUALITY_MAX_RESPONSE_TOKENS:
        flags |= _TOO_LONG
    if is_repetitive(response):
        flags |= _REPETITION
    return flags


def is_repetitive(ids: np.ndarray) -> bool:
    """Whether few of the response's 4-grams are distinct. Vectorised, and cheap on the hot
    path (about 5 us for 200 tokens): a response has at least as many distinct 4-grams as
    distinct tokens (minus 3), so one sort of the tokens clears almost every response, and
    only the suspicious ones pay for the 4-gram count."""
    n = len(ids)
    if n < REPETITION_MIN_TOKENS:
        return False
    windows = n - REPETITION_NGRAM + 1
    limit = REPETITION_MAX_DISTINCT_RATIO * windows
    a = np.asarray(ids)
    if _distinct(a) - (REPETITION_NGRAM - 1) >= limit:
        return False
    a = a.astype(np.uint64)
    # A 4-gram as one 64-bit key (wrapping multiply-add: collisions only merge n-grams, and
    # at 2^-64 odds they never decide the flag).
    key = a[:windows].copy()
    for j in range(1, REPETITION_NGRAM):
        key = key * np.uint64(0x9E3779B97F4A7C15) + a[j : windows + j]
    return _distinct(key) < limit


def _distinct(a: np.ndarray) -> int:
    """Number of distinct values (sort and compare: np.unique costs 6x more at this size)."""
    s = np.sort(a)
    return int(np.count_nonzero(s[1:] != s[:-1])) + 1


def response_hash(response: np.ndarray) -> bytes:
    """8-byte fingerprint of the response ids: "the same response" within a group."""
    return hashlib.blake2b(np.ascontiguousarray(response, dtype="<i4").tobytes(), digest_size=8).digest()
