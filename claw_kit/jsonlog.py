"""JSON-lines logging: one object per record, for log shippers (CLAW_LOG_FORMAT=json, the
production default; settings.LOGGING).

Every line has ``time`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger`` and
``message``; request lines (claw_site/requestlog.py) add ``request_id``, ``method``, ``path``,
``status`` and ``duration_ms``; a record with an exception adds ``exc_info`` (the rendered
traceback). Secrets in URL paths are masked by the handler's RedactSecrets filter before the
record gets here. No Django import: the logging configuration loads this before the apps.
"""

from __future__ import annotations

import logging
import time

import orjson

# Extra attributes copied into the object when a record carries them (logger.info(...,
# extra={...})).
EXTRA_FIELDS = ("request_id", "method", "path", "status", "duration_ms", "client")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in EXTRA_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                entry[name] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc_info"] = record.exc_text
        if record.stack_info:
            entry["stack_info"] = record.stack_info
        return orjson.dumps(entry, default=str).decode()


def _iso(created: float) -> str:
    seconds = int(created)
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int((created - seconds) * 1000):03d}Z"
    )
