"""What the translating doors (Messages, Responses) share: :class:`Translator`, the part of a
door the runner (gateway/proxy/runner.py) asks of it besides the translation itself, and
small helpers for their answers.

A translating door sends the chat completion its call means to the upstream's
``/v1/chat/completions`` (asking for the usage in streams), takes an answer without
``choices`` for no answer, passes an upstream 4xx/5xx on as an error in its own shape with
the upstream's message, and turns the chat chunks into its own stream events (its writer's
``feed(chunk)`` / ``finish(answer)`` / ``fail(status, message)``).
"""

from __future__ import annotations

import os
from typing import Any, Protocol

import httpx
import orjson
from django.http import HttpResponse

from claw_kit.llm import upstream
from claw_kit.web.errors import HttpError
from pool.services.api_keys import VerifiedKey

from ..errors import DoorInputError
from ..faults import fault_event
from ..recording import Identity
from ..runner import CHAT_SENDER, Prepared, Sender

__all__ = ["DoorInputError", "Prepared", "Translator", "first_choice", "new_id", "sse", "token_counts"]

_STREAM = {"stream": True, "stream_options": {"include_usage": True}}


class DoorWriter(Protocol):
    """Turns the upstream's chat chunks into the door's stream events (SSE bytes)."""

    def feed(self, chunk: dict[str, Any]) -> bytes: ...

    def finish(self, answer: dict[str, Any]) -> bytes: ...

    def fail(self, status: int, message: str) -> bytes: ...


class Translator:
    """A door that translates to and from chat completions; subclasses define
    ``protocol``, ``error_response``, ``translate``, ``render`` and ``door_writer``."""

    protocol: str
    sender: Sender = CHAT_SENDER

    async def translate(
        self, body: dict[str, Any], ident: Identity, key: VerifiedKey, *, scoped: bool
    ) -> tuple[Prepared, Identity]:
        raise NotImplementedError

    def render(self, prepared: Prepared, answer: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def door_writer(self, prepared: Prepared) -> DoorWriter:
        raise NotImplementedError

    async def prepare(
        self, body: dict[str, Any], ident: Identity, key: VerifiedKey, *, scoped: bool
    ) -> tuple[Prepared, Identity]:
        prepared, ident = await self.translate(body, ident, key, scoped=scoped)
        if prepared.stream and prepared.sender is None:
            prepared.also = _STREAM
        return prepared, ident

    def problem(self, prepared: Prepared, answer: Any) -> str | None:
        if not isinstance(answer, dict) or not answer.get("choices"):
            return "the upstream answered with a body that is not a chat completion"
        return None

    def respond(self, prepared: Prepared, answer: dict[str, Any], resp: httpx.Response) -> HttpResponse:
        return HttpResponse(orjson.dumps(self.render(prepared, answer)), content_type="application/json")

    async def upstream_error(
        self, status: int, raw: bytes, ident: Identity, key: VerifiedKey
    ) -> HttpResponse:
        """An upstream 4xx/5xx, raised as a HttpError with the upstream's message (stored as
        an Event)."""
        text = upstream.scrub(raw[:2000].decode(errors="replace"))
        await fault_event(status, "http_error", text, self.protocol, ident, key)
        message = text
        try:
            parsed = orjson.loads(text)
        except orjson.JSONDecodeError:
            parsed = None
        if isinstance(parsed, dict):
            err = parsed.get("error")
            inner = err.get("message") if isinstance(err, dict) else err if isinstance(err, str) else None
            message = inner if isinstance(inner, str) else parsed.get("message") or text
        raise HttpError(status, f"the upstream answered {status}: {message}"[:1000], code="upstream_error")

    def writer(self, prepared: Prepared) -> _Translated:
        return _Translated(self.door_writer(prepared))


class _Translated:
    """A door's writer as the runner drives it."""

    __slots__ = ("w",)

    def __init__(self, w: DoorWriter):
        self.w = w

    def feed(self, event: dict[str, Any], data: bytes) -> bytes:
        return self.w.feed(event)

    def other(self, data: bytes) -> bytes:
        return b""

    def broken(self, event: dict[str, Any], data: bytes, message: str) -> bytes:
        return self.w.fail(502, f"the upstream stream failed: {message}")

    def finish(self, answer: dict[str, Any]) -> bytes:
        return self.w.finish(answer)

    def fail(self, status: int, message: str, code: str) -> bytes:
        return self.w.fail(status, message)


# --- helpers shared by the doors ----------------------------------------------------------------
def new_id(prefix: str) -> str:
    """A fresh reply id (``msg_...``, ``resp_...``): 96 random bits."""
    return prefix + os.urandom(12).hex()


def sse(event: str, payload: dict[str, Any]) -> bytes:
    """One named SSE frame (both SDKs read the ``event:`` line)."""
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def first_choice(answer: dict[str, Any]) -> dict[str, Any]:
    """Choice 0 of a chat answer (doors ask for one)."""
    choices = answer.get("choices") or [{}]
    return min(choices, key=lambda c: c.get("index", 0))


def token_counts(answer: dict[str, Any]) -> tuple[int, int]:
    """(input tokens, output tokens) of a chat answer: its exact ids where it has them, else
    its usage."""
    choice = first_choice(answer)
    prompt = answer.get("prompt_token_ids") or choice.get("prompt_token_ids")
    ids = choice.get("token_ids")
    usage = answer.get("usage") or {}
    n_in = len(prompt) if isinstance(prompt, list) else int(usage.get("prompt_tokens") or 0)
    n_out = len(ids) if isinstance(ids, list) else int(usage.get("completion_tokens") or 0)
    return n_in, n_out
