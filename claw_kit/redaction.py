"""Secrets in URL paths, masked wherever a path is written down.

Two kinds of URL carry a secret in their path (see docs/api.md, "Gateway URLs and capability
URLs"): a source's Claw-R1 gateway URL ``/compat/claw-r1/k/<api key>/...`` and a trajectory
capability URL ``/compat/claw-r1/c/<token>/...`` or ``/t/c/<token>/...``. Logs (uvicorn's
access and error loggers, Django's request warnings, tracebacks), error reports and error
bodies show them as ``/k/***`` and ``/c/***``.

``RedactSecrets`` is installed on every handler in settings.LOGGING, which the ``serve``
command also hands to uvicorn, so it sees every record. This module imports nothing from
Django: the logging configuration loads it before the apps are ready.
"""

from __future__ import annotations

import logging
import re
from typing import Any

# The secret is the whole path segment after the marker.
_SECRET_SEGMENT = re.compile(r"(/compat/claw-r1/[kc]/|/t/c/)[^/?#\s\"'<>]+")
MASK = "***"


def redact(text: str) -> str:
    """``text`` with the secret segment of every gateway or capability URL path masked."""
    if "/c/" not in text and "/k/" not in text:  # the common case: nothing to scan
        return text
    return _SECRET_SEGMENT.sub(r"\1" + MASK, text)


class RedactSecrets(logging.Filter):
    """A handler filter that masks secrets in the message, its arguments, and the rendered
    traceback and stack of a record. It never drops a record.

    Arguments stay a tuple (or mapping) of the same shape, because some formatters unpack
    them (uvicorn's access formatter reads (client, method, path, version, status)); an
    argument is replaced by its masked text only when it contains a secret."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_masked(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _masked(v) for k, v in record.args.items()}
        if record.exc_info and not record.exc_text:
            # Render the traceback now (as Formatter.format would) so it can be masked.
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def _masked(value: Any) -> Any:
    if isinstance(value, int | float | bool) or value is None:
        return value
    text = value if isinstance(value, str) else str(value)
    masked = redact(text)
    return value if masked == text else masked
