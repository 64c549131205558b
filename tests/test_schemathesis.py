"""Property-based fuzzing of the whole API from its own OpenAPI schema (/api/v1/schema/):
schemathesis generates valid and invalid requests for every operation. No request may end in
a server error, and every 4xx is an error in the shape of the door it came through.

* The REST API (/api/...) is sent to the Django app in-process (WSGI, this test's database)
  with an admin key; its errors are the API's JSON error.
* The gateway's doors (tag "gateway", claw_site/openapi.py: the OpenAI, Anthropic, Responses
  and Claw-R1 compat doors) are sent to a live server (tests/live.py, real ASGI, its own
  database: PostgreSQL in CI's second pass) with the demo upstream behind it, with an ingest
  key as an agent has; their errors are OpenAI's error object, Anthropic's for messages.

Bounded so the whole run stays well under two minutes: a fixed number of examples per
operation, derandomised (the same requests every run, so a failure reproduces). The number
of cases run is counted and printed at the end of the module.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import nullcontext

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, settings

from pool.models import Scope
from pool.services.api_keys import api_key_create
from tests.gateway.conftest import start_upstream
from tests.live import live_server, stop_process

EXAMPLES_PER_OPERATION = 12
DOOR_EXAMPLES_PER_OPERATION = 5  # 33 door operations: ~200 cases through a live server, ~40 s
CASES: Counter[str] = Counter()  # cases run, by part ("api", "doors")

# The gateway's doors (tag "gateway", claw_site/openapi.py) forward to an upstream model
# server, which this in-process run has none of: they are fuzzed against a live server
# (test_no_door_answers_a_server_error below).
schema = schemathesis.openapi.from_wsgi("/api/v1/schema/", get_wsgi_application()).exclude(tag="gateway")


def _served_schema() -> dict:
    """The schema /api/v1/schema/ serves (drf-spectacular with the doors' hook), built
    in-process: the doors' cases are generated from it and sent to a live server."""
    from drf_spectacular.generators import SchemaGenerator

    return SchemaGenerator().get_schema(request=None, public=True)


doors = schemathesis.openapi.from_dict(_served_schema()).include(tag="gateway")


@pytest.fixture(scope="module", autouse=True)
def cases_counted(request) -> Iterator[None]:
    """Print how many cases the module ran, by part, once it is done."""
    yield
    total = sum(CASES.values()) - sum(v for k, v in CASES.items() if k.endswith("xx"))
    line = f"schemathesis: {total} cases run ({', '.join(f'{k} {v}' for k, v in sorted(CASES.items()))})"
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else nullcontext():
        print(f"\n{line}")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory) -> Iterator[tuple[str, str]]:
    """(a live server's URL with the demo upstream behind it, an ingest key of it)."""
    upstream, proc = start_upstream()
    try:
        with live_server(tmp_path_factory.mktemp("fuzz"), {"CLAW_UPSTREAM_URL": upstream}) as server:
            yield server.url, server.make_key("ingest", name="fuzz-agent")
    finally:
        stop_process(proc)


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
        _json_content(response)
        assert "error" in response.json(), response.text[:200]


def errors_in_the_doors_shape(ctx, response, case) -> None:
    """A custom check: every 4xx of a door is its own error object in JSON: Anthropic's for
    messages (``{"type": "error", "error": {"type", "message"}}``), else OpenAI's
    (``{"error": {"message", "type", ...}}``)."""
    if not 400 <= response.status_code < 500:
        return
    _json_content(response)
    body = response.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), response.text[:200]
    error = body["error"]
    if "/messages" in case.operation.path:
        assert body["type"] == "error", response.text[:200]
        assert isinstance(error.get("type"), str) and isinstance(error.get("message"), str), body
    else:
        assert isinstance(error.get("message"), str) and isinstance(error.get("type"), str), body


def _json_content(response) -> None:
    headers = {k.lower(): v for k, v in response.headers.items()}
    content_type = headers.get("content-type", [""])
    content_type = content_type[0] if isinstance(content_type, list) else content_type
    assert content_type.startswith("application/json"), f"{response.status_code} as {content_type}"


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

    CASES["api"] += 1
    case.call_and_validate(headers=admin_header, checks=[not_a_server_error, errors_are_json])


@doors.parametrize()
@settings(
    max_examples=DOOR_EXAMPLES_PER_OPERATION,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_no_door_answers_a_server_error(case, gateway):
    from schemathesis.checks import not_a_server_error

    url, key = gateway
    CASES["doors"] += 1
    response = case.call(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    CASES[f"doors {response.status_code // 100}xx"] += 1  # a door case reached an answer
    case.validate_response(response, checks=[not_a_server_error, errors_in_the_doors_shape])
