"""Text logging (CLAW_LOG_FORMAT=text, the development default; settings.LOGGING): one line
per record, whatever a client sent.

A logged message often carries client input: a request's path (claw_site/requestlog.py,
Django's "Not Found: <path>", uvicorn's access line), a uid, a header. A CR or LF in it
would start a forged line in the log, a bidi control would make the line read differently,
an escape sequence would drive the terminal. ``EscapingFormatter`` writes every such
character of the message as an escape (``\\r``, ``\\n``, ``\\x1b``, ``\\u202e``); the
traceback of a record with an exception, written by the server, keeps its lines. No Django
import: the logging configuration loads this before the apps.
"""

from __future__ import annotations

import logging
import re

# What a log line must not hold raw: C0 controls (tab included), DEL, C1 controls, the line and
# paragraph separators, bidi controls and zero-width characters (claw_kit/web/guard.py's set).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060\u2066-\u2069\ufeff]")
_NAMED = {"\r": "\\r", "\n": "\\n", "\t": "\\t"}


def escape(text: str) -> str:
    """``text`` with every character of _UNSAFE written as an escape; the same string when it
    holds none (the common case costs two C calls)."""
    if text.isascii() and text.isprintable():
        return text
    return _UNSAFE.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    ch = match.group()
    named = _NAMED.get(ch)
    if named:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class EscapingFormatter(logging.Formatter):
    """logging.Formatter with the message escaped (see the module docstring)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        raw = record.message
        record.message = escape(raw)
        try:
            return super().formatMessage(record)
        finally:
            record.message = raw
