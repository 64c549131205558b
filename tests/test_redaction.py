"""Secrets in URL paths (claw_kit/redaction.py, claw_site/error_reports.py): what is masked,
that log records keep the shape their formatters expect, that every configured handler and
the `serve` command's uvicorn use the filter, and that Django's error reports are masked.
The live end-to-end check (a server's real log) is in tests/gateway/test_capability_urls.py."""

from __future__ import annotations

import copy
import logging
import signal
import sys

import pytest
from django.core.management import call_command
from django.test import RequestFactory
from django.utils.module_loading import import_string

from claw_kit.redaction import RedactSecrets, redact
from claw_site.error_reports import RedactingExceptionReporter
from claw_site.management.commands import serve

KEY = "claw_0123456789ab_S3cr3t-KEY_value"
TOKEN = "Tok3n_abcdefghijklmnopqrstuvwxyz012"


@pytest.mark.parametrize(
    ("path", "masked"),
    [
        (f"/compat/claw-r1/k/{KEY}/init_trajectory", "/compat/claw-r1/k/***/init_trajectory"),
        (f"/compat/claw-r1/k/{KEY}", "/compat/claw-r1/k/***"),
        (
            f"/compat/claw-r1/c/{TOKEN}/t1/g1/v1/chat/completions",
            "/compat/claw-r1/c/***/t1/g1/v1/chat/completions",
        ),
        (f"/t/c/{TOKEN}/t1/-/v1/models?x=1", "/t/c/***/t1/-/v1/models?x=1"),
        (
            f"http://h:8000/compat/claw-r1/k/{KEY}/submit_steps",
            "http://h:8000/compat/claw-r1/k/***/submit_steps",
        ),
        (f'"POST /t/c/{TOKEN}/a/b/v1/x HTTP/1.1"', '"POST /t/c/***/a/b/v1/x HTTP/1.1"'),
    ],
)
def test_the_secret_segment_is_masked(path, masked):
    assert redact(path) == masked


@pytest.mark.parametrize(
    "path",
    ["/t/traj/group/v1/chat/completions", "/api/v1/steps", "/compat/claw-r1/t1/g1/v1/models", "/v1/models"],
)
def test_paths_without_secrets_are_left_alone(path):
    assert redact(path) == path


def test_an_access_log_record_keeps_its_argument_tuple():
    # given: a record as uvicorn's access logger makes it (its formatter unpacks 5 args)
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "POST", f"/compat/claw-r1/k/{KEY}/init_trajectory", "1.1", 200),
        None,
    )

    # when
    assert RedactSecrets().filter(record) is True

    # then
    assert record.args == ("127.0.0.1:5", "POST", "/compat/claw-r1/k/***/init_trajectory", "1.1", 200)
    assert record.getMessage() == '127.0.0.1:5 - "POST /compat/claw-r1/k/***/init_trajectory HTTP/1.1" 200'


def test_a_traceback_is_masked():
    # given: an error whose message holds a capability path, logged with exc_info
    try:
        raise RuntimeError(f"failed on /t/c/{TOKEN}/t1/-/v1/chat/completions")
    except RuntimeError:
        record = logging.LogRecord(
            "django.request", logging.ERROR, __file__, 1, "Internal Server Error: %s", ("/x",), sys.exc_info()
        )

    # when
    RedactSecrets().filter(record)
    text = logging.Formatter().format(record)

    # then
    assert TOKEN not in text and "/t/c/***/t1/-/v1/chat/completions" in text


def test_every_handler_filters_and_serve_hands_the_same_logging_to_uvicorn(settings, monkeypatch):
    # given: the configured logging
    for name, handler in settings.LOGGING["handlers"].items():
        assert "redact_secrets" in handler.get("filters", ()), name
    for name in ("django", "uvicorn", "uvicorn.access"):
        assert settings.LOGGING["loggers"][name]["propagate"] is False, name
    expected = copy.deepcopy(settings.LOGGING)

    # when: `serve` starts uvicorn (stubbed: only its arguments are wanted)
    seen: dict = {}
    monkeypatch.setattr(
        serve, "run_uvicorn", lambda app, options, **kw: seen.update(options, app=app) or True
    )
    settings.CLAW_DEMO = False
    handler = signal.getsignal(signal.SIGTERM)
    try:
        call_command("serve", port=0)
    finally:
        signal.signal(signal.SIGTERM, handler)

    # then: uvicorn is configured with the project's logging (a copy), not its own default
    assert seen["app"] == "claw_site.asgi:application"
    assert seen["log_config"] == expected and seen["log_config"] is not settings.LOGGING


def test_error_reports_are_masked(settings):
    # given: a request on a gateway URL that failed
    request = RequestFactory().post(f"/compat/claw-r1/k/{KEY}/init_trajectory")
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()

    # when: Django builds its report with the configured reporter
    reporter_class = import_string(settings.DEFAULT_EXCEPTION_REPORTER)
    reporter = reporter_class(request, *exc_info)

    # then
    assert reporter_class is RedactingExceptionReporter
    for text in (reporter.get_traceback_text(), reporter.get_traceback_html()):
        assert KEY not in text and "/compat/claw-r1/k/***/init_trajectory" in text
