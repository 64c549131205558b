"""The API docs document the gateway's doors (claw_site/openapi.py): every door under its
three base URLs, as POST with its security, headers and answers, and every documented path
is a route the server really serves with that view."""

from __future__ import annotations

import pytest
from django.urls import resolve
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

from gateway.compat import claw_r1
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
    assert set(ok["headers"]) == {"X-Claw-Trajectory", "X-Claw-Steps", "Server-Timing"}
    assert {"application/json", "text/event-stream"} <= set(ok["content"])
    assert {"400", "401", "403", "502"} <= set(op["responses"])
    # and the documented path is the route that serves this door
    assert resolve(concrete + door).func is view


# (documented path, method, a concrete path, its view, the body fields it requires, error shape)
EVERY_DOOR = [
    *(
        (
            base + "chat/completions",
            "post",
            concrete + "chat/completions",
            views.chat_completions,
            {"model", "messages"},
            "openai",
        )
        for base, concrete, _ in BASES
    ),
    ("/v1/completions", "post", "/v1/completions", views.completions, {"model", "prompt"}, "openai"),
    ("/v1/models", "get", "/v1/models", views.models, None, "openai"),
    ("/t/{trajectory}/{group}/v1/models", "get", "/t/a/b/v1/models", views.models, None, "openai"),
    (
        "/v1/messages",
        "post",
        "/v1/messages",
        anthropic.messages,
        {"model", "max_tokens", "messages"},
        "anthropic",
    ),
    (
        "/v1/messages/count_tokens",
        "post",
        "/v1/messages/count_tokens",
        anthropic.count_tokens,
        {"model", "messages"},
        "anthropic",
    ),
    (
        "/t/c/{token}/{trajectory}/{group}/v1/messages/count_tokens",
        "post",
        "/t/c/tok/a/b/v1/messages/count_tokens",
        anthropic.count_tokens,
        {"model", "messages"},
        "anthropic",
    ),
    ("/v1/responses", "post", "/v1/responses", responses.responses, {"model", "input"}, "openai"),
    (
        "/compat/claw-r1/{trajectory}/{prompt}/v1/chat/completions",
        "post",
        "/compat/claw-r1/a/b/v1/chat/completions",
        None,
        {"model", "messages"},
        "openai",
    ),
    (
        "/compat/claw-r1/{trajectory}/{prompt}/v1/responses",
        "post",
        "/compat/claw-r1/a/b/v1/responses",
        None,
        {"model", "input"},
        "openai",
    ),
    (
        "/compat/claw-r1/init_trajectory",
        "post",
        "/compat/claw-r1/init_trajectory",
        claw_r1.init_trajectory,
        set(),
        "openai",
    ),
    (
        "/compat/claw-r1/submit_steps",
        "post",
        "/compat/claw-r1/submit_steps",
        claw_r1.submit_steps,
        {"steps"},
        "openai",
    ),
    (
        "/compat/claw-r1/generate",
        "post",
        "/compat/claw-r1/generate",
        claw_r1.generate,
        {"prompt_ids"},
        "openai",
    ),
    (
        "/compat/claw-r1/compute_reward",
        "post",
        "/compat/claw-r1/compute_reward",
        claw_r1.compute_reward,
        {"response_ids", "dataset_fields"},
        "openai",
    ),
    (
        "/compat/claw-r1/register_trajectory",
        "post",
        "/compat/claw-r1/register_trajectory",
        claw_r1.register_trajectory,
        {"trajectory_uid"},
        "openai",
    ),
    (
        "/compat/claw-r1/complete_trajectory/{trajectory_uid}",
        "post",
        "/compat/claw-r1/complete_trajectory/a",
        claw_r1.complete_trajectory,
        set(),
        "openai",
    ),
    (
        "/compat/claw-r1/{trajectory}/{prompt}/v1/register_trajectory",
        "post",
        "/compat/claw-r1/a/b/v1/register_trajectory",
        claw_r1.register_trajectory,
        set(),
        "openai",
    ),
    (
        "/compat/claw-r1/{trajectory}/{prompt}/v1/complete_trajectory",
        "post",
        "/compat/claw-r1/a/b/v1/complete_trajectory",
        claw_r1.complete_trajectory,
        set(),
        "openai",
    ),
]


@pytest.mark.parametrize(
    ("path", "method", "concrete", "view", "required", "shape"),
    EVERY_DOOR,
    ids=[d[0] + " " + d[1] for d in EVERY_DOOR],
)
def test_every_door_is_in_the_schema_with_its_body_and_error_shape(
    schema, path, method, concrete, view, required, shape
):
    # given the served schema: the door is documented with the method it serves
    op = schema["paths"][path][method]
    assert op["tags"] == ["gateway"]
    match = resolve(concrete)
    if view is not None:
        assert match.func is view
    # with a JSON Schema of its body naming the fields the door requires (none for a GET)
    if required is None:
        assert "requestBody" not in op
    else:
        body = op["requestBody"]["content"]["application/json"]["schema"]
        assert body["type"] == "object"
        assert set(body.get("required", [])) == required
        assert required <= set(body["properties"])
    # and its errors in the door's own shape
    error = op["responses"]["400"]["content"]["application/json"]["schema"]
    if shape == "anthropic":
        assert error["required"] == ["type", "error"]
        assert error["properties"]["error"]["required"] == ["type", "message"]
    else:
        assert error["required"] == ["error"]
        assert error["properties"]["error"]["required"] == ["message", "type"]
