"""The OpenAI Responses door: ``POST /v1/responses``.

Translation (Responses -> chat completions):

- ``instructions`` -> a leading system message (not carried over by previous_response_id);
- ``input``: a string -> one user message; items -> messages (role user/assistant/system,
  developer as system; text parts joined, images as image_url parts), ``function_call`` items
  -> ``tool_calls`` of the assistant message they follow (a reply with text and calls comes
  back as one chat message, as the model wrote it), ``function_call_output`` -> ``tool``
  messages; ``reasoning`` items are dropped;
- ``tools`` (flat functions) -> chat functions; ``tool_choice``, ``max_output_tokens``,
  ``temperature``, ``top_p``, ``parallel_tool_calls``, ``text.format`` -> the chat fields.

``previous_response_id`` is resolved from the pool itself: the step a response was recorded
as holds the chat messages it was asked (``messages``) and its reply (``response_text``,
``metadata.tool_calls``), so the gateway rebuilds the conversation and the upstream can be
stateless. A response id names its trajectory (``resp_<nonce><trajectory uid in hex>``): a
call continuing it joins that trajectory unless it names one itself, and a call that names
another trajectory cannot continue it. ``store: false`` is honoured as far as continuation
goes: the step is still recorded (it is a generation like any other), but its id cannot be
continued (404).

Back: a Response object (``output`` message and function_call items, usage from the exact
ids, status ``incomplete`` when max_output_tokens cut it). Streamed: response.created,
response.in_progress, then per item output_item.added, content_part.added /
output_text.delta (or function_call_arguments.delta), their .done events and
output_item.done, and response.completed (response.incomplete) once the step is committed.
"""

from __future__ import annotations

import time
from typing import Any

from django.http import HttpResponse

from claw_kit.web.errors import error_response
from pool.selectors.steps import step_by_response_id
from pool.services.api_keys import VerifiedKey

from ..db import run_db
from ..recording import Identity
from ..runner import door_view
from .base import DoorInputError, Prepared, Translator, first_choice, new_id, sse, token_counts

PROTOCOL = "openai-responses"
_NONCE = 24  # hex characters of a response id's random part


responses = door_view(lambda: DOOR, "``POST /v1/responses`` (streamed or not), recorded as one step.")


class ResponsesDoor(Translator):
    protocol = PROTOCOL

    def error_response(
        self, status: int, message: str, *, code: str | None = None, param: str | None = None
    ) -> HttpResponse:
        return error_response(status, message, code=code, param=param)

    async def translate(
        self, body: dict[str, Any], ident: Identity, key: VerifiedKey, *, scoped: bool
    ) -> tuple[Prepared, Identity]:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise DoorInputError("model is required (a model name)", param="model")
        stream = body.get("stream")
        if stream not in (None, True, False):
            raise DoorInputError("stream must be a boolean", param="stream")
        store = body.get("store", True)
        if store is None:
            store = True
        if not isinstance(store, bool):
            raise DoorInputError("store must be a boolean", param="store")
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise DoorInputError("instructions must be a string", param="instructions")
        messages: list[dict[str, Any]] = []
        if instructions:
            messages.append({"role": "system", "content": instructions})
        previous = body.get("previous_response_id")
        if previous is not None:
            history, ident = await _history(previous, ident, scoped=scoped, sources=key.write_sources)
            messages += history
        messages += _input(body.get("input"))
        if not messages:
            raise DoorInputError("input is required", param="input")
        chat: dict[str, Any] = {"model": model, "messages": messages}
        _options(body, chat)
        reply_id = f"resp_{new_id('')[:_NONCE]}{ident.trajectory_uid.encode().hex()}"
        meta: dict[str, Any] = {
            "protocol": PROTOCOL,
            "response_id": reply_id,
            "store": store,
            "instructions_messages": 1 if instructions else 0,
        }
        if previous is not None:
            meta["previous_response_id"] = previous
        prepared = Prepared(
            chat=chat, stream=stream is True, reply_id=reply_id, model=model, meta=meta, request=body
        )
        return prepared, ident

    def render(self, prepared: Prepared, answer: dict[str, Any]) -> dict[str, Any]:
        choice = first_choice(answer)
        message = choice.get("message") or {}
        output: list[dict[str, Any]] = []
        if message.get("content"):
            output.append(_message_item(prepared, message["content"], "completed"))
        for k, call in enumerate(message.get("tool_calls") or ()):
            fn = call.get("function") or {}
            output.append(
                _call_item(
                    prepared, k, call.get("id"), fn.get("name"), fn.get("arguments") or "", "completed"
                )
            )
        cut = choice.get("finish_reason") == "length"
        out = _skeleton(prepared, "incomplete" if cut else "completed")
        if cut:
            out["incomplete_details"] = {"reason": "max_output_tokens"}
        out["output"] = output
        n_in, n_out = token_counts(answer)
        out["usage"] = {
            "input_tokens": n_in,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": n_out,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": n_in + n_out,
        }
        return out

    def door_writer(self, prepared: Prepared) -> _Writer:
        return _Writer(prepared, self)


DOOR = ResponsesDoor()


def trajectory_of(response_id: str) -> str | None:
    """The trajectory uid a response id names, or None when it is not one of ours."""
    if not response_id.startswith("resp_") or len(response_id) <= 5 + _NONCE:
        return None
    try:
        return bytes.fromhex(response_id[5 + _NONCE :]).decode()
    except (ValueError, UnicodeDecodeError):
        return None


async def _history(
    previous: Any, ident: Identity, *, scoped: bool, sources: frozenset[int] | None
) -> tuple[list[dict[str, Any]], Identity]:
    """The conversation a previous response ended (its messages without its instructions,
    then its reply), and the identity of the call continuing it. A response of another
    source's trajectory (``sources``: the caller's, pool/tenancy.py) is not found."""
    if not isinstance(previous, str) or not previous:
        raise DoorInputError("previous_response_id must be a response id", param="previous_response_id")
    missing = DoorInputError(
        f"previous response {previous!r} not found", param="previous_response_id", status=404
    )
    trajectory = trajectory_of(previous)
    if trajectory is None or (scoped and trajectory != ident.trajectory_uid):
        raise missing
    row = await run_db(step_by_response_id, trajectory_uid=trajectory, response_id=previous, sources=sources)
    if row is None:
        raise missing
    meta = row["metadata"] or {}
    if meta.get("store") is False:
        raise DoorInputError(
            f"previous response {previous!r} was created with store: false; it cannot be continued",
            param="previous_response_id",
            status=404,
        )
    if not scoped:
        ident = Identity(
            trajectory_uid=trajectory,
            prompt_group_uid=ident.prompt_group_uid,
            policy_version=ident.policy_version,
            new=False,
        )
    skip = meta.get("instructions_messages") or 0
    # As an agent replaying the output items would send it (see _input): a reply of calls
    # only has no content (a streamed answer stores its empty text as "").
    reply: dict[str, Any] = {"role": "assistant", "content": row["response_text"]}
    if meta.get("tool_calls"):
        reply["tool_calls"] = meta["tool_calls"]
        reply["content"] = row["response_text"] or None
    return [*(row["messages"] or [])[skip:], reply], ident


# --- request translation ----------------------------------------------------------------------
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})


def _input(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise DoorInputError("input must be a string or an array of items", param="input")
    out: list[dict[str, Any]] = []
    mergeable = False  # the last message is an assistant message made from these items
    for i, item in enumerate(raw):
        at = f"input[{i}]"
        if not isinstance(item, dict):
            raise DoorInputError(f"{at} must be an object", param=at)
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = _ROLES.get(item.get("role"))  # type: ignore[arg-type]
            if role is None:
                raise DoorInputError(
                    f"{at}.role must be user, assistant, system or developer", param=f"{at}.role"
                )
            out.append({"role": role, "content": _content(item.get("content"), role, at)})
            mergeable = role == "assistant"
        elif kind == "function_call":
            call = _call(item, at)
            if mergeable:
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
                mergeable = True
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise DoorInputError(f"{at}.call_id is required", param=f"{at}.call_id")
            output = item.get("output")
            if isinstance(output, list):
                output = _text(output, f"{at}.output")
            if not isinstance(output, str):
                raise DoorInputError(f"{at}.output must be a string", param=f"{at}.output")
            out.append({"role": "tool", "tool_call_id": call_id, "content": output})
            mergeable = False
        elif kind == "reasoning":
            continue
        else:
            raise DoorInputError(f"{at}.type {kind!r} is not supported", param=f"{at}.type")
    return out


def _content(content: Any, role: str, at: str) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise DoorInputError(f"{at}.content must be a string or an array of parts", param=f"{at}.content")
    if role != "user":
        return _text(content, f"{at}.content")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text", part.get("refusal")), str):
            parts.append({"type": "text", "text": part.get("text", part.get("refusal"))})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise DoorInputError(
                f"{at}.content[{j}]: part type {kind!r} is not supported", param=f"{at}.content[{j}]"
            )
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


def _text(parts: list[Any], at: str) -> str:
    pieces = []
    for j, part in enumerate(parts):
        text = part.get("text", part.get("refusal")) if isinstance(part, dict) else None
        if not isinstance(text, str) or part.get("type") not in _TEXT_PARTS:
            raise DoorInputError(f"{at}[{j}] must be a text part", param=f"{at}[{j}]")
        pieces.append(text)
    return "".join(pieces)


def _call(item: dict[str, Any], at: str) -> dict[str, Any]:
    for name in ("call_id", "name", "arguments"):
        if not isinstance(item.get(name), str) or (name != "arguments" and not item[name]):
            raise DoorInputError(f"{at}.{name} must be a string", param=f"{at}.{name}")
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": item["arguments"]},
    }


def _options(body: dict[str, Any], chat: dict[str, Any]) -> None:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise DoorInputError("tools must be an array", param="tools")
        out = []
        for j, tool in enumerate(tools):
            if not isinstance(tool, dict) or tool.get("type") != "function":
                raise DoorInputError(
                    f"tools[{j}]: only function tools are supported", param=f"tools[{j}].type"
                )
            if not isinstance(tool.get("name"), str) or not tool["name"]:
                raise DoorInputError(f"tools[{j}].name is required", param=f"tools[{j}].name")
            fn = {
                "name": tool["name"],
                "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
            }
            if isinstance(tool.get("description"), str):
                fn["description"] = tool["description"]
            if isinstance(tool.get("strict"), bool):
                fn["strict"] = tool["strict"]
            out.append({"type": "function", "function": fn})
        if out:
            chat["tools"] = out
    choice = body.get("tool_choice")
    if choice is not None:
        if choice in ("auto", "none", "required"):
            chat["tool_choice"] = choice
        elif (
            isinstance(choice, dict)
            and choice.get("type") == "function"
            and isinstance(choice.get("name"), str)
        ):
            chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        else:
            raise DoorInputError(
                "tool_choice must be auto, none, required or a function", param="tool_choice"
            )
    limit = body.get("max_output_tokens")
    if limit is not None:
        if type(limit) is not int or limit < 1:
            raise DoorInputError("max_output_tokens must be a positive integer", param="max_output_tokens")
        chat["max_tokens"] = limit
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise DoorInputError(f"{name} must be a number", param=name)
            chat[name] = value
    parallel = body.get("parallel_tool_calls")
    if isinstance(parallel, bool):
        chat["parallel_tool_calls"] = parallel
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        chat["response_format"] = {
            "type": "json_schema",
            "json_schema": {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt},
        }
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    if isinstance(body.get("user"), str):
        chat["user"] = body["user"]


# --- answer translation -----------------------------------------------------------------------
def _skeleton(prepared: Prepared, status: str) -> dict[str, Any]:
    body = prepared.request
    return {
        "id": prepared.reply_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") if isinstance(body.get("metadata"), dict) else {},
        "model": prepared.model,
        "output": [],
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "previous_response_id": body.get("previous_response_id"),
        "store": prepared.meta.get("store", True),
        "temperature": body.get("temperature"),
        "text": {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p"),
        "truncation": "disabled",
        "usage": None,
    }


def _message_item(prepared: Prepared, text: str, status: str) -> dict[str, Any]:
    content = (
        [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]
        if status == "completed"
        else []
    )
    return {
        "id": "msg_" + prepared.reply_id[5 : 5 + _NONCE],
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def _call_item(
    prepared: Prepared, k: int, call_id: Any, name: Any, arguments: str, status: str
) -> dict[str, Any]:
    return {
        "id": f"fc_{prepared.reply_id[5 : 5 + _NONCE]}_{k}",
        "type": "function_call",
        "status": status,
        "call_id": call_id if isinstance(call_id, str) and call_id else f"call_{prepared.reply_id[5:17]}_{k}",
        "name": name or "",
        "arguments": arguments,
    }


class _Writer:
    """Chat chunks -> Responses events, each with its sequence number."""

    def __init__(self, prepared: Prepared, door: ResponsesDoor):
        self.prepared = prepared
        self.door = door
        self.seq = 0
        self.started = False
        self.output_index = -1
        self.open: dict[str, Any] | None = None  # the open item
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}  # upstream tool call index -> its item

    def _event(self, kind: str, **payload: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.seq, **payload}
        self.seq += 1
        return sse(kind, payload)

    def _start(self) -> bytes:
        self.started = True
        head = _skeleton(self.prepared, "in_progress")
        return self._event("response.created", response=head) + self._event(
            "response.in_progress", response=head
        )

    def _close(self) -> bytes:
        item = self.open
        if item is None:
            return b""
        self.open = None
        at = {"item_id": item["id"], "output_index": self.output_index}
        if item["type"] == "message":
            text = "".join(self.text)
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            done = {**item, "status": "completed", "content": [part]}
            return (
                self._event("response.output_text.done", **at, content_index=0, text=text, logprobs=[])
                + self._event("response.content_part.done", **at, content_index=0, part=part)
                + self._event("response.output_item.done", output_index=self.output_index, item=done)
            )
        done = {**item, "status": "completed"}
        return self._event(
            "response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"]
        ) + self._event("response.output_item.done", output_index=self.output_index, item=done)

    def _open(self, item: dict[str, Any]) -> bytes:
        out = self._close()
        self.output_index += 1
        self.open = item
        out += self._event("response.output_item.added", output_index=self.output_index, item=item)
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out += self._event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=self.output_index,
                content_index=0,
                part=part,
            )
        return out

    def feed(self, chunk: dict[str, Any]) -> bytes:
        out = b"" if self.started else self._start()
        for raw in chunk.get("choices") or ():
            if raw.get("index", 0) != 0:
                continue
            delta = raw.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                if self.open is None or self.open["type"] != "message":
                    out += self._open(_message_item(self.prepared, "", "in_progress"))
                self.text.append(text)
                out += self._event(
                    "response.output_text.delta",
                    item_id=self.open["id"],  # type: ignore[index]
                    output_index=self.output_index,
                    content_index=0,
                    delta=text,
                    logprobs=[],
                )
            for piece in delta.get("tool_calls") or ():
                slot = piece.get("index", 0)
                fn = piece.get("function") or {}
                item = self.calls.get(slot)
                if item is None:
                    item = _call_item(self.prepared, slot, piece.get("id"), fn.get("name"), "", "in_progress")
                    self.calls[slot] = item
                    out += self._open(item)
                args = fn.get("arguments")
                if isinstance(args, str) and args:
                    item["arguments"] += args
                    out += self._event(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=self.output_index,
                        delta=args,
                    )
        return out

    def finish(self, answer: dict[str, Any]) -> bytes:
        out = (b"" if self.started else self._start()) + self._close()
        final = self.door.render(self.prepared, answer)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return out + self._event(kind, response=final)

    def fail(self, status: int, message: str) -> bytes:
        kind = "server_error" if status >= 500 else "invalid_request_error"
        error = {"type": kind, "code": kind, "message": message, "param": None}
        # Both the Responses "error" event's flat fields and an "error" object: the SDK raises
        # an APIError for any streamed event carrying "error".
        return self._event("error", code=kind, message=message, param=None, error=error)
