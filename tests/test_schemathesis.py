"""Property-based fuzzing of the REST API from its own OpenAPI schema (/api/v1/schema/):
schemathesis generates valid and invalid requests for every operation and sends them to the
Django app in-process (WSGI, this test's database) with an admin key. No request may end in a
server error, and every error is the API's JSON.

Bounded so the whole run stays well under two minutes: a fixed number of examples per
operation, derandomised (the same requests every run, so a failure reproduces).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, settings

from pool.models import Scope
from pool.services import api_key_create

EXAMPLES_PER_OPERATION = 12

# The gateway's doors (tag "gateway", claw_site/openapi.py) forward to an upstream model
# server, which this in-process run has none of: they are tested with the official SDKs
# (tests/gateway/), not fuzzed here.
schema = schemathesis.openapi.from_wsgi("/api/v1/schema/", get_wsgi_application()).exclude(tag="gateway")


@pytest.fixture
def admin_header(db) -> Iterator[dict[str, str]]:
    """An admin key; and, as Django's test Client does, requests that do not close the
    database connection when they end (it holds this test's transaction)."""
    _, key = api_key_create(name="fuzz", scopes=[Scope.ADMIN])
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield {"Authorization": f"Bearer {key}"}
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def errors_are_json(ctx, response, case) -> None:
    """A custom check: every 4xx is the API's error object in JSON (never an HTML page)."""
    if 400 <= response.status_code < 500:
        headers = {k.lower(): v for k, v in response.headers.items()}
        content_type = headers.get("content-type", [""])
        content_type = content_type[0] if isinstance(content_type, list) else content_type
        assert content_type.startswith("application/json"), f"{response.status_code} as {content_type}"
        assert "error" in response.json(), response.text[:200]


@pytest.mark.django_db
@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_no_server_errors(case, admin_header):
    from schemathesis.checks import not_a_server_error

    case.call_and_validate(headers=admin_header, checks=[not_a_server_error, errors_are_json])
