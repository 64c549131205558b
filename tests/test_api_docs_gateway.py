"""The API docs document the gateway's doors (claw_site/openapi.py): every door under its
three base URLs, as POST with its security, headers and answers, and every documented path
is a route the server really serves with that view."""

from __future__ import annotations

import pytest
from django.urls import resolve
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

from gateway.proxy import views
from gateway.proxy.doors import anthropic, responses

pytestmark = pytest.mark.django_db

BASES = [
    ("/v1/", "/v1/", [{"bearerAuth": []}]),
    ("/t/{trajectory}/{group}/v1/", "/t/traj-7/task-42/v1/", [{"bearerAuth": []}]),
    ("/t/c/{token}/{trajectory}/{group}/v1/", "/t/c/tok/traj-7/task-42/v1/", [{}]),
]
DOORS = [
    ("chat/completions", views.chat_completions),
    ("completions", views.completions),
    ("messages", anthropic.messages),
    ("responses", responses.responses),
]
ROWS = [(base, concrete, security, door, view) for base, concrete, security in BASES for door, view in DOORS]


@pytest.fixture(scope="module")
def schema(django_db_blocker) -> dict:
    with django_db_blocker.unblock():
        resp = APIClient().get("/api/v1/schema/", {"format": "json"})
    assert resp.status_code == 200
    return resp.json()


def test_the_schema_with_the_doors_is_valid_openapi(schema):
    validate_schema(schema)
    assert "gateway" in {t["name"] for t in schema["tags"]}


@pytest.mark.parametrize(("base", "concrete", "security", "door", "view"), ROWS)
def test_each_door_is_documented_as_the_post_it_serves(schema, base, concrete, security, door, view):
    # given the served schema
    path = schema["paths"].get(base + door)
    # then the door is there, as one POST of the gateway tag, with its security
    assert path is not None, base + door
    assert list(path) == ["post"]
    op = path["post"]
    assert op["tags"] == ["gateway"] and op["security"] == security
    assert op["requestBody"]["required"] is True and "application/json" in op["requestBody"]["content"]
    # with the headers the gateway reads and the ones it answers with
    headers = {p["name"] for p in op["parameters"] if p["in"] == "header"}
    assert {"X-Claw-Policy-Version", "Idempotency-Key", "x-api-key"} <= headers
    assert ("X-Claw-Trajectory" in headers) is (base == "/v1/")  # a scoped URL names it
    path_params = {p["name"] for p in op["parameters"] if p["in"] == "path"}
    assert path_params == {seg.strip("{}") for seg in base.split("/") if seg.startswith("{")}
    ok = op["responses"]["200"]
    assert set(ok["headers"]) == {"X-Claw-Trajectory", "X-Claw-Steps"}
    assert {"application/json", "text/event-stream"} <= set(ok["content"])
    assert {"400", "401", "403", "502"} <= set(op["responses"])
    # and the documented path is the route that serves this door
    assert resolve(concrete + door).func is view
