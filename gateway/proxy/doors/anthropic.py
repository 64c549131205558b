"""The Anthropic Messages door: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Translation (Messages -> chat completions):

- ``system`` (a string or text blocks) -> a leading system message;
- user text/image blocks -> a user message (one text block: a string content; more: parts);
  ``tool_result`` blocks -> ``tool`` messages (before the user's remaining text, as Anthropic
  orders them); assistant text + ``tool_use`` blocks -> one assistant message with
  ``tool_calls``; ``thinking`` blocks are dropped (a chat template renders no such field);
- ``tools`` {name, description, input_schema} -> functions; ``tool_choice`` auto/any/none/tool
  -> auto/required/none/the named function; ``disable_parallel_tool_use`` -> parallel_tool_calls;
- ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop_sequences`` -> the chat fields.

Back: text and tool_use content blocks, stop_reason end_turn / max_tokens / tool_use /
stop_sequence (from vLLM's ``stop_reason`` naming the matched string), usage in tokens
counted from the exact ids, an id ``msg_...``. Streamed: message_start, per block
content_block_start / content_block_delta (text_delta, input_json_delta) / content_block_stop,
then message_delta (stop_reason, usage) and message_stop once the step is committed.

Tool-call arguments: a chat model writes them as a string, Anthropic carries them as an
object, and re-serialising an object need not give the model's bytes back (key order,
spaces), which would make the next prompt's ids drift. The door keeps the string of each
tool call it answered (per process, bounded) and sends it back verbatim when the agent
returns the same call with the same input; otherwise it serialises the input as
``json.dumps`` does.

With CLAW_MESSAGES_UPSTREAM_MODE=passthrough the call goes instead to an upstream serving
/v1/messages itself and its steps are retokenized (gateway/proxy/doors/passthrough.py).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import orjson
from cachetools import LRUCache
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase

from claw_kit.llm import tokenizer, upstream
from claw_kit.web.errors import HttpError
from pool.services.api_keys import VerifiedKey

from ..envelope import Call, receive
from ..recording import Identity
from ..runner import Door, Prepared, Route, door_view, route_view
from . import passthrough
from .base import DoorInputError, Translator, first_choice, new_id, sse, token_counts

PROTOCOL = "anthropic-messages"

# Anthropic's error types by status (docs.anthropic.com, "Errors").
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
}


def _messages_door() -> Door:
    """The Messages door the settings choose, read per call (tests switch it)."""
    return PASSTHROUGH if settings.CLAW_MESSAGES_UPSTREAM_MODE == "passthrough" else DOOR


messages = door_view(_messages_door, "``POST /v1/messages`` (streamed or not), recorded as one step.")


async def _count_tokens(request: HttpRequest, route: Route) -> HttpResponseBase:

    async def handle(call: Call) -> HttpResponse:
        chat = to_chat(call.body(), counting=True)
        return HttpResponse(
            orjson.dumps({"input_tokens": await _count(request, chat)}), content_type="application/json"
        )

    return await receive(
        request,
        handle,
        errors=DOOR.error_response,
        path_trajectory=route.trajectory_uid,
        path_group=route.prompt_group_uid,
        api_key=route.api_key,
        capability=route.capability,
        name_minted=False,
    )


count_tokens = route_view(
    _count_tokens,
    '``POST /v1/messages/count_tokens`` -> ``{"input_tokens": n}``: the translated prompt counted by '
    "the upstream's /tokenize (vLLM), else by CLAW_TOKENIZER, else 501. Nothing is recorded.",
)


async def _count(request: HttpRequest, chat: dict[str, Any]) -> int:
    body = {"model": chat["model"], "messages": chat["messages"], "add_generation_prompt": True}
    if chat.get("tools"):
        body["tools"] = chat["tools"]
    headers = upstream.forward_headers(request.headers)
    try:
        resp = await upstream.request("POST", "/tokenize", content=orjson.dumps(body), headers=headers)
    except upstream.UpstreamFault as f:
        if f.kind == "not_configured":
            resp = None
        else:
            raise HttpError(f.status, f.message, code=f.kind) from None
    if resp is not None and resp.status_code == 200:
        try:
            counted = orjson.loads(resp.content)
        except orjson.JSONDecodeError:
            counted = None
        if isinstance(counted, dict) and isinstance(counted.get("count"), int):
            return counted["count"]
    tok = tokenizer.get_tokenizer()
    if tok is None:
        raise HttpError(
            501,
            "tokens cannot be counted: the upstream has no /tokenize endpoint and no local "
            "tokenizer is configured (CLAW_TOKENIZER)",
            code="not_implemented",
        )
    ids = tok.apply_chat_template(
        chat["messages"], tools=chat.get("tools") or None, add_generation_prompt=True, tokenize=True
    )
    return len(ids["input_ids"] if isinstance(ids, dict) else ids)


# --- the door ---------------------------------------------------------------------------------
class AnthropicDoor(Translator):
    protocol = PROTOCOL

    def error_response(
        self, status: int, message: str, *, code: str | None = None, param: str | None = None
    ) -> HttpResponse:
        """Anthropic's error shape; the field at fault, if any, named in the message."""
        text = f"{param}: {message}" if param and not message.startswith(param) else message
        response = HttpResponse(
            orjson.dumps(error_body(status, text)), status=status, content_type="application/json"
        )
        if status == 401:
            response["WWW-Authenticate"] = 'Bearer realm="claw"'
        return response

    async def translate(
        self, body: dict[str, Any], ident: Identity, key: VerifiedKey, *, scoped: bool
    ) -> tuple[Prepared, Identity]:
        chat = to_chat(body)
        stream = body.get("stream")
        if stream not in (None, True, False):
            raise DoorInputError("must be a boolean", param="stream")
        reply_id = new_id("msg_")
        meta = {"protocol": PROTOCOL, "response_id": reply_id}
        return (
            Prepared(
                chat=chat,
                stream=stream is True,
                reply_id=reply_id,
                model=chat["model"],
                meta=meta,
                request=body,
            ),
            ident,
        )

    def render(self, prepared: Prepared, answer: dict[str, Any]) -> dict[str, Any]:
        choice = first_choice(answer)
        message = choice.get("message") or {}
        content: list[dict[str, Any]] = []
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or ():
            content.append(_tool_use(call))
        stop_reason, stop_sequence = _stop(choice, prepared.request)
        n_in, n_out = token_counts(answer)
        return {
            "id": prepared.reply_id,
            "type": "message",
            "role": "assistant",
            "model": prepared.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": {"input_tokens": n_in, "output_tokens": n_out},
        }

    def door_writer(self, prepared: Prepared) -> _Writer:
        return _Writer(prepared)


class PassthroughDoor(AnthropicDoor):
    """The Messages door with CLAW_MESSAGES_UPSTREAM_MODE=passthrough: the call is only
    translated to be recorded, and goes upstream by the Messages passthrough
    (doors/passthrough.py)."""

    async def translate(
        self, body: dict[str, Any], ident: Identity, key: VerifiedKey, *, scoped: bool
    ) -> tuple[Prepared, Identity]:
        meta = {"protocol": PROTOCOL, "upstream_mode": "passthrough"}
        chat = to_chat(body)
        prepared = Prepared(
            chat=chat, stream=body.get("stream") is True, meta=meta, request=body, sender=passthrough.MESSAGES
        )
        return prepared, ident

    def problem(self, prepared: Prepared, answer: Any) -> str | None:
        return passthrough.problem(answer)

    def respond(self, prepared: Prepared, answer: dict[str, Any], resp: httpx.Response) -> HttpResponse:
        return HttpResponse(resp.content, content_type="application/json")

    def writer(self, prepared: Prepared) -> passthrough.Writer:  # type: ignore[override]
        return passthrough.Writer(_error_event)


def _error_event(status: int, message: str) -> bytes:
    return sse("error", error_body(status, message))


DOOR = AnthropicDoor()
PASSTHROUGH = PassthroughDoor()


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


class _Writer:
    """Chat chunks -> Anthropic events. Blocks are numbered as they open: a text block when
    the first text arrives, one tool_use block per tool call (a new call closes the open
    block)."""

    __slots__ = ("prepared", "started", "index", "open_kind", "tool_slots")

    def __init__(self, prepared: Prepared):
        self.prepared = prepared
        self.started = False
        self.index = -1  # the open block's index
        self.open_kind: str | None = None  # "text", "tool" or None
        self.tool_slots: dict[int, int] = {}  # upstream tool call index -> block index

    def _start(self, chunk: dict[str, Any]) -> bytes:
        self.started = True
        prompt = chunk.get("prompt_token_ids")
        if prompt is None:
            prompt = next(
                (c.get("prompt_token_ids") for c in chunk.get("choices") or () if c.get("prompt_token_ids")),
                None,
            )
        message: dict[str, Any] = {
            "id": self.prepared.reply_id,
            "type": "message",
            "role": "assistant",
            "model": self.prepared.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": len(prompt) if isinstance(prompt, list) else 0, "output_tokens": 0},
        }
        return sse("message_start", {"type": "message_start", "message": message})

    def _close(self) -> bytes:
        if self.open_kind is None:
            return b""
        self.open_kind = None
        return sse("content_block_stop", {"type": "content_block_stop", "index": self.index})

    def _open(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close()
        self.index += 1
        self.open_kind = kind
        return out + sse(
            "content_block_start",
            {"type": "content_block_start", "index": self.index, "content_block": block},
        )

    def feed(self, chunk: dict[str, Any]) -> bytes:
        out = b"" if self.started else self._start(chunk)
        for raw in chunk.get("choices") or ():
            if raw.get("index", 0) != 0:
                continue
            delta = raw.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                if self.open_kind != "text":
                    out += self._open("text", {"type": "text", "text": ""})
                out += sse(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": self.index,
                        "delta": {"type": "text_delta", "text": text},
                    },
                )
            for piece in delta.get("tool_calls") or ():
                slot = piece.get("index", 0)
                fn = piece.get("function") or {}
                if slot not in self.tool_slots:
                    block: dict[str, Any] = {
                        "type": "tool_use",
                        "id": piece.get("id") or new_id("toolu_"),
                        "name": fn.get("name") or "",
                        "input": {},
                    }
                    out += self._open("tool", block)
                    self.tool_slots[slot] = self.index
                args = fn.get("arguments")
                if isinstance(args, str) and args:
                    out += sse(
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": self.tool_slots[slot],
                            "delta": {"type": "input_json_delta", "partial_json": args},
                        },
                    )
        return out

    def finish(self, answer: dict[str, Any]) -> bytes:
        out = b"" if self.started else self._start(answer)
        out += self._close()
        choice = first_choice(answer)
        for call in (choice.get("message") or {}).get("tool_calls") or ():
            _remember_arguments(call)
        stop_reason, stop_sequence = _stop(choice, self.prepared.request)
        n_in, n_out = token_counts(answer)
        out += sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                "usage": {"input_tokens": n_in, "output_tokens": n_out},
            },
        )
        return out + sse("message_stop", {"type": "message_stop"})

    def fail(self, status: int, message: str) -> bytes:
        return sse("error", error_body(status, message))


# --- request translation ----------------------------------------------------------------------
def to_chat(body: dict[str, Any], *, counting: bool = False) -> dict[str, Any]:
    """The chat completion body of a Messages request; DoorInputError names a bad field."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise DoorInputError("is required (a model name)", param="model")
    chat: dict[str, Any] = {"model": model}
    if not counting:
        max_tokens = body.get("max_tokens")
        if type(max_tokens) is not int or max_tokens < 1:
            raise DoorInputError("is required (a positive integer)", param="max_tokens")
        chat["max_tokens"] = max_tokens
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": _system_text(system)})
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise DoorInputError("must be a non-empty array of messages", param="messages")
    for i, m in enumerate(raw):
        out += _message(m, f"messages.{i}")
    chat["messages"] = out
    tools = body.get("tools")
    if tools is not None:
        chat["tools"] = _tools(tools)
    choice = body.get("tool_choice")
    if choice is not None:
        _tool_choice(choice, chat)
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise DoorInputError("must be an array of non-empty strings", param="stop_sequences")
        if stops:
            chat["stop"] = stops
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise DoorInputError("must be a number", param=name)
            chat[name] = value
    top_k = body.get("top_k")
    if top_k is not None:
        if type(top_k) is not int or top_k < 0:
            raise DoorInputError("must be a non-negative integer", param="top_k")
        chat["top_k"] = top_k
    user = (body.get("metadata") or {}).get("user_id") if isinstance(body.get("metadata"), dict) else None
    if isinstance(user, str):
        chat["user"] = user
    return chat


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        parts = []
        for j, block in enumerate(system):
            if (
                not isinstance(block, dict)
                or block.get("type") != "text"
                or not isinstance(block.get("text"), str)
            ):
                raise DoorInputError("must be a text block", param=f"system.{j}")
            parts.append(block["text"])
        return "\n".join(parts)
    raise DoorInputError("must be a string or an array of text blocks", param="system")


def _message(m: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(m, dict):
        raise DoorInputError("must be an object", param=where)
    role = m.get("role")
    if role not in ("user", "assistant"):
        raise DoorInputError("must be 'user' or 'assistant'", param=f"{where}.role")
    content = m.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise DoorInputError("must be a string or an array of content blocks", param=f"{where}.content")
    parts: list[dict[str, Any]] = []
    tool_messages: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.content.{j}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise DoorInputError("must be a string", param=f"{at}.text")
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and role == "user":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"), at)}})
        elif kind == "tool_result" and role == "user":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise DoorInputError("is required", param=f"{at}.tool_use_id")
            tool_messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": _result_text(block, at)}
            )
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_call(block, at))
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue
        else:
            raise DoorInputError(
                f"block type {kind!r} is not supported in a {role} message", param=f"{at}.type"
            )
    out = list(tool_messages)
    if role == "assistant":
        text = "".join(p["text"] for p in parts)
        reply: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
        if calls:
            reply["tool_calls"] = calls
        out.append(reply)
    elif parts:
        single = len(parts) == 1 and parts[0]["type"] == "text"
        out.append({"role": "user", "content": parts[0]["text"] if single else parts})
    elif not tool_messages:
        out.append({"role": "user", "content": ""})
    return out


def _image_url(source: Any, at: str) -> str:
    if isinstance(source, dict):
        if source.get("type") == "base64" and isinstance(source.get("data"), str):
            return f"data:{source.get('media_type') or 'image/png'};base64,{source['data']}"
        if source.get("type") == "url" and isinstance(source.get("url"), str):
            return source["url"]
    raise DoorInputError("must be a base64 or url image source", param=f"{at}.source")


def _result_text(block: dict[str, Any], at: str) -> str:
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        pieces = []
        for k, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise DoorInputError(
                    "only text blocks are supported in a tool result", param=f"{at}.content.{k}"
                )
            pieces.append(part["text"])
        text = "".join(pieces)
    else:
        raise DoorInputError("must be a string or an array of text blocks", param=f"{at}.content")
    return f"Error: {text}" if block.get("is_error") is True else text


def _tool_call(block: dict[str, Any], at: str) -> dict[str, Any]:
    call_id, name, args = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not call_id:
        raise DoorInputError("is required", param=f"{at}.id")
    if not isinstance(name, str) or not name:
        raise DoorInputError("is required", param=f"{at}.name")
    if not isinstance(args, dict):
        raise DoorInputError("must be an object", param=f"{at}.input")
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": _arguments(call_id, args)},
    }


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise DoorInputError("must be an array", param="tools")
    out = []
    for j, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise DoorInputError("must be an object", param=f"tools.{j}")
        if tool.get("type") not in (None, "custom"):
            raise DoorInputError(
                f"server tool {tool.get('type')!r} is not supported (client tools only)",
                param=f"tools.{j}.type",
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise DoorInputError("is required", param=f"tools.{j}.name")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise DoorInputError("must be a JSON schema object", param=f"tools.{j}.input_schema")
        fn: dict[str, Any] = {"name": name, "parameters": schema}
        if isinstance(tool.get("description"), str):
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise DoorInputError("is required", param="tool_choice.name")
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise DoorInputError("must be {type: auto|any|none|tool}", param="tool_choice")
    if choice.get("disable_parallel_tool_use") is True:
        chat["parallel_tool_calls"] = False


# --- answer translation -----------------------------------------------------------------------
def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    _remember_arguments(call)
    fn = call.get("function") or {}
    return {
        "type": "tool_use",
        "id": call.get("id") or new_id("toolu_"),
        "name": fn.get("name") or "",
        "input": _parse_arguments(fn.get("arguments")),
    }


def _parse_arguments(raw: Any) -> dict[str, Any]:
    try:
        value = orjson.loads(raw) if isinstance(raw, str) and raw else {}
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _stop(choice: dict[str, Any], request: dict[str, Any]) -> tuple[str | None, str | None]:
    reason = choice.get("finish_reason")
    matched = choice.get("stop_reason")  # vLLM: the stop string that ended the text, if any
    if reason == "stop" and isinstance(matched, str) and matched in (request.get("stop_sequences") or ()):
        return "stop_sequence", matched
    if (choice.get("message") or {}).get("tool_calls") and reason in (None, "stop", "tool_calls"):
        return "tool_use", None
    return _STOP_REASONS.get(reason or "stop", "end_turn"), None


# --- tool-call argument strings (see the module docstring) -----------------------------------
_ARGS_MAX = 65_536
_args_lock = threading.Lock()
_args: LRUCache[str, str] = LRUCache(maxsize=_ARGS_MAX)


def _remember_arguments(call: dict[str, Any]) -> None:
    call_id = call.get("id")
    raw = (call.get("function") or {}).get("arguments")
    if isinstance(call_id, str) and isinstance(raw, str):
        with _args_lock:
            _args[call_id] = raw


def _arguments(call_id: str, value: dict[str, Any]) -> str:
    with _args_lock:
        raw = _args.get(call_id)
    if raw is not None and _parse_arguments(raw) == value:
        return raw
    return json.dumps(value, ensure_ascii=False)
