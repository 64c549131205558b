"""claw_site.settings.base env helpers: unset or empty is the default, anything else must
parse, and a malformed value stops the process with the variable named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from claw_site.settings.base import env_bool, env_float, env_int

VAR = "CLAW_TEST_SETTING"


@pytest.mark.parametrize(
    "raw,expected",
    [
        (None, True),
        ("", True),
        ("  ", True),
        ("0", False),
        ("off", False),
        ("No", False),
        ("FALSE", False),
        ("1", True),
        ("yes", True),
        (" on ", True),
        ("True", True),
    ],
)
def test_bool_values(monkeypatch, raw, expected):
    if raw is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, raw)
    assert env_bool(VAR, True) is expected


@pytest.mark.parametrize(
    "read,raw",
    [
        (lambda: env_bool(VAR, False), "ture"),
        (lambda: env_int(VAR, 3), "12k"),
        (lambda: env_float(VAR, 1.0), "1,5"),
    ],
    ids=["bool", "int", "float"],
)
def test_a_malformed_value_is_an_error_naming_the_variable(monkeypatch, read, raw):
    # a typo never silently turns a switch off or a limit to its default
    monkeypatch.setenv(VAR, raw)
    with pytest.raises(ImproperlyConfigured, match=VAR):
        read()


def test_numbers(monkeypatch):
    monkeypatch.setenv(VAR, "")
    assert env_int(VAR, 3) == 3 and env_float(VAR, 0.5) == 0.5
    monkeypatch.setenv(VAR, " 12 ")
    assert env_int(VAR, 3) == 12 and env_float(VAR, 0.5) == 12.0


@pytest.mark.parametrize(
    "name,raw",
    [
        ("CLAW_RETENTION_DUTY", "0"),
        ("CLAW_RETENTION_DUTY", "1.5"),
        ("CLAW_RETENTION_DUTY", "-0.5"),
        ("CLAW_UPSTREAM_TRANSPORT", "curl"),
        ("CLAW_MESSAGES_UPSTREAM_MODE", "proxy"),
        ("CLAW_LOG_FORMAT", "xml"),
    ],
)
def test_a_value_outside_its_range_stops_the_settings_naming_the_variable(name, raw):
    # given: a variable that parses but names nothing the setting allows
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAW_")} | {name: raw}
    # when: a process loads the settings
    done = subprocess.run(
        [sys.executable, "-c", "import claw_site.settings.base"],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # then: it refuses to start, naming the variable and the value
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and name in done.stderr and raw in done.stderr
