"""The OpenAI doors, ``POST /v1/chat/completions`` and ``POST /v1/completions``: the
identity translation. The agent's body goes upstream as it is, plus the fields a step needs
(gateway/proxy/fields.py); the answer comes back as the upstream sent it, minus what the
agent did not ask for; an upstream error is passed through with its body; a stream is
relayed chunk by chunk, ``data: [DONE]`` sent once the step is committed."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from django.http import HttpResponse

from claw_kit.llm import upstream
from claw_kit.web.errors import error_response
from pool.services.api_keys import VerifiedKey

from .. import fields
from ..faults import fault_event
from ..recording import CHAT, COMPLETIONS, Identity
from ..runner import CHAT_SENDER, COMPLETIONS_SENDER, ChatSender, Prepared


class ChatDoor:
    def __init__(self, sender: ChatSender):
        self.sender = sender
        self.protocol = sender.endpoint  # the fault Events name the endpoint

    def error_response(
        self, status: int, message: str, *, code: str | None = None, param: str | None = None
    ) -> HttpResponse:
        return error_response(status, message, code=code, param=param)

    async def prepare(
        self, body: dict[str, Any], ident: Identity, key: VerifiedKey, *, scoped: bool
    ) -> tuple[Prepared, Identity]:
        return Prepared(chat=body, stream=body.get("stream") is True), ident

    def problem(self, prepared: Prepared, answer: Any) -> str | None:
        if not isinstance(answer, dict):
            return "the upstream answered with a body that is not a JSON object"
        return None

    def respond(self, prepared: Prepared, answer: dict[str, Any], resp: httpx.Response) -> HttpResponse:
        a = prepared.ask
        if a is not None and a.strips:  # the answer is parsed already: what the agent did not ask for goes
            fields.strip(answer, a)
            out = orjson.dumps(answer)
        else:
            out = resp.content
        return HttpResponse(out, status=resp.status_code, content_type="application/json")

    async def upstream_error(
        self, status: int, raw: bytes, ident: Identity, key: VerifiedKey
    ) -> HttpResponse:
        await fault_event(
            status,
            "http_error",
            upstream.scrub(raw[:2000].decode(errors="replace")),
            self.protocol,
            ident,
            key,
        )
        return passthrough_error(status, raw)

    def writer(self, prepared: Prepared) -> _Writer:
        return _Writer(prepared.ask)


CHAT_DOOR = ChatDoor(CHAT_SENDER)
COMPLETIONS_DOOR = ChatDoor(COMPLETIONS_SENDER)
assert CHAT_DOOR.protocol == CHAT and COMPLETIONS_DOOR.protocol == COMPLETIONS


class _Writer:
    """The upstream's chunks as they came, minus what the agent did not ask for."""

    __slots__ = ("ask",)

    def __init__(self, ask: fields.Ask | None):
        self.ask = ask if ask is not None and ask.strips else None

    def feed(self, event: dict[str, Any], data: bytes) -> bytes:
        if self.ask is not None:  # each chunk is parsed already: what the agent did not ask for goes
            fields.strip(event, self.ask)
            data = orjson.dumps(event)
        return b"data: " + data + b"\n\n"

    def other(self, data: bytes) -> bytes:
        return b"data: " + data + b"\n\n"

    def broken(self, event: dict[str, Any], data: bytes, message: str) -> bytes:
        return b"data: " + data + b"\n\n"

    def finish(self, answer: dict[str, Any]) -> bytes:
        return b"data: [DONE]\n\n"

    def fail(self, status: int, message: str, code: str) -> bytes:
        return error_event(status, message, code)


def error_event(status: int, message: str, code: str) -> bytes:
    """An OpenAI error as a stream event (the SDKs raise it)."""
    err = orjson.loads(error_response(status, message, code=code).content)
    return b"data: " + orjson.dumps(err) + b"\n\n"


def passthrough_error(status: int, raw: bytes) -> HttpResponse:
    """An upstream error answer: its JSON body as is (scrubbed of the upstream key), or a
    non-JSON body wrapped in OpenAI's error shape."""
    text = upstream.scrub(raw.decode(errors="replace"))
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        return HttpResponse(text.encode(), status=status, content_type="application/json")
    return error_response(status, f"the upstream answered {status}: {text[:1000]}", code="upstream_error")
