"""Domain errors raised by pool services. The API layer maps them to HTTP (gateway/errors.py)."""

from __future__ import annotations


class PoolError(Exception):
    """Base class. ``field`` names the offending input (e.g. ``steps[3].step_index``)."""

    status_code = 400
    code = "invalid"

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidInput(PoolError):
    status_code = 400
    code = "invalid"


class Conflict(PoolError):
    """The request contradicts stored data (e.g. different content under an existing uid)."""

    status_code = 409
    code = "conflict"


class NotFound(PoolError):
    status_code = 404
    code = "not_found"


class Unprocessable(PoolError):
    """Well-formed input the pool cannot act on (no reward function for its data source,
    response text unknown, a reward function that failed on it)."""

    status_code = 422
    code = "unprocessable"
