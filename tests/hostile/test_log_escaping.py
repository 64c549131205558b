"""Log lines escape what clients send: a CR/LF (or another control, bidi or zero-width
character) in a request's path is written as an escape by the text formatter of
settings.LOGGING (claw_kit/textlog.py), so it cannot forge a line."""

from __future__ import annotations

import asyncio
import logging
import sys
from logging.config import DictConfigurator

import pytest
from django.conf import settings

from pool.models import Scope
from pool.services.api_keys import api_key_create
from tests.hostile.test_walk import asgi_request


def text_formatter() -> logging.Formatter:
    """The formatter the console handler uses with CLAW_LOG_FORMAT=text, built from the settings."""
    return DictConfigurator({}).configure_formatter(dict(settings.LOGGING["formatters"]["text"]))


# (what a client sends in the path, how the line must show it)
PATHS = [
    (
        "/healthz\r\n2026-01-01 00:00:00 ERROR forged line",
        "/healthz\\r\\n2026-01-01 00:00:00 ERROR forged line",
    ),
    ("/api/v1/steps/a\nb", "/api/v1/steps/a\\nb"),
    ("/api/v1/steps/a\x1b[31mred", "/api/v1/steps/a\\x1b[31mred"),
    ("/api/v1/steps/a\u2028b\u202ec", "/api/v1/steps/a\\u2028b\\u202ec"),
    ("/api/v1/steps/plain-é", "/api/v1/steps/plain-é"),
]


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.django_db(transaction=True)
def test_a_request_line_escapes_the_clients_path():
    # (caplog's handler would not survive: loading the ASGI app configures logging anew)
    import claw_site.asgi  # noqa: F401

    key = api_key_create(name="log-escape", scopes=[Scope.ADMIN])[1]
    formatter = text_formatter()
    log = logging.getLogger("claw.request")
    level, captured = log.level, Records()
    log.setLevel(logging.INFO)
    log.addHandler(captured)
    try:
        for path, shown in PATHS:
            captured.records.clear()
            # when a request with that path is served (unauthenticated paths too: /healthz)
            asyncio.run(asgi_request("get", path, b"", key))
            # then its request line, as the text formatter writes it, is one line showing the escapes
            assert len(captured.records) == 1, (path, captured.records)
            line = formatter.format(captured.records[0])
            assert "\n" not in line and "\r" not in line, line
            assert f"GET {shown} " in line, line
    finally:
        log.removeHandler(captured)
        log.setLevel(level)


def test_a_traceback_keeps_its_lines_and_the_message_is_escaped():
    formatter = text_formatter()
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "bad %s", ("a\r\nb",), sys.exc_info())
    line = formatter.format(record)
    first, *rest = line.split("\n")
    assert first.endswith("ERROR x bad a\\r\\nb")
    assert rest[0] == "Traceback (most recent call last):" and rest[-1] == "ValueError: boom"
    assert record.getMessage() == "bad a\r\nb"  # the record itself is left as it was
