"""The hostile-input corpus: one table of (door, path, body, headers) that every door must
refuse with a JSON 4xx in its own error shape, writing nothing and calling no upstream.

Built from generators (nesting, NaN, NUL and control characters, MessagePack bin/ext,
container sizes) crossed with the doors. ``{key}`` in a path is the API key of the test's
caller (the Claw-R1 gateway URL); the limits are the settings' defaults (README "Limits").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from claw_site.settings.base import CLAW_MAX_JSON_DEPTH, CLAW_MAX_JSON_ITEMS, CLAW_MAX_JSON_KEYS

JSON = "application/json"
MSGPACK = "application/msgpack"
A = "/api/v1"
R1 = "/compat/claw-r1"
MODEL = "claw-demo"


@dataclass(frozen=True)
class Case:
    id: str
    door: str  # "openai" ({"error": {type, code, message, param}}) or "anthropic"
    path: str
    body: bytes
    content_type: str = JSON
    headers: dict[str, str] = field(default_factory=dict)
    method: str = "POST"  # a GET's hostile part is its query string (``path``)


# --- hostile values ------------------------------------------------------------------------------
def deep_object(levels: int) -> bytes:
    """``{"a": {"a": ... 1}}``: an object ``levels`` deep (the value itself is level 1)."""
    return b'{"a":' * levels + b"1" + b"}" * levels


def deep_array(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def with_raw(template: dict[str, Any], at: str, raw: bytes) -> bytes:
    """``template`` as JSON with the value at the dotted path ``at`` replaced by ``raw``
    (bytes that need not be JSON: NaN, a nesting orjson would refuse to write)."""
    marker = "__RAW__"
    obj = orjson.loads(orjson.dumps(template))
    parts = at.split(".")
    node = obj
    for p in parts[:-1]:
        node = node[int(p)] if isinstance(node, list) else node[p]
    last = parts[-1]
    if isinstance(node, list):
        node[int(last)] = marker
    else:
        node[last] = marker
    return orjson.dumps(obj).replace(f'"{marker}"'.encode(), raw)


JUST_TOO_DEEP = CLAW_MAX_JSON_DEPTH  # a value at this depth inside a top-level field is one too many
NESTINGS = {
    "just over the depth limit": deep_object(JUST_TOO_DEEP),
    "nested 300 deep": deep_object(300),
    "nested 1,100 deep": deep_object(1100),
    "arrays nested 2,000 deep": deep_array(2000),
}
NON_FINITE = {"NaN": b"NaN", "Infinity": b"Infinity", "-Infinity": b"-Infinity"}
MANY_KEYS = orjson.dumps({f"k{i}": 0 for i in range(CLAW_MAX_JSON_KEYS + 1)})
MANY_ITEMS = b"[" + b"0," * CLAW_MAX_JSON_ITEMS + b"0]"
BAD_UIDS = {
    "CRLF": "a\r\nX-Evil: 1",
    "NUL": "a\x00b",
    "ESC": "a\x1b[31m",
    "tab": "a\tb",
    "DEL": "a\x7fb",
    "blank": "   ",
}


# --- the doors' valid bodies -----------------------------------------------------------------------
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
MESSAGES = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
COUNT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
RESPONSES = {"model": MODEL, "input": "hi", "max_output_tokens": 4}
CHAT_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
ANTHROPIC_TOOL = {"name": "f", "input_schema": {"type": "object"}}
RESPONSES_TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}

PROXY_DOORS: list[tuple[str, str, str, dict[str, Any], dict[str, Any]]] = [
    # (name, error shape, path, valid body, the body with a tool)
    ("chat", "openai", "/v1/chat/completions", CHAT, {**CHAT, "tools": [CHAT_TOOL]}),
    ("messages", "anthropic", "/v1/messages", MESSAGES, {**MESSAGES, "tools": [ANTHROPIC_TOOL]}),
    ("count_tokens", "anthropic", "/v1/messages/count_tokens", COUNT, {**COUNT, "tools": [ANTHROPIC_TOOL]}),
    ("responses", "openai", "/v1/responses", RESPONSES, {**RESPONSES, "tools": [RESPONSES_TOOL]}),
]
TOOL_PARAMETERS = {
    "chat": "tools.0.function.parameters",
    "messages": "tools.0.input_schema",
    "count_tokens": "tools.0.input_schema",
    "responses": "tools.0.parameters",
}
MESSAGE_FIELD = {
    "chat": "messages.0",
    "messages": "messages.0",
    "count_tokens": "messages.0",
    "responses": None,
}


def proxy_cases() -> list[Case]:
    out: list[Case] = []
    for name, shape, path, body, tooled in PROXY_DOORS:
        for what, raw in NESTINGS.items():
            out.append(
                Case(
                    f"{name}: metadata {what}",
                    shape,
                    path,
                    with_raw({**body, "metadata": 0}, "metadata", raw),
                )
            )
            out.append(
                Case(
                    f"{name}: tool parameters {what}",
                    shape,
                    path,
                    with_raw(tooled, TOOL_PARAMETERS[name], raw),
                )
            )
        if MESSAGE_FIELD[name]:
            msg = {**body, "messages": [{"role": "user", "content": "hi", "x": 0}]}
            out.append(
                Case(
                    f"{name}: an extra message field nested 300 deep",
                    shape,
                    path,
                    with_raw(msg, "messages.0.x", deep_object(300)),
                )
            )
            out.append(
                Case(
                    f"{name}: NUL in the message content",
                    shape,
                    path,
                    orjson.dumps({**body, "messages": [{"role": "user", "content": "hi\x00"}]}),
                )
            )
        else:
            out.append(
                Case(f"{name}: NUL in the input", shape, path, orjson.dumps({**body, "input": "hi\x00"}))
            )
            out.append(
                Case(
                    f"{name}: input items nested 300 deep",
                    shape,
                    path,
                    with_raw({**body, "input": 0}, "input", deep_array(300)),
                )
            )
        out.append(Case(f"{name}: the whole body nested 1,100 deep", shape, path, deep_object(1100)))
        out.append(Case(f"{name}: the whole body nested 5,000 deep", shape, path, deep_array(5000)))
        for lit, raw in NON_FINITE.items():
            out.append(
                Case(
                    f"{name}: {lit} literal",
                    shape,
                    path,
                    with_raw({**body, "temperature": 0}, "temperature", raw),
                )
            )
        out.append(
            Case(
                f"{name}: NUL in a metadata key",
                shape,
                path,
                orjson.dumps({**body, "metadata": {"a\x00": "x"}}),
            )
        )
        out.append(
            Case(
                f"{name}: an integer beyond 64 bits",
                shape,
                path,
                orjson.dumps({**body, "metadata": {}})[:-1] + b',"seed":1' + b"0" * 25 + b"}",
            )
        )
        out.append(
            Case(
                f"{name}: an object with too many keys",
                shape,
                path,
                with_raw({**body, "metadata": 0}, "metadata", MANY_KEYS),
            )
        )
        out.append(
            Case(
                f"{name}: an array with too many items",
                shape,
                path,
                with_raw({**body, "metadata": 0}, "metadata", b'{"a":' + MANY_ITEMS + b"}"),
            )
        )
        for uid_name, uid in BAD_UIDS.items():
            quoted = "".join(c if c.isalnum() else f"%{ord(c):02X}" for c in uid)
            out.append(
                Case(
                    f"{name}: {uid_name} in the path's trajectory",
                    shape,
                    f"/t/{quoted}/g{path}",
                    orjson.dumps(body),
                )
            )
        out.append(
            Case(f"{name}: CRLF in the path's group", shape, f"/t/traj-ok/a%0D%0Ab{path}", orjson.dumps(body))
        )
        out.append(
            Case(
                f"{name}: a tab in X-Claw-Trajectory",
                shape,
                path,
                orjson.dumps(body),
                headers={"X-Claw-Trajectory": "a\tb"},
            )
        )
    return out


# --- the REST API ------------------------------------------------------------------------------------
def step(**changes: Any) -> dict[str, Any]:
    return {
        "trajectory_uid": "hostile-t",
        "step_index": 0,
        "prompt_ids": [1, 2],
        "response_ids": [3],
        **changes,
    }


REST_BODIES: list[tuple[str, str, dict[str, Any], str]] = [
    # (name, path, a valid body, the dotted path of its free JSON field)
    ("steps", f"{A}/steps", {"steps": [step(metadata=0)]}, "steps.0.metadata"),
    (
        "steps messages",
        f"{A}/steps",
        {"steps": [step(messages=[{"role": "user", "x": 0}])]},
        "steps.0.messages.0.x",
    ),
    ("trajectories", f"{A}/trajectories", {"uid": "hostile-new", "metadata": 0}, "metadata"),
    ("groups", f"{A}/groups", {"uid": "hostile-g", "ground_truth": 0}, "ground_truth"),
    ("rewards", f"{A}/rewards", {"step_uid": "hostile-seed:0", "reward": 1.0, "metadata": 0}, "metadata"),
    ("events", f"{A}/events", {"type": "note", "payload": 0}, "payload"),
    ("policy-versions", f"{A}/policy-versions", {"version": 7, "metadata": 0}, "metadata"),
    # curation and lineage writes (a trainer's and an operator's)
    ("runs", f"{A}/runs", {"consumer": "hostile-c", "dataset": "hostile-ds", "config": 0}, "config"),
    (
        "verdicts",
        f"{A}/leases/00000000-0000-4000-8000-000000000001/verdicts",
        {"steps": [{"uid": "hostile-seed:0", "tokens": 0}]},
        "steps.0.tokens",
    ),
    ("datasets", f"{A}/datasets", {"name": "hostile-ds2", "filters": 0}, "filters"),
    ("dataset preview", f"{A}/datasets/preview", {"filters": 0}, "filters"),
    ("labels", f"{A}/labels", {"step_uids": ["hostile-seed:0"], "tags_add": 0}, "tags_add"),
]

# GET query strings a reader may send (the dataset, checkpoint and snapshot diffs, page sizes):
# digits that are not ASCII ("²", "٣": str.isdigit holds, int refuses), numbers past int's
# digit limit, NUL and control characters, cursors that decode to nonsense.
DIFF = f"{A}/datasets/hostile-ds/diff"
QUERY_CASES: list[tuple[str, str]] = [
    ("dataset diff: a superscript digit in from", f"{DIFF}?from=%C2%B2&to=1"),
    ("dataset diff: an Arabic-Indic digit in to", f"{DIFF}?from=1&to=%D9%A3"),
    ("dataset diff: a 5,000-digit version", f"{DIFF}?from=1&to=" + "9" * 5000),
    ("dataset diff: a negative version", f"{DIFF}?from=-1&to=1"),
    ("dataset diff: NUL in side", f"{DIFF}?from=1&to=1&side=a%00b"),
    ("dataset diff: a superscript page size", f"{DIFF}?from=1&to=1&page_size=%C2%B2"),
    ("dataset diff: a 40-digit page size", f"{DIFF}?from=1&to=1&page_size=" + "9" * 40),
    ("dataset diff: a cursor of nested arrays", f"{DIFF}?from=1&to=1&cursor=W1tbWzFdXV1d"),
    ("dataset diff: a cursor that is not base64", f"{DIFF}?from=1&to=1&cursor=%FF%FE"),
    (
        "snapshot diff: to that is no id",
        f"{A}/snapshots/00000000-0000-4000-8000-000000000001/diff?to=%00",
    ),
    ("tasks: a superscript page size", f"{A}/tasks?page_size=%C2%B2"),
    ("tasks: a 5,000-digit page size", f"{A}/tasks?page_size=" + "9" * 5000),
    ("runs: a 5,000-digit page size", f"{A}/runs?page_size=" + "9" * 5000),
    ("steps: NUL in a filter", f"{A}/steps?trajectory_uid=a%00b"),
]


def _msgpack_step(meta: Any) -> bytes:
    return msgspec.msgpack.encode({"steps": [step(metadata={"m": meta})]})


def rest_cases() -> list[Case]:
    out: list[Case] = []
    for name, path, body, at in REST_BODIES:
        for what, raw in NESTINGS.items():
            out.append(Case(f"{name}: {at} {what}", "openai", path, with_raw(body, at, raw)))
        out.append(Case(f"{name}: NaN in {at}", "openai", path, with_raw(body, at, b'{"x": NaN}')))
        out.append(Case(f"{name}: the body nested 5,000 deep", "openai", path, deep_array(5000)))
        out.append(
            Case(
                f"{name}: NaN in a body nested 1,100 deep",
                "openai",
                path,
                b'{"a":' * 1100 + b"NaN" + b"}" * 1100,
            )
        )
    out += [Case(name, "openai", path, b"", method="GET") for name, path in QUERY_CASES]
    out.append(Case("feedback: the body nested 2,000 deep", "openai", f"{A}/feedback", deep_object(2000)))
    out.append(
        Case(
            "feedback: a NaN rating in a deep body",
            "openai",
            f"{A}/feedback",
            b'{"x":' * 1200 + b"NaN" + b"}" * 1200,
        )
    )
    out.append(
        Case(
            "trajectories: metadata with too many keys",
            "openai",
            f"{A}/trajectories",
            with_raw({"uid": "h", "metadata": 0}, "metadata", MANY_KEYS),
        )
    )
    for uid_name, uid in BAD_UIDS.items():
        out.append(
            Case(
                f"steps: {uid_name} in trajectory_uid",
                "openai",
                f"{A}/steps",
                orjson.dumps({"steps": [step(trajectory_uid=uid)]}),
            )
        )
        out.append(
            Case(
                f"trajectories: {uid_name} in uid", "openai", f"{A}/trajectories", orjson.dumps({"uid": uid})
            )
        )
    out.append(
        Case(
            "steps: CRLF in the step uid",
            "openai",
            f"{A}/steps",
            orjson.dumps({"steps": [step(uid="s\r\n1")]}),
        )
    )
    out.append(
        Case(
            "steps: ESC in prompt_group_uid",
            "openai",
            f"{A}/steps",
            orjson.dumps({"steps": [step(prompt_group_uid="g\x1b")]}),
        )
    )
    out.append(
        Case(
            "trajectories: a newline in prompt_group_uid",
            "openai",
            f"{A}/trajectories",
            orjson.dumps({"uid": "h2", "prompt_group_uid": "g\nh"}),
        )
    )
    out.append(Case("groups: CRLF in uid", "openai", f"{A}/groups", orjson.dumps({"uid": "g\r\nX: 1"})))
    out.append(Case("groups: ESC in uid", "openai", f"{A}/groups", orjson.dumps({"uid": "g\x1b"})))
    for uid_name, quoted in (("CRLF", "a%0D%0Ab"), ("ESC", "a%1Bb"), ("tab", "a%09b")):
        out.append(
            Case(
                f"consumers pull: {uid_name} in the consumer name",
                "openai",
                f"{A}/consumers/{quoted}/pull",
                orjson.dumps({"dataset": "hostile-ds"}),
            )
        )
    # MessagePack step batches: bin and ext values outside the packed token arrays
    out += [
        Case("steps msgpack: bin in metadata", "openai", f"{A}/steps", _msgpack_step(b"\x00\x01"), MSGPACK),
        Case(
            "steps msgpack: ext in metadata",
            "openai",
            f"{A}/steps",
            _msgpack_step(msgspec.msgpack.Ext(5, b"x")),
            MSGPACK,
        ),
        Case(
            "steps msgpack: a timestamp in metadata",
            "openai",
            f"{A}/steps",
            msgspec.msgpack.encode(
                {"steps": [step(metadata={"t": msgspec.msgpack.Ext(-1, b"\x00\x00\x00\x00")})]}
            ),
            MSGPACK,
        ),
        Case(
            "steps msgpack: an integer map key in metadata",
            "openai",
            f"{A}/steps",
            _msgpack_step({1: "x"}),
            MSGPACK,
        ),
        Case(
            "steps msgpack: bin in a message",
            "openai",
            f"{A}/steps",
            msgspec.msgpack.encode({"steps": [step(messages=[{"content": b"x"}])]}),
            MSGPACK,
        ),
        Case(
            "steps msgpack: metadata nested 300 deep",
            "openai",
            f"{A}/steps",
            _msgpack_step(orjson.loads(deep_object(300))),
            MSGPACK,
        ),
        Case(
            "steps msgpack: metadata nested 2,000 deep",
            "openai",
            f"{A}/steps",
            b"\x81\xa5steps\x91\x85"
            + msgspec.msgpack.encode("trajectory_uid")
            + msgspec.msgpack.encode("t")
            + msgspec.msgpack.encode("step_index")
            + b"\x00"
            + msgspec.msgpack.encode("prompt_ids")
            + b"\x91\x01"
            + msgspec.msgpack.encode("response_ids")
            + b"\x91\x02"
            + msgspec.msgpack.encode("metadata")
            + b"\x81\xa1a" * 2000
            + b"\x01",
            MSGPACK,
        ),
        Case(
            "steps msgpack: the body nested 5,000 deep",
            "openai",
            f"{A}/steps",
            b"\x91" * 5000 + b"\x90",
            MSGPACK,
        ),
        Case(
            "steps msgpack: CRLF in trajectory_uid",
            "openai",
            f"{A}/steps",
            msgspec.msgpack.encode({"steps": [step(trajectory_uid="a\r\nb")]}),
            MSGPACK,
        ),
        Case("steps msgpack: NaN in metadata", "openai", f"{A}/steps", _msgpack_step(float("nan")), MSGPACK),
    ]
    return out


# --- the Claw-R1 compatibility layer -------------------------------------------------------------------
def r1_step(**changes: Any) -> dict[str, Any]:
    return {"trajectory_uid": "hostile-r1", "prompt_ids": [1, 2], "response_ids": [3], **changes}


def compat_cases() -> list[Case]:
    k = f"{R1}/k/{{key}}"
    out: list[Case] = []
    for what, raw in NESTINGS.items():
        out.append(
            Case(
                f"submit_steps: a step field {what}",
                "openai",
                f"{k}/submit_steps",
                with_raw({"steps": [r1_step(extra=0)]}, "steps.0.extra", raw),
            )
        )
        out.append(
            Case(
                f"init_trajectory: metadata {what}",
                "openai",
                f"{k}/init_trajectory",
                with_raw({"metadata": 0}, "metadata", raw),
            )
        )
        out.append(
            Case(
                f"register_trajectory: metadata {what}",
                "openai",
                f"{k}/register_trajectory",
                with_raw({"trajectory_uid": "r1-reg", "metadata": 0}, "metadata", raw),
            )
        )
    out += [
        Case("submit_steps: the body nested 2,000 deep", "openai", f"{k}/submit_steps", deep_object(2000)),
        Case(
            "submit_steps: steps nested 2,000 deep",
            "openai",
            f"{k}/submit_steps",
            with_raw({"steps": 0}, "steps", deep_array(2000)),
        ),
        Case(
            "submit_steps: NaN reward",
            "openai",
            f"{k}/submit_steps",
            with_raw({"steps": [r1_step(reward=0)]}, "steps.0.reward", b"NaN"),
        ),
        Case(
            "submit_steps: CRLF in trajectory_uid",
            "openai",
            f"{k}/submit_steps",
            orjson.dumps({"steps": [r1_step(trajectory_uid="a\r\nb")]}),
        ),
        Case(
            "submit_steps: NUL in trajectory_uid",
            "openai",
            f"{k}/submit_steps",
            orjson.dumps({"steps": [r1_step(trajectory_uid="a\x00b")]}),
        ),
        Case(
            "submit_steps: ESC in prompt_uid",
            "openai",
            f"{k}/submit_steps",
            orjson.dumps({"steps": [r1_step(prompt_uid="p\x1b")]}),
        ),
        Case(
            "submit_steps: NUL in an extra field",
            "openai",
            f"{k}/submit_steps",
            orjson.dumps({"steps": [r1_step(note="a\x00")]}),
        ),
        Case(
            "init_trajectory: a newline in prompt_uid",
            "openai",
            f"{k}/init_trajectory",
            orjson.dumps({"prompt_uid": "p\nq"}),
        ),
        Case(
            "register_trajectory: CRLF in trajectory_uid",
            "openai",
            f"{k}/register_trajectory",
            orjson.dumps({"trajectory_uid": "a\r\nX-Evil: 1"}),
        ),
        Case(
            "register_trajectory: a blank trajectory_uid",
            "openai",
            f"{k}/register_trajectory",
            orjson.dumps({"trajectory_uid": "  "}),
        ),
        Case(
            "complete_trajectory: CRLF in the path's uid",
            "openai",
            f"{k}/complete_trajectory/a%0D%0Ab",
            b"{}",
        ),
        Case(
            "generate: NUL in the model",
            "openai",
            f"{k}/generate",
            orjson.dumps({"prompt_ids": [1, 2], "sampling_params": {"model": "m\x00"}}),
        ),
        Case("generate: the body nested 1,100 deep", "openai", f"{k}/generate", deep_object(1100)),
        Case(
            "generate: sampling_params nested 300 deep",
            "openai",
            f"{k}/generate",
            with_raw({"prompt_ids": [1], "sampling_params": 0}, "sampling_params", deep_object(300)),
        ),
        Case("compute_reward: the body nested 2,000 deep", "openai", f"{k}/compute_reward", deep_array(2000)),
        Case(
            "scoped chat: CRLF in the path's trajectory",
            "openai",
            f"{R1}/a%0D%0AX-Evil:%201/p/v1/chat/completions",
            orjson.dumps(CHAT),
            headers={"Authorization": "Bearer {key}"},
        ),
        Case(
            "scoped chat: NUL in the path's trajectory",
            "openai",
            f"{R1}/a%00b/p/v1/chat/completions",
            orjson.dumps(CHAT),
            headers={"Authorization": "Bearer {key}"},
        ),
        Case(
            "scoped chat: NUL in the content",
            "openai",
            f"{R1}/r1-ok/p/v1/chat/completions",
            orjson.dumps({**CHAT, "messages": [{"role": "user", "content": "hi\x00"}]}),
            headers={"Authorization": "Bearer {key}"},
        ),
        Case(
            "register_trajectory: CRLF in the base URL's trajectory",
            "openai",
            f"{R1}/a%0D%0Ab/p/v1/register_trajectory",
            b"{}",
            headers={"Authorization": "Bearer {key}"},
        ),
    ]
    return out


CASES: list[Case] = proxy_cases() + rest_cases() + compat_cases()
