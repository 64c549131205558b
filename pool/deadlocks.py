"""A retry for the few write services whose transactions lock rows of several trajectories
(rewards, completions, the readiness they settle): PostgreSQL may still pick one of two such
transactions as a deadlock victim (or, under a stricter isolation level, fail it for
serialization) where their lock orders cannot be made one, e.g. a group's quality flags
written for rollouts another writer holds. The victim's work was rolled back whole, so
running it again is exactly what its caller would do; the caller never sees the error."""

from __future__ import annotations

import functools
import logging
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


def retry_on_deadlock(fn: Callable[P, R]) -> Callable[P, R]:
    """Run ``fn`` (an atomic service) again when the database chose it as a deadlock or
    serialization victim, up to ATTEMPTS times. Inside an outer transaction it runs once:
    only the outermost transaction can be retried."""

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
                log.warning("%s: %s (attempt %d of %d), retrying", fn.__qualname__, code, attempt, ATTEMPTS)
        raise AssertionError("unreachable")

    return wrapper
