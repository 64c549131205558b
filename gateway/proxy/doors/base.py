"""The door runner: one call through a door, from the agent's request to its answer.

Per call (the same steps as gateway/proxy/views.py, in the door's own shapes):

1. the credential is checked (Bearer or ``x-api-key``, or a capability URL's token);
2. the trajectory comes from the path, X-Claw-Trajectory, the door (a Responses
   ``previous_response_id`` names its own), else it is minted; X-Claw-Trajectory answers it;
3. the door translates the body into a chat completion (a bad field: 400 naming it,
   nothing sent, nothing written), which goes upstream asking for the exact token ids and
   the sampled tokens' logprobs (gateway/proxy/fields.py);
4. the answer is recorded by the chat-completions recording path (record_answer ->
   pool.ingest.steps_append), committed, and only then translated back and returned (streamed:
   the door's final events are sent after the commit).

Faults (refused, timeout, an upstream 4xx/5xx, a broken stream) are stored as Events of type
``upstream_error`` as for chat completions and answered in the door's error shape; no step
is written.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
import orjson
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase

from pool.errors import PoolError
from pool.services.api_keys import VerifiedKey

from .. import fields, upstream
from ..access import authorise
from ..errors import ProxyError
from ..recording import CHAT, Identity
from ..stream import StreamAccumulator, sse_data
from ..views import (
    TRAJECTORY_HEADER,
    _identity,
    _json_body,
    _record,
    fault_event,
    invalid_answer,
    upstream_fault,
)

CHAT_PATH = "/v1/chat/completions"


class DoorInputError(Exception):
    """A request field the door cannot translate: answered 400 naming ``param``."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


@dataclass(slots=True)
class Prepared:
    """A door request translated: the chat body to send, and what the answer needs back."""

    chat: dict[str, Any]
    stream: bool
    reply_id: str
    model: str
    meta: dict[str, Any] = field(default_factory=dict)  # added to the step's metadata
    request: dict[str, Any] = field(default_factory=dict)  # the door's own request body


class StreamWriter(Protocol):
    """Turns the upstream's chat chunks into the door's stream events (SSE bytes)."""

    def feed(self, chunk: dict[str, Any]) -> bytes: ...

    def finish(self, answer: dict[str, Any]) -> bytes: ...

    def fail(self, status: int, message: str) -> bytes: ...


class Door(Protocol):
    protocol: str

    def error_response(
        self, status: int, message: str, *, code: str | None = None, param: str | None = None
    ) -> HttpResponse: ...

    async def prepare(
        self, body: dict[str, Any], ident: Identity, key: VerifiedKey, *, scoped: bool
    ) -> tuple[Prepared, Identity]: ...

    def render(self, prepared: Prepared, answer: dict[str, Any]) -> dict[str, Any]: ...

    def writer(self, prepared: Prepared) -> StreamWriter: ...


def new_id(prefix: str) -> str:
    """A fresh reply id (``msg_...``, ``resp_...``): 96 random bits."""
    return prefix + os.urandom(12).hex()


async def answer(
    door: Any,
    request: HttpRequest,
    path_trajectory: str | None,
    path_group: str | None,
    api_key: str | None,
    capability: str | None,
    handle: Callable[[dict[str, Any], Identity, VerifiedKey], Awaitable[tuple[HttpResponseBase, Identity]]],
) -> HttpResponseBase:
    """The envelope every door shares: POST only, the call's identity, its key, its JSON
    body; then ``handle(body, ident, key)`` -> (response, identity). Errors come back in the
    door's shape (``door.error_response``), and every answer names its trajectory."""
    ident: Identity | None = None
    try:
        if request.method != "POST":
            raise ProxyError(405, f"method {request.method} not allowed; use POST", code="method_not_allowed")
        ident = _identity(request, path_trajectory, path_group)
        key = await authorise(
            request, api_key=api_key, capability=capability, trajectory_uid=ident.trajectory_uid
        )
        response, ident = await handle(_json_body(request), ident, key)
    except DoorInputError as e:
        response = door.error_response(e.status, e.message, code="invalid_request", param=e.param)
    except ProxyError as e:
        response = door.error_response(e.status, e.message, code=e.code, param=e.param)
    except PoolError as e:
        response = door.error_response(e.status_code, e.message, code=e.code, param=e.field)
    if ident is not None:
        response[TRAJECTORY_HEADER] = ident.trajectory_uid
    return response


async def serve(
    door: Door,
    request: HttpRequest,
    path_trajectory: str | None,
    path_group: str | None,
    api_key: str | None,
    capability: str | None,
) -> HttpResponseBase:
    """Answer one call through ``door`` (see the module docstring)."""

    async def handle(
        body: dict[str, Any], ident: Identity, key: VerifiedKey
    ) -> tuple[HttpResponseBase, Identity]:
        scoped = path_trajectory is not None or not ident.new
        prepared, ident = await door.prepare(body, ident, key, scoped=scoped)
        if prepared.stream:
            return await _stream(door, request, ident, key, prepared), ident
        return await _once(door, request, ident, key, prepared), ident

    return await answer(door, request, path_trajectory, path_group, api_key, capability, handle)


_STREAM = {"stream": True, "stream_options": {"include_usage": True}}


async def _once(
    door: Door, request: HttpRequest, ident: Identity, key: VerifiedKey, prepared: Prepared
) -> HttpResponse:
    headers = upstream.forward_headers(request.headers)
    a = fields.ask(CHAT, prepared.chat)
    try:
        resp = await fields.request(a, CHAT_PATH, headers)
    except upstream.UpstreamFault as f:
        raise await upstream_fault(f, door.protocol, ident, key) from None
    if resp.status_code >= 400:
        raise await _upstream_error(door, resp.status_code, resp.content, ident, key)
    try:
        answer = orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict) or not answer.get("choices"):
        msg = "the upstream answered with a body that is not a chat completion"
        raise await invalid_answer(msg, door.protocol, ident, key)
    outcome = await _record(CHAT, ident, key, prepared.chat, answer, extra=prepared.meta)
    response = HttpResponse(orjson.dumps(door.render(prepared, answer)), content_type="application/json")
    if outcome.steps:
        response["X-Claw-Steps"] = ",".join(s.uid for s in outcome.steps)
    return response


async def _upstream_error(
    door: Door, status: int, raw: bytes, ident: Identity, key: VerifiedKey
) -> ProxyError:
    """An upstream 4xx/5xx as a ProxyError with the upstream's message (stored as an Event)."""
    text = upstream.scrub(raw[:2000].decode(errors="replace"))
    await fault_event(status, "http_error", text, door.protocol, ident, key)
    message = text
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        err = parsed.get("error")
        inner = err.get("message") if isinstance(err, dict) else err if isinstance(err, str) else None
        message = inner if isinstance(inner, str) else parsed.get("message") or text
    return ProxyError(status, f"the upstream answered {status}: {message}"[:1000], code="upstream_error")


async def _stream(
    door: Door, request: HttpRequest, ident: Identity, key: VerifiedKey, prepared: Prepared
) -> HttpResponseBase:
    headers = upstream.forward_headers(request.headers)
    a = fields.ask(CHAT, prepared.chat, also=_STREAM)
    try:
        resp, raw = await fields.open_stream(a, CHAT_PATH, headers)
    except upstream.UpstreamFault as f:
        raise await upstream_fault(f, door.protocol, ident, key) from None
    if raw is not None or resp.status_code >= 400:
        raw = raw if raw is not None else await fields.read_closed(resp)
        raise await _upstream_error(door, resp.status_code, raw, ident, key)
    if "text/event-stream" not in resp.headers.get("content-type", ""):
        await resp.aclose()
        msg = "the upstream did not answer the stream request with an event stream"
        raise await invalid_answer(msg, door.protocol, ident, key)
    response = StreamingHttpResponse(
        _relay(door, resp, ident, key, prepared), content_type="text/event-stream; charset=utf-8"
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def _relay(
    door: Door, resp: httpx.Response, ident: Identity, key: VerifiedKey, prepared: Prepared
) -> AsyncIterator[bytes]:
    """Translate the upstream's chunks as they arrive; at ``[DONE]``, record, then send the
    door's closing events. A broken or failed stream records an Event, not a step, and ends
    with the door's error event (the SDKs raise it)."""
    acc = StreamAccumulator(chat=True)
    writer = door.writer(prepared)
    done = False
    try:
        async for data in sse_data(resp.aiter_raw()):
            if data == b"[DONE]":
                done = True
                break
            try:
                chunk = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(chunk, dict):
                continue
            if chunk.get("error") and not chunk.get("choices"):
                msg = upstream.scrub(data[:2000].decode(errors="replace"))
                await fault_event(502, "stream_error", msg, door.protocol, ident, key)
                yield writer.fail(502, f"the upstream stream failed: {msg}")
                return
            acc.add(chunk)
            out = writer.feed(chunk)
            if out:
                yield out
    except httpx.HTTPError as exc:
        f = upstream.fault(exc)
        await fault_event(f.status, f.kind, f.message, door.protocol, ident, key)
        yield writer.fail(f.status, f.message)
        return
    finally:
        await resp.aclose()
    if not done:
        msg = "the upstream stream ended without [DONE]"
        await fault_event(502, "stream_incomplete", msg, door.protocol, ident, key)
        yield writer.fail(502, msg)
        return
    answer = acc.answer()
    try:
        await _record(CHAT, ident, key, prepared.chat, answer, extra=prepared.meta)
    except (PoolError, ProxyError) as e:
        status = e.status_code if isinstance(e, PoolError) else e.status
        yield writer.fail(status, e.message)
        return
    yield writer.finish(answer)


# --- helpers shared by the doors ----------------------------------------------------------------
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
