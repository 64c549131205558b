"""The gateway's doors in the API docs (a drf-spectacular postprocessing hook).

The doors (gateway/proxy/urls.py, gateway/compat/urls.py) are plain async Django views, not
DRF views, so drf-spectacular does not see them. This hook adds them to the schema:

* the OpenAI doors (chat/completions, completions, models), the Anthropic ones (messages,
  messages/count_tokens) and Responses, each under its three base URLs (``/v1``, the scoped
  ``/t/{trajectory}/{group}/v1`` and the capability URL ``/t/c/{token}/{trajectory}/{group}/v1``);
* the Claw-R1 compat endpoints under ``/compat/claw-r1/`` (with ``Authorization: Bearer``;
  the same views serve the gateway URL ``/compat/claw-r1/k/<api key>/...`` and the
  capability URL ``/compat/claw-r1/c/<token>/...``, whose path holds a secret and is not
  listed).

Each operation names what the request carries (a minimal JSON Schema of its body: the
fields the door requires, with their types; everything else is the upstream API's own and
passes as it is, see the linked reference), the headers the gateway reads and answers with,
and the answers, errors in the door's own shape (OpenAI's error object; Anthropic's for
messages). Tagged ``gateway``; tests/test_schemathesis.py fuzzes them against a live
server with the demo upstream behind it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TAG = "gateway"

_OBJ = {"type": "object", "additionalProperties": True}
_STR = {"type": "string", "minLength": 1}
_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}}
_MESSAGES = {
    "type": "array",
    "minItems": 1,
    "items": {"type": "object", "required": ["role"], "properties": {"role": {"type": "string"}}},
}


def _body(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    """A request body's JSON Schema: ``required`` fields with their types, ``optional`` ones,
    any other field allowed (the upstream API's own, passed on)."""
    out: dict[str, Any] = {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "additionalProperties": True,
    }
    if required:  # OpenAPI 3.0: a required list is never empty
        out["required"] = list(required)
    return out


# The error shapes (gateway/proxy/envelope.py: every error of a door is in its own shape).
OPENAI_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": "string", "nullable": True},
                "code": {"type": "string", "nullable": True},
            },
        }
    },
}
ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"type": "string", "enum": ["error"]},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}


@dataclass(frozen=True, slots=True)
class Door:
    path: str  # under its base URL
    op_id: str
    summary: str
    description: str
    body: dict[str, Any] | None  # the request body's schema (None: a GET)
    example: dict[str, Any] | None
    reference: str | None = None  # the upstream API's reference
    anthropic: bool = False  # errors in Anthropic's shape
    streams: bool = True  # answers server-sent events when the request streams
    records: bool = True  # recorded as steps (answers X-Claw-Trajectory, X-Claw-Steps)


DOORS: list[Door] = [
    Door(
        "chat/completions",
        "chat_completions",
        "OpenAI Chat Completions (recorded)",
        "Forwarded to the upstream model server; the answer comes back unchanged (streamed when "
        "`stream` is true) and the call is recorded as one step of the trajectory: the prompt's "
        "and the response's token ids (from the upstream's logprobs or the configured tokenizer), "
        "the messages, the response text and tool calls. Body: the OpenAI request (`model`, "
        "`messages`, optional `tools`, `temperature`, `max_tokens`, `stream`, `logprobs`, …).",
        _body({"model": _STR, "messages": _MESSAGES}, {"stream": {"type": "boolean"}}),
        {"model": "my-model", "messages": [{"role": "user", "content": "What is 2 + 2?"}]},
        "https://platform.openai.com/docs/api-reference/chat/create",
    ),
    Door(
        "completions",
        "completions",
        "OpenAI Completions (recorded)",
        "Legacy text completions, forwarded and recorded as a step like chat completions. "
        "Body: the OpenAI request (`model`, `prompt`, `max_tokens`, `stream`, `logprobs`, …).",
        _body(
            {"model": _STR, "prompt": {"oneOf": [_STR, {"type": "array", "minItems": 1}]}},
            {"stream": {"type": "boolean"}, "max_tokens": {"type": "integer", "minimum": 1}},
        ),
        {"model": "my-model", "prompt": "2 + 2 =", "max_tokens": 4},
        "https://platform.openai.com/docs/api-reference/completions/create",
    ),
    Door(
        "models",
        "models",
        "OpenAI Models",
        "The upstream's model list, passed through (not recorded).",
        None,
        None,
        "https://platform.openai.com/docs/api-reference/models/list",
        streams=False,
        records=False,
    ),
    Door(
        "messages",
        "messages",
        "Anthropic Messages (recorded)",
        "Anthropic's Messages API (as the official `anthropic` SDK calls it: the key may come as "
        "`x-api-key`), forwarded and recorded as a step. Body: the Anthropic request (`model`, "
        "`max_tokens`, `messages`, optional `system`, `tools`, `stream`, …).",
        _body(
            {"model": _STR, "max_tokens": {"type": "integer", "minimum": 1}, "messages": _MESSAGES},
            {"stream": {"type": "boolean"}},
        ),
        {"model": "my-model", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]},
        "https://docs.anthropic.com/en/api/messages",
        anthropic=True,
    ),
    Door(
        "messages/count_tokens",
        "count_tokens",
        "Anthropic Messages: count tokens",
        'The number of input tokens the Messages request would take (`{"input_tokens": n}`), '
        "counted by the configured tokenizer; not recorded.",
        _body({"model": _STR, "messages": _MESSAGES}),
        {"model": "my-model", "messages": [{"role": "user", "content": "Hi"}]},
        "https://docs.anthropic.com/en/api/messages-count-tokens",
        anthropic=True,
        streams=False,
        records=False,
    ),
    Door(
        "responses",
        "responses",
        "OpenAI Responses (recorded)",
        "OpenAI's Responses API, forwarded and recorded as a step. Body: the OpenAI request "
        "(`model`, `input`, optional `instructions`, `previous_response_id`, `tools`, `stream`, …).",
        _body(
            {"model": _STR, "input": {"oneOf": [_STR, {"type": "array", "minItems": 1}]}},
            {"stream": {"type": "boolean"}, "previous_response_id": {"type": "string"}},
        ),
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
    "prompt": "Claw-R1's prompt uid: the trajectory's prompt group (`-` for none).",
    "trajectory_uid": "The trajectory to complete.",
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
    "Server-Timing": {
        "description": "Where the call's time went, in ms (W3C Server Timing): `upstream` (sent to "
        "answered in full), `record` (the steps stored and committed) and `total` (the request in "
        "hand to the answer ready); what the gateway added is `total` - `upstream`. A streamed "
        "answer's headers leave before either is known: it has none.",
        "schema": {"type": "string"},
    },
}

ERROR_STATUSES = ("400", "401", "403", "404", "405", "409", "413", "422", "429", "502", "503", "504")


def _errors(anthropic: bool) -> dict[str, Any]:
    shape = ANTHROPIC_ERROR if anthropic else OPENAI_ERROR
    which = "Anthropic's error object" if anthropic else "OpenAI's error object"
    error = {"description": f"An error, as {which}.", "content": {"application/json": {"schema": shape}}}
    return dict.fromkeys(ERROR_STATUSES, error)


def _parameters(params: list[str], headers: list[tuple[str, str]]) -> list[dict[str, Any]]:
    out = [
        {
            "name": p,
            "in": "path",
            "required": True,
            "schema": {"type": "string", "minLength": 1},
            "description": PATH_PARAMS[p],
        }
        for p in params
    ]
    out += [
        {"name": name, "in": "header", "required": False, "schema": {"type": "string"}, "description": text}
        for name, text in headers
    ]
    return out


def _operation(base_id: str, door: Door, params: list[str]) -> dict[str, Any]:
    capability = "token" in params
    headers = [
        (name, text)
        for name, text in HEADERS
        if not (params and name in ("X-Claw-Trajectory", "X-Claw-Prompt-Group"))
        and (door.records or name == "x-api-key")
    ]
    ok_content: dict[str, Any] = {"application/json": {"schema": _OBJ}}
    if door.streams:
        ok_content["text/event-stream"] = {"schema": {"type": "string"}}
    ok: dict[str, Any] = {
        "description": "The upstream's answer, unchanged: JSON, or server-sent events "
        "(`text/event-stream`) when the request streams."
        if door.streams
        else "The answer (JSON).",
        "content": ok_content,
    }
    if door.records:
        ok["headers"] = ANSWER_HEADERS
    description = door.description
    if door.reference:
        description += f"\n\nRequest and answer bodies: [the upstream API's reference]({door.reference})."
    op: dict[str, Any] = {
        "operationId": f"gateway_{base_id}{door.op_id}",
        "summary": door.summary,
        "description": description,
        "tags": [TAG],
        "parameters": _parameters(params, headers),
        # A capability URL needs no key: its token authorises. The others take a key with
        # the ingest scope (Authorization: Bearer, or x-api-key).
        "security": [{}] if capability else [{"bearerAuth": []}],
        "responses": {"200": ok, **_errors(door.anthropic)},
    }
    if door.body is not None:
        content: dict[str, Any] = {"schema": door.body}
        if door.example is not None:
            content["example"] = door.example
        op["requestBody"] = {"required": True, "content": {"application/json": content}}
    return op


# --- the Claw-R1 compat endpoints (gateway/compat/claw_r1.py) -------------------------------------
COMPAT = "/compat/claw-r1/"
_COMPAT_BASE = COMPAT + "{trajectory}/{prompt}/v1/"
_STEP = _body(
    {
        "prompt_ids": _IDS,
        "response_ids": _IDS,
        "trajectory_uid": _STR,
        "step_index": {"type": "integer", "minimum": 0},
    },
    {
        "prompt_uid": {"type": "string", "nullable": True},
        "rollout_log_probs": {"type": "array", "nullable": True, "items": {"type": "number"}},
        "reward": {"type": "number", "nullable": True},
        "policy_version": {"type": "integer", "nullable": True, "minimum": 0},
        "is_last": {"type": "boolean"},
        "metadata": {"type": "object"},
    },
)
_REGISTER = {"channel": {"type": "string"}, "metadata": {"type": "object"}}
_COMPLETE = _body({}, {"reward": {"type": "number"}, "channel": {"type": "string"}})

# (path, operation id, summary, request body schema (None: any JSON object), path parameters)
COMPAT_ENDPOINTS: list[tuple[str, str, str, dict[str, Any] | None, list[str]]] = [
    (
        COMPAT + "init_trajectory",
        "init_trajectory",
        "Open a trajectory: `{trajectory_uid, base_url}` (base_url: its capability URL)",
        _body({}, {"prompt_uid": _STR, **_REGISTER}),
        [],
    ),
    (
        COMPAT + "register_trajectory",
        "register_trajectory_body",
        "Register a trajectory named in the body",
        _body({"trajectory_uid": _STR}, _REGISTER),
        [],
    ),
    (
        COMPAT + "complete_trajectory/{trajectory_uid}",
        "complete_trajectory_uid",
        "Complete a trajectory (its last step gets `is_last` and the reward)",
        _COMPLETE,
        ["trajectory_uid"],
    ),
    (
        COMPAT + "submit_steps",
        "submit_steps",
        "White-box steps in Claw-R1's shape: `{accepted: n}` (atomic, idempotent)",
        _body({"steps": {"type": "array", "items": _STEP}}),
        [],
    ),
    (
        COMPAT + "generate",
        "generate",
        "Generate from token ids: `{token_ids, log_probs, stop_reason}` (the upstream's exact ids)",
        _body({"prompt_ids": {**_IDS, "minItems": 1}}, {"sampling_params": {"type": "object"}}),
        [],
    ),
    (
        COMPAT + "compute_reward",
        "compute_reward",
        "Score a response with the pool's reward function: `{reward_score, reward_extra_info}`",
        _body(
            {
                "response_ids": _IDS,
                "dataset_fields": _body({"data_source": _STR}),
            },
            {
                "prompt_ids": _IDS,
                "num_turns": {"type": "integer", "minimum": 0},
                "extra_fields": {"type": "object"},
            },
        ),
        [],
    ),
    (
        _COMPAT_BASE + "register_trajectory",
        "register_trajectory",
        "Register the base URL's trajectory (`metadata.policy_version` stamps later steps)",
        _body({}, _REGISTER),
        ["trajectory", "prompt"],
    ),
    (
        _COMPAT_BASE + "complete_trajectory",
        "complete_trajectory",
        "Complete the base URL's trajectory",
        _COMPLETE,
        ["trajectory", "prompt"],
    ),
    (
        _COMPAT_BASE + "trajectory/complete",
        "trajectory_complete",
        "Complete the base URL's trajectory (an older Claw-R1's alias)",
        _COMPLETE,
        ["trajectory", "prompt"],
    ),
]


def _compat_operation(
    op_id: str, summary: str, body: dict[str, Any] | None, params: list[str]
) -> dict[str, Any]:
    return {
        "operationId": f"claw_r1_{op_id}",
        "summary": summary,
        "description": "Claw-R1's gateway protocol (gateway/compat/claw_r1.py). The same endpoint "
        "serves the gateway URL `/compat/claw-r1/k/<api key>/...` (the key in the path).",
        "tags": [TAG],
        "parameters": _parameters(params, []),
        "security": [{"bearerAuth": []}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": body or _OBJ}}},
        "responses": {
            "200": {"description": "The answer (JSON).", "content": {"application/json": {"schema": _OBJ}}},
            **_errors(False),
        },
    }


def gateway_doors(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Add the gateway doors' operations to ``result`` (the schema drf-spectacular built)."""
    paths = result.setdefault("paths", {})
    for base, base_id, params in BASES:
        for door in DOORS:
            method = "post" if door.body is not None else "get"
            paths[base + door.path] = {method: _operation(base_id, door, params)}
    # The OpenAI doors under the Claw-R1 base URL (the prompt uid names the group).
    for door in DOORS:
        method = "post" if door.body is not None else "get"
        op = _operation("claw_r1_", door, ["trajectory", "prompt"])
        paths[_COMPAT_BASE + door.path] = {method: op}
    for path, op_id, summary, body, params in COMPAT_ENDPOINTS:
        paths[path] = {"post": _compat_operation(op_id, summary, body, params)}
    tags = result.setdefault("tags", [])
    if not any(t.get("name") == TAG for t in tags):
        tags.append(
            {
                "name": TAG,
                "description": "The OpenAI- and Anthropic-compatible doors for black-box agents: "
                "point the official SDK's base URL at `/v1` (or a trajectory's scoped URL) and "
                "every call is forwarded to the model server and recorded as a step; and the "
                "Claw-R1 protocol under `/compat/claw-r1/`.",
            }
        )
    return result
