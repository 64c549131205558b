"""Errors of the OpenAI-compatible doors beyond the shared ones (claw_kit/web/errors.py)."""

from __future__ import annotations


class DoorInputError(Exception):
    """A request field a door cannot translate: answered 400 naming ``param``."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
