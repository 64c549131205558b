"""``POST /v1/messages`` with CLAW_MESSAGES_UPSTREAM_MODE=passthrough: the call goes to an
upstream that serves the Messages API itself, and its answer (or its event stream, event
for event) goes back to the agent unchanged.

Such answers carry no token ids (vLLM and SGLang return ids only on chat completions), so
the step is built from text: the request's chat form (anthropic.to_chat, which also
validates it: a bad field is a 400 naming it, nothing sent) and the reply's, retokenized by
CLAW_TOKENIZER (token_source "retokenized", which may drift from what the server used), or
stored as an ``untokenized_call`` Event when no tokenizer is configured. The recording path
is the chat-completions one (record_answer), as in translate mode; streamed, the final
``message_stop`` is sent only once the step is committed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
from django.conf import settings
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase

from pool.errors import PoolError
from pool.services.api_keys import VerifiedKey

from .. import upstream
from ..errors import ProxyError
from ..fields import read_closed
from ..recording import CHAT, Identity
from ..stream import sse_data
from ..views import _record, fault_event, invalid_answer, upstream_fault
from .base import _upstream_error, answer, sse

MESSAGES_PATH = "/v1/messages"
_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}


async def serve_passthrough(
    door: Any,
    request: HttpRequest,
    path_trajectory: str | None,
    path_group: str | None,
    api_key: str | None,
    capability: str | None,
) -> HttpResponseBase:
    """Forward one Messages call as it is and record it (see the module docstring)."""
    from .anthropic import PROTOCOL, to_chat

    async def handle(
        body: dict[str, Any], ident: Identity, key: VerifiedKey
    ) -> tuple[HttpResponseBase, Identity]:
        chat = to_chat(body)
        headers = upstream.forward_headers(request.headers)
        if settings.CLAW_UPSTREAM_API_KEY:
            headers["x-api-key"] = settings.CLAW_UPSTREAM_API_KEY  # an Anthropic-style server's auth
        extra = {"protocol": PROTOCOL, "upstream_mode": "passthrough"}
        send = _stream if body.get("stream") is True else _once
        return await send(door, request.body, headers, ident, key, chat, extra), ident

    return await answer(door, request, path_trajectory, path_group, api_key, capability, handle)


async def _once(
    door: Any,
    raw: bytes,
    headers: dict[str, str],
    ident: Identity,
    key: VerifiedKey,
    chat: dict[str, Any],
    extra: dict[str, Any],
) -> HttpResponse:
    try:
        resp = await upstream.request("POST", MESSAGES_PATH, content=raw, headers=headers)
    except upstream.UpstreamFault as f:
        raise await upstream_fault(f, door.protocol, ident, key) from None
    if resp.status_code >= 400:
        raise await _upstream_error(door, resp.status_code, resp.content, ident, key)
    try:
        message = orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        message = None
    if not isinstance(message, dict) or message.get("type") != "message":
        msg = "the upstream answered with a body that is not a Messages answer"
        raise await invalid_answer(msg, door.protocol, ident, key)
    outcome = await _record(
        CHAT, ident, key, chat, chat_answer(message), extra={**extra, "response_id": message.get("id")}
    )
    response = HttpResponse(resp.content, content_type="application/json")
    if outcome.steps:
        response["X-Claw-Steps"] = ",".join(s.uid for s in outcome.steps)
    return response


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


async def _stream(
    door: Any,
    raw: bytes,
    headers: dict[str, str],
    ident: Identity,
    key: VerifiedKey,
    chat: dict[str, Any],
    extra: dict[str, Any],
) -> HttpResponseBase:
    try:
        resp = await upstream.open_stream(MESSAGES_PATH, content=raw, headers=headers)
    except upstream.UpstreamFault as f:
        raise await upstream_fault(f, door.protocol, ident, key) from None
    if resp.status_code >= 400:
        raise await _upstream_error(door, resp.status_code, await read_closed(resp), ident, key)
    if "text/event-stream" not in resp.headers.get("content-type", ""):
        await resp.aclose()
        msg = "the upstream did not answer the stream request with an event stream"
        raise await invalid_answer(msg, door.protocol, ident, key)
    response = StreamingHttpResponse(
        _relay(door, resp, ident, key, chat, extra), content_type="text/event-stream; charset=utf-8"
    )
    response["Cache-Control"] = "no-cache"
    return response


async def _relay(
    door: Any,
    resp: httpx.Response,
    ident: Identity,
    key: VerifiedKey,
    chat: dict[str, Any],
    extra: dict[str, Any],
) -> AsyncIterator[bytes]:
    """Relay each event as it arrives while rebuilding the message; ``message_stop`` is held
    back until the step is committed."""
    from .anthropic import error_body

    acc = _MessageAccumulator()
    stopped = False
    try:
        async for data in sse_data(resp.aiter_raw()):
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(event, dict):
                continue
            kind = event.get("type")
            if kind == "error":
                msg = upstream.scrub(data[:2000].decode(errors="replace"))
                await fault_event(502, "stream_error", msg, door.protocol, ident, key)
                yield sse("error", event)
                return
            if kind == "message_stop":
                stopped = True
                break
            acc.add(event)
            yield sse(str(kind), event)
    except httpx.HTTPError as exc:
        f = upstream.fault(exc)
        await fault_event(f.status, f.kind, f.message, door.protocol, ident, key)
        yield sse("error", error_body(f.status, f.message))
        return
    finally:
        await resp.aclose()
    if not stopped:
        msg = "the upstream stream ended without message_stop"
        await fault_event(502, "stream_incomplete", msg, door.protocol, ident, key)
        yield sse("error", error_body(502, msg))
        return
    message = acc.message()
    try:
        await _record(
            CHAT, ident, key, chat, chat_answer(message), extra={**extra, "response_id": message.get("id")}
        )
    except (PoolError, ProxyError) as e:
        status = e.status_code if isinstance(e, PoolError) else e.status
        yield sse("error", error_body(status, e.message))
        return
    yield sse("message_stop", {"type": "message_stop"})


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

    def message(self) -> dict[str, Any]:
        out = dict(self.head)
        content = []
        for i in sorted(self.blocks):
            block = dict(self.blocks[i])
            if block.get("type") == "tool_use" and i in self.json:
                block["input"] = "".join(self.json[i])  # the model's own string, kept as is
            content.append(block)
        out["content"] = content
        return out
