"""The gateway's doors in the API docs (a drf-spectacular postprocessing hook).

The doors (gateway/proxy/urls.py) are plain async Django views, not DRF views, so
drf-spectacular does not see them. This hook adds them to the schema, each under its three
base URLs (``/v1``, the scoped ``/t/{trajectory}/{group}/v1`` and the capability URL
``/t/c/{token}/{trajectory}/{group}/v1``): what the request carries, the headers the gateway
reads and answers with, and the answers. The request and response bodies are the upstream
API's own (OpenAI, Anthropic): summarised here, with a link to the reference, not copied.

Tagged ``gateway``; tests/test_schemathesis.py leaves that tag out (the doors forward to an
upstream model server, which the fuzzer has none of).
"""

from __future__ import annotations

from typing import Any

TAG = "gateway"

_OBJ = {"type": "object", "additionalProperties": True}

# (path under a base URL, operation id, summary, description, request example, reference)
DOORS: list[tuple[str, str, str, str, dict[str, Any], str]] = [
    (
        "chat/completions",
        "chat_completions",
        "OpenAI Chat Completions (recorded)",
        "Forwarded to the upstream model server; the answer comes back unchanged (streamed when "
        "`stream` is true) and the call is recorded as one step of the trajectory: the prompt's "
        "and the response's token ids (from the upstream's logprobs or the configured tokenizer), "
        "the messages, the response text and tool calls. Body: the OpenAI request (`model`, "
        "`messages`, optional `tools`, `temperature`, `max_tokens`, `stream`, `logprobs`, …).",
        {"model": "my-model", "messages": [{"role": "user", "content": "What is 2 + 2?"}]},
        "https://platform.openai.com/docs/api-reference/chat/create",
    ),
    (
        "completions",
        "completions",
        "OpenAI Completions (recorded)",
        "Legacy text completions, forwarded and recorded as a step like chat completions. "
        "Body: the OpenAI request (`model`, `prompt`, `max_tokens`, `stream`, `logprobs`, …).",
        {"model": "my-model", "prompt": "2 + 2 =", "max_tokens": 4},
        "https://platform.openai.com/docs/api-reference/completions/create",
    ),
    (
        "messages",
        "messages",
        "Anthropic Messages (recorded)",
        "Anthropic's Messages API (as the official `anthropic` SDK calls it: the key may come as "
        "`x-api-key`), forwarded and recorded as a step. Body: the Anthropic request (`model`, "
        "`max_tokens`, `messages`, optional `system`, `tools`, `stream`, …).",
        {"model": "my-model", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]},
        "https://docs.anthropic.com/en/api/messages",
    ),
    (
        "responses",
        "responses",
        "OpenAI Responses (recorded)",
        "OpenAI's Responses API, forwarded and recorded as a step. Body: the OpenAI request "
        "(`model`, `input`, optional `instructions`, `tools`, `stream`, …).",
        {"model": "my-model", "input": "What is 2 + 2?"},
        "https://platform.openai.com/docs/api-reference/responses/create",
    ),
]

# The three base URLs of every door, with the path parameters each one names.
BASES: list[tuple[str, str, list[str]]] = [
    ("/v1/", "", []),
    ("/t/{trajectory}/{group}/v1/", "scoped_", ["trajectory", "group"]),
    ("/t/c/{token}/{trajectory}/{group}/v1/", "capability_", ["token", "trajectory", "group"]),
]

PATH_PARAMS = {
    "trajectory": "The trajectory this call is a step of (created on its first call).",
    "group": "Its prompt group's uid (`-` for none). Declare the group first "
    "(`POST /api/v1/groups` with `expected_rollouts`) so that it can complete.",
    "token": "A trajectory token (from `POST /api/v1/trajectories`): it alone authorises "
    "calls on that trajectory; no API key is needed.",
}

HEADERS = [
    (
        "X-Claw-Trajectory",
        "The trajectory of this call when the URL names none (`/v1/...`); without it a new "
        "trajectory is minted. Its uid comes back in the answer's `X-Claw-Trajectory`.",
    ),
    ("X-Claw-Prompt-Group", "The prompt group when the URL names none."),
    ("X-Claw-Policy-Version", "The policy version that sampled this call (a non-negative integer)."),
    (
        "Idempotency-Key",
        "A retry with the same key gets the first answer back byte for byte "
        "(`Idempotent-Replayed: true`) and stores nothing new.",
    ),
    ("x-api-key", "The API key, as Anthropic's clients send it (instead of `Authorization`)."),
]

ANSWER_HEADERS = {
    "X-Claw-Trajectory": {
        "description": "The trajectory the call was recorded in.",
        "schema": {"type": "string"},
    },
    "X-Claw-Steps": {
        "description": "The uids of the steps recorded, comma-separated.",
        "schema": {"type": "string"},
    },
}

ERROR = {
    "description": "An error in the door's own shape (OpenAI's or Anthropic's error object).",
    "content": {"application/json": {"schema": _OBJ}},
}


def _operation(
    base_id: str, door: tuple[str, str, str, str, dict[str, Any], str], params: list[str]
) -> dict[str, Any]:
    _, op_id, summary, description, example, reference = door
    capability = "token" in params
    parameters = [
        {
            "name": p,
            "in": "path",
            "required": True,
            "schema": {"type": "string"},
            "description": PATH_PARAMS[p],
        }
        for p in params
    ]
    parameters += [
        {"name": name, "in": "header", "required": False, "schema": {"type": "string"}, "description": text}
        for name, text in HEADERS
        if not (params and name in ("X-Claw-Trajectory", "X-Claw-Prompt-Group"))
    ]
    return {
        "operationId": f"gateway_{base_id}{op_id}",
        "summary": summary,
        "description": f"{description}\n\nRequest and answer bodies: [the upstream API's reference]({reference}).",
        "tags": [TAG],
        "parameters": parameters,
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _OBJ, "example": example}},
        },
        # A capability URL needs no key: its token authorises. The others take a key with
        # the ingest scope (Authorization: Bearer, or x-api-key).
        "security": [{}] if capability else [{"bearerAuth": []}],
        "responses": {
            "200": {
                "description": "The upstream's answer, unchanged: JSON, or server-sent events "
                "(`text/event-stream`) when the request streams.",
                "headers": ANSWER_HEADERS,
                "content": {
                    "application/json": {"schema": _OBJ},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            },
            "400": ERROR,
            "401": ERROR,
            "403": ERROR,
            "409": ERROR,
            "502": ERROR,
        },
    }


def gateway_doors(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Add the gateway doors' operations to ``result`` (the schema drf-spectacular built)."""
    paths = result.setdefault("paths", {})
    for base, base_id, params in BASES:
        for door in DOORS:
            paths[base + door[0]] = {"post": _operation(base_id, door, params)}
    tags = result.setdefault("tags", [])
    if not any(t.get("name") == TAG for t in tags):
        tags.append(
            {
                "name": TAG,
                "description": "The OpenAI- and Anthropic-compatible doors for black-box agents: "
                "point the official SDK's base URL at `/v1` (or a trajectory's scoped URL) and "
                "every call is forwarded to the model server and recorded as a step.",
            }
        )
    return result
