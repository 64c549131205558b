"""The Messages passthrough, a sending strategy of the runner (gateway/proxy/runner.py):
with CLAW_MESSAGES_UPSTREAM_MODE=passthrough a ``POST /v1/messages`` goes to an upstream
that serves the Messages API itself, and its answer (or its event stream, event for event)
goes back to the agent unchanged.

Such answers carry no token ids (vLLM and SGLang return ids only on chat completions), so
the step is built from text: the request's chat form (the Messages door's translation,
which also validates it: a bad field is a 400 naming it, nothing sent) and the reply's,
retokenized by CLAW_TOKENIZER (token_source "retokenized", which may drift from what the
server used), or stored as an ``untokenized_call`` Event when no tokenizer is configured.
The recording path is the chat-completions one (record_answer), as in translate mode;
streamed, the final ``message_stop`` is sent only once the step is committed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
from django.conf import settings
from django.http import HttpRequest

from claw_kit.llm import upstream

from ..envelope import Call
from ..recording import CHAT
from ..runner import Prepared
from .base import sse

MESSAGES_PATH = "/v1/messages"
_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}


class MessagesSender:
    """The agent's own bytes to the upstream's /v1/messages (no field rules: a Messages
    server returns no ids), its answer recorded through its chat form."""

    endpoint = CHAT
    incomplete = "the upstream stream ended without message_stop"

    def headers(self, request: HttpRequest) -> dict[str, str]:
        headers = upstream.forward_headers(request.headers)
        if settings.CLAW_UPSTREAM_API_KEY:
            headers["x-api-key"] = settings.CLAW_UPSTREAM_API_KEY  # an Anthropic-style server's auth
        return headers

    async def send(self, call: Call, prepared: Prepared, headers: dict[str, str]) -> httpx.Response:
        return await upstream.request("POST", MESSAGES_PATH, content=call.request.body, headers=headers)

    async def open(
        self, call: Call, prepared: Prepared, headers: dict[str, str]
    ) -> tuple[httpx.Response, bytes | None]:
        return await upstream.open_stream(MESSAGES_PATH, content=call.request.body, headers=headers), None

    def end(self, data: bytes) -> bool:
        return False

    def stop(self, event: dict[str, Any]) -> bool:
        return event.get("type") == "message_stop"

    def failed(self, event: dict[str, Any]) -> bool:
        return event.get("type") == "error"

    def accumulator(self) -> _MessageAccumulator:
        return _MessageAccumulator()

    def recorded(
        self, prepared: Prepared, answer: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        return chat_answer(answer), {**prepared.meta, "response_id": answer.get("id")}


MESSAGES = MessagesSender()


def problem(answer: Any) -> str | None:
    """Why an upstream's answer is no Messages answer (None when it is one)."""
    if not isinstance(answer, dict) or answer.get("type") != "message":
        return "the upstream answered with a body that is not a Messages answer"
    return None


class Writer:
    """Each upstream event relayed as it came; ``message_stop`` once the step is committed;
    failures as the door's ``error`` event (``error_event(status, message)``)."""

    __slots__ = ("error_event",)

    def __init__(self, error_event: Callable[[int, str], bytes]):
        self.error_event = error_event

    def feed(self, event: dict[str, Any], data: bytes) -> bytes:
        return sse(str(event.get("type")), event)

    def other(self, data: bytes) -> bytes:
        return b""

    def broken(self, event: dict[str, Any], data: bytes, message: str) -> bytes:
        return sse("error", event)

    def finish(self, answer: dict[str, Any]) -> bytes:
        return sse("message_stop", {"type": "message_stop"})

    def fail(self, status: int, message: str, code: str) -> bytes:
        return self.error_event(status, message)


def chat_answer(message: dict[str, Any]) -> dict[str, Any]:
    """A Messages answer in the shape of a chat completion (no token ids), for recording."""
    text, calls = [], []
    for block in message.get("content") or ():
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            text.append(block.get("text") or "")
        elif block.get("type") == "tool_use":
            args = block.get("input")
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {
                        "name": block.get("name"),
                        "arguments": args
                        if isinstance(args, str)
                        else json.dumps(args or {}, ensure_ascii=False),
                    },
                }
            )
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text else None}
    if calls:
        reply["tool_calls"] = calls
    usage = message.get("usage") or {}
    return {
        "id": message.get("id"),
        "model": message.get("model"),
        "choices": [
            {"index": 0, "message": reply, "finish_reason": _FINISH.get(message.get("stop_reason") or "")}
        ],
        "usage": {
            "prompt_tokens": usage.get("input_tokens"),
            "completion_tokens": usage.get("output_tokens"),
        },
    }


class _MessageAccumulator:
    """Anthropic stream events -> the whole message."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.blocks: dict[int, dict[str, Any]] = {}
        self.json: dict[int, list[str]] = {}

    def add(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            self.head = dict(event.get("message") or {})
        elif kind == "content_block_start":
            self.blocks[event.get("index", 0)] = dict(event.get("content_block") or {})
        elif kind == "content_block_delta":
            i, delta = event.get("index", 0), event.get("delta") or {}
            block = self.blocks.setdefault(i, {"type": "text", "text": ""})
            if delta.get("type") == "text_delta":
                block["text"] = (block.get("text") or "") + (delta.get("text") or "")
            elif delta.get("type") == "input_json_delta":
                self.json.setdefault(i, []).append(delta.get("partial_json") or "")
        elif kind == "message_delta":
            self.head.update(event.get("delta") or {})
            usage = dict(self.head.get("usage") or {})
            usage.update(event.get("usage") or {})
            self.head["usage"] = usage

    def answer(self) -> dict[str, Any]:
        out = dict(self.head)
        content = []
        for i in sorted(self.blocks):
            block = dict(self.blocks[i])
            if block.get("type") == "tool_use" and i in self.json:
                block["input"] = "".join(self.json[i])  # the model's own string, kept as is
            content.append(block)
        out["content"] = content
        return out
