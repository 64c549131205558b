"""A retry for the few write services whose transactions lock rows of several trajectories
(rewards, completions, the readiness they settle): PostgreSQL may still pick one of two such
transactions as a deadlock victim (or, under a stricter isolation level, fail it for
serialization) where their lock orders cannot be made one, e.g. a group's quality flags
written for rollouts another writer holds. The victim's work was rolled back whole, so
running it again is exactly what its caller would do; the caller never sees the error.

Each retry waits first, a jittered backoff that doubles per attempt: the victim's rollback
wakes the winner, and a retry that started at once would race it for the rows it had just
released, and could lose the same way again."""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.db import OperationalError, connection

P = ParamSpec("P")
R = TypeVar("R")
log = logging.getLogger(__name__)
# Attempts in all; deadlock detection answers within deadlock_timeout (1 s by default).
ATTEMPTS = 3
# SQLSTATE deadlock_detected, serialization_failure.
_RETRYABLE = {"40P01", "40001"}
# The least wait before the first retry (seconds); the wait doubles per attempt.
BACKOFF_S = 0.02


def backoff_s(attempt: int, rand: Callable[[], float] = random.random) -> float:
    """The wait after failed attempt ``attempt`` (1-based): ``BACKOFF_S * 2**(attempt - 1)``,
    up to twice that (jitter, so two victims do not retry in step)."""
    return BACKOFF_S * 2 ** (attempt - 1) * (1.0 + rand())


def retry_on_deadlock(fn: Callable[P, R]) -> Callable[P, R]:
    """Run ``fn`` (an atomic service) again when the database chose it as a deadlock or
    serialization victim, up to ATTEMPTS times, each retry after ``backoff_s``. Inside an
    outer transaction it runs once: only the outermost transaction can be retried (so the
    write pipeline's effects never sleep here)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        if connection.in_atomic_block:
            return fn(*args, **kwargs)
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return fn(*args, **kwargs)
            except OperationalError as exc:
                code = getattr(exc.__cause__, "sqlstate", None)
                if code not in _RETRYABLE or attempt == ATTEMPTS:
                    raise
                wait = backoff_s(attempt)
                log.warning(
                    "%s: %s (attempt %d of %d), retrying in %.0f ms",
                    fn.__qualname__,
                    code,
                    attempt,
                    ATTEMPTS,
                    wait * 1000,
                )
                time.sleep(wait)
        raise AssertionError("unreachable")

    return wrapper
