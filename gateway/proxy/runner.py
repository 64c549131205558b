"""The upstream runner: every proxied call, whatever door it came through, goes upstream
here (gateway/proxy/doors/ translate before and after).

:func:`serve` answers one call through a door: the envelope (envelope.py), the door's
translation of the body (``door.prepare``: chat completions' is the identity), the refusal
of a call naming another source's trajectory or group (owners.py: before any byte goes
upstream, streamed or not), then :func:`run`: the call is sent by its sending strategy (a :class:`Sender`: the upstream's
chat/completions or completions with the field rules of fields.py, whose refused
``return_token_ids`` / ``logprobs`` are retried without once; or the Messages passthrough,
doors/passthrough.py), relayed whole or streamed event by event, recorded as steps
(faults.record -> recording.record_answer -> pool.ingest), committed, and only then answered
in the door's shape (streamed: the door's closing events are sent after the commit).

Faults (refused, timeout, an upstream 4xx/5xx, an answer that is not one, a broken stream)
are stored as Events of type ``upstream_error`` and answered in the door's shape; no step is
written.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import httpx
import orjson
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from claw_kit.llm import upstream
from claw_kit.llm.sse import StreamAccumulator, sse_data
from claw_kit.web import server_timing
from claw_kit.web.errors import HttpError
from pool.errors import PoolError
from pool.services.api_keys import VerifiedKey

from . import fields, idempotency, images, limits, owners
from .envelope import Call, ErrorShape, receive
from .faults import KEPT, crash_point, fault_event, invalid_answer, record, too_large_answer, upstream_fault
from .recording import CHAT, COMPLETIONS, Identity

PATHS = {CHAT: "/v1/chat/completions", COMPLETIONS: "/v1/completions"}
SSE_TYPE = "text/event-stream; charset=utf-8"


# --- what a door and a sending strategy provide --------------------------------------------------
@dataclass(slots=True)
class Prepared:
    """A door request translated: the chat body to send, and what the answer needs back."""

    chat: dict[str, Any]
    stream: bool
    reply_id: str = ""
    model: str = ""
    meta: dict[str, Any] = field(default_factory=dict)  # added to the step's metadata
    request: dict[str, Any] = field(default_factory=dict)  # the door's own request body
    sender: Sender | None = None  # None: the door's own
    also: dict[str, Any] | None = None  # fields the door sets besides (stream options)
    ask: fields.Ask | None = None  # what the chat sender sent (and what leaves the answer)
    started: float = 0.0  # perf_counter() when the upstream call was sent (the step's latency_ms)


class Writer(Protocol):
    """Turns the upstream's stream events into the door's (SSE bytes)."""

    def feed(self, event: dict[str, Any], data: bytes) -> bytes: ...

    def other(self, data: bytes) -> bytes: ...  # data that is not JSON

    def broken(self, event: dict[str, Any], data: bytes, message: str) -> bytes: ...  # an error event

    def finish(self, answer: dict[str, Any]) -> bytes: ...

    def fail(self, status: int, message: str, code: str) -> bytes: ...


class Door(Protocol):
    protocol: str  # the fault Events' endpoint
    sender: Sender

    def error_response(
        self, status: int, message: str, *, code: str | None = None, param: str | None = None
    ) -> HttpResponse: ...

    async def prepare(
        self, body: dict[str, Any], ident: Identity, key: VerifiedKey, *, scoped: bool
    ) -> tuple[Prepared, Identity]: ...

    def problem(self, prepared: Prepared, answer: Any) -> str | None: ...  # why it is no answer

    def respond(self, prepared: Prepared, answer: dict[str, Any], resp: httpx.Response) -> HttpResponse: ...

    async def upstream_error(
        self, status: int, raw: bytes, ident: Identity, key: VerifiedKey
    ) -> HttpResponse: ...  # returns the answer or raises HttpError

    def writer(self, prepared: Prepared) -> Writer: ...


class Accumulator(Protocol):
    def add(self, event: dict[str, Any]) -> None: ...

    def answer(self) -> dict[str, Any]: ...


class Sender(Protocol):
    """A sending strategy: how the call goes upstream, and how its stream ends."""

    endpoint: str  # the recording endpoint (CHAT or COMPLETIONS)
    incomplete: str  # the fault of a stream that ends without its end

    def headers(self, request: HttpRequest) -> dict[str, str]: ...

    async def send(self, call: Call, prepared: Prepared, headers: dict[str, str]) -> httpx.Response: ...

    async def open(
        self, call: Call, prepared: Prepared, headers: dict[str, str]
    ) -> tuple[httpx.Response, bytes | None]: ...  # a refused answer comes back read, with its body

    def end(self, data: bytes) -> bool: ...  # the stream's end marker, before parsing

    def stop(self, event: dict[str, Any]) -> bool: ...  # the stream's end event

    def failed(self, event: dict[str, Any]) -> bool: ...  # an error event

    def accumulator(self) -> Accumulator: ...

    def recorded(
        self, prepared: Prepared, answer: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any] | None]: ...


class ChatSender:
    """To the upstream's chat/completions or completions, asking for ids and logprobs
    (fields.py: an added field it refuses is dropped and the call sent again, once)."""

    incomplete = "the upstream stream ended without [DONE]"

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.path = PATHS[endpoint]

    def headers(self, request: HttpRequest) -> dict[str, str]:
        return upstream.forward_meta(request.META)

    async def send(self, call: Call, prepared: Prepared, headers: dict[str, str]) -> httpx.Response:
        prepared.ask, resp = await send(self.endpoint, prepared.chat, headers, also=prepared.also)
        return resp

    async def open(
        self, call: Call, prepared: Prepared, headers: dict[str, str]
    ) -> tuple[httpx.Response, bytes | None]:
        a = prepared.ask = fields.ask(self.endpoint, prepared.chat, also=prepared.also)
        return await fields.open_stream(a, self.path, headers)

    def end(self, data: bytes) -> bool:
        return data == b"[DONE]"

    def stop(self, event: dict[str, Any]) -> bool:
        return False

    def failed(self, event: dict[str, Any]) -> bool:
        return bool(event.get("error")) and not event.get("choices")

    def accumulator(self) -> StreamAccumulator:
        return StreamAccumulator(chat=self.endpoint == CHAT)

    def recorded(
        self, prepared: Prepared, answer: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        return answer, prepared.meta or None


async def send(
    endpoint: str, body: dict[str, Any], headers: dict[str, str], *, also: dict[str, Any] | None = None
) -> tuple[fields.Ask, httpx.Response]:
    """POST ``body`` to the upstream's ``endpoint`` (CHAT or COMPLETIONS) as the field rules
    ask (fields.py), read whole; with what was asked, which says what leaves the answer.
    Raises UpstreamFault."""
    a = fields.ask(endpoint, body, also=also)
    return a, await fields.request(a, PATHS[endpoint], headers)


CHAT_SENDER = ChatSender(CHAT)
COMPLETIONS_SENDER = ChatSender(COMPLETIONS)


# --- the runner -------------------------------------------------------------------------------
class Route(NamedTuple):
    """What a gateway URL says of a call: the trajectory and group of a scoped or capability
    base URL, the key or capability token it carries (None each where it says nothing)."""

    trajectory_uid: str | None
    prompt_group_uid: str | None
    api_key: str | None
    capability: str | None


def route_view(
    handler: Callable[[HttpRequest, Route], Awaitable[HttpResponseBase]], summary: str
) -> Callable[..., Any]:
    """The view of one gateway endpoint under every base URL (plain, scoped, capability): the
    route's parts as one Route, then ``handler``. The one place the views' signature is written."""

    @csrf_exempt
    async def view(
        request: HttpRequest,
        trajectory_uid: str | None = None,
        prompt_group_uid: str | None = None,
        *,
        api_key: str | None = None,
        capability: str | None = None,
    ) -> HttpResponseBase:
        return await handler(request, Route(trajectory_uid, prompt_group_uid, api_key, capability))

    view.__doc__ = summary
    return view


def door_view(door: Callable[[], Door], summary: str) -> Callable[..., Any]:
    """The view of a door: ``serve`` with the door ``door()`` names for this call (a setting
    may choose it at call time)."""

    async def handle(request: HttpRequest, r: Route) -> HttpResponseBase:
        return await serve(door(), request, r.trajectory_uid, r.prompt_group_uid, r.api_key, r.capability)

    return route_view(handle, summary)


async def serve(
    door: Door,
    request: HttpRequest,
    path_trajectory: str | None,
    path_group: str | None,
    api_key: str | None,
    capability: str | None,
) -> HttpResponseBase:
    """Answer one call through ``door`` (see the module docstring)."""

    async def handle(call: Call) -> HttpResponseBase:
        assert call.ident is not None
        prepared, call.ident = await door.prepare(call.body(), call.ident, call.key, scoped=call.scoped)
        # Another source's trajectory or group: refused before anything goes upstream (owners.py).
        await owners.refuse_foreign(call.ident, call.key)
        if images.has_images(prepared.chat):  # a bad image: refused before anything goes upstream
            await asyncio.to_thread(images.check_chat_images, prepared.chat)
        key = idempotency.key_of(call.request)
        if key is None:
            return await run(door, call, prepared)
        claimed = await idempotency.claim(call.request, key, call.key.source_id, door.error_response)
        if not isinstance(claimed, idempotency.Kept):
            call.ident = None  # a replay carries the first call's headers; a refusal names none
            return claimed
        call.kept = claimed
        try:
            response = await run(door, call, prepared)
        except BaseException:
            await claimed.release()
            raise
        if isinstance(response, StreamingHttpResponse):
            return response  # _relay keeps or releases at the stream's end
        if 200 <= response.status_code < 300:
            crash_point(KEPT)  # the crash window: committed, not yet kept (idempotency.py)
            headers = idempotency.kept_headers(response, call.ident.trajectory_uid if call.ident else None)
            await claimed.complete(response.status_code, response["Content-Type"], headers, response.content)
        else:
            await claimed.release()
        return response

    errors: ErrorShape = door.error_response
    return await receive(
        request,
        handle,
        errors=errors,
        path_trajectory=path_trajectory,
        path_group=path_group,
        api_key=api_key,
        capability=capability,
    )


async def run(door: Door, call: Call, prepared: Prepared) -> HttpResponseBase:
    """Send the prepared call, record its answer, answer in the door's shape."""
    sender = prepared.sender or door.sender
    ident, key = call.ident, call.key
    assert ident is not None
    headers = sender.headers(call.request)
    prepared.started = time.perf_counter()
    if prepared.stream:
        return await _stream(door, sender, call, prepared, headers)
    try:
        resp = await sender.send(call, prepared, headers)
    except upstream.UpstreamFault as f:
        raise await upstream_fault(f, door.protocol, ident, key) from None
    answered = time.perf_counter()
    if resp.status_code >= 400:
        return await door.upstream_error(resp.status_code, resp.content, ident, key)
    too_large = limits.answer_problem(resp.content)  # before parsing: it could be millions of ids
    if too_large is not None:
        raise await too_large_answer(*too_large, door.protocol, ident, key)
    try:
        answer = orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        answer = None
    problem = door.problem(prepared, answer)
    if problem is not None:
        raise await invalid_answer(problem, door.protocol, ident, key)
    recorded, extra = _timed(sender.recorded(prepared, answer), prepared, answered)
    recording = time.perf_counter()
    outcome = await record(sender.endpoint, ident, key, prepared.chat, recorded, extra)
    stored = time.perf_counter()
    response = door.respond(prepared, answer, resp)
    if outcome.steps:
        response["X-Claw-Steps"] = ",".join(s.uid for s in outcome.steps)
    # Where the call's time went (the lean handler adds the total: asgi.py); a stream's
    # headers leave before either is known.
    server_timing.add(
        response,
        server_timing.metric("upstream", answered - prepared.started),
        server_timing.metric("record", stored - recording),
    )
    return response


async def _stream(
    door: Door, sender: Sender, call: Call, prepared: Prepared, headers: dict[str, str]
) -> HttpResponseBase:
    ident, key = call.ident, call.key
    assert ident is not None
    try:
        resp, raw = await sender.open(call, prepared, headers)
    except upstream.UpstreamFault as f:
        raise await upstream_fault(f, door.protocol, ident, key) from None
    if raw is not None or resp.status_code >= 400:
        raw = raw if raw is not None else await fields.read_closed(resp)
        return await door.upstream_error(resp.status_code, raw, ident, key)
    if "text/event-stream" not in resp.headers.get("content-type", ""):
        await resp.aclose()
        msg = "the upstream did not answer the stream request with an event stream"
        raise await invalid_answer(msg, door.protocol, ident, key)
    response = StreamingHttpResponse(
        _relay(door, sender, resp, ident, key, prepared, call.kept), content_type=SSE_TYPE
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def _relay(
    door: Door,
    sender: Sender,
    resp: httpx.Response,
    ident: Identity,
    key: VerifiedKey,
    prepared: Prepared,
    kept: idempotency.Kept | None = None,
) -> AsyncIterator[bytes]:
    """Relay the upstream's events as they arrive, in the door's shape; at the stream's end,
    record, then send the door's closing events. A stream that breaks, errors or ends without
    its end records an Event, not a step, and ends with the door's error event (the SDKs
    raise it). With an Idempotency-Key (``kept``), the events sent are kept once the steps are
    committed, and the key is given back when the stream ends otherwise."""
    try:
        async for out in _relayed(door, sender, resp, ident, key, prepared, kept):
            if kept is not None:
                kept.chunks.append(out)
            yield out
    finally:
        if kept is not None:
            await kept.release()  # nothing once kept (complete settles it)


async def _relayed(
    door: Door,
    sender: Sender,
    resp: httpx.Response,
    ident: Identity,
    key: VerifiedKey,
    prepared: Prepared,
    kept: idempotency.Kept | None,
) -> AsyncIterator[bytes]:
    acc = sender.accumulator()
    writer = door.writer(prepared)
    done = False
    try:
        async for data in sse_data(resp.aiter_raw()):
            if sender.end(data):
                done = True
                break
            too_large = limits.answer_problem(data)  # before parsing (the first chunk's prompt ids)
            if too_large is not None:
                error = await too_large_answer(*too_large, door.protocol, ident, key)
                yield writer.fail(error.status, error.message, error.code or "too_large")
                return
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError:
                out = writer.other(data)
                if out:
                    yield out
                continue
            if not isinstance(event, dict):
                continue
            if sender.stop(event):
                done = True
                break
            if sender.failed(event):
                msg = upstream.scrub(data[:2000].decode(errors="replace"))
                await fault_event(502, "stream_error", msg, door.protocol, ident, key)
                yield writer.broken(event, data, msg)
                return
            acc.add(event)
            out = writer.feed(event, data)
            if out:
                yield out
    except httpx.HTTPError as exc:
        f = upstream.fault(exc)
        await fault_event(f.status, f.kind, f.message, door.protocol, ident, key)
        yield writer.fail(f.status, f.message, f.kind)
        return
    finally:
        await resp.aclose()
    if not done:
        await fault_event(502, "stream_incomplete", sender.incomplete, door.protocol, ident, key)
        yield writer.fail(502, sender.incomplete, "stream_incomplete")
        return
    answer = acc.answer()
    recorded, extra = _timed(sender.recorded(prepared, answer), prepared)
    try:
        await record(sender.endpoint, ident, key, prepared.chat, recorded, extra)
    except (PoolError, HttpError) as e:
        status = e.status_code if isinstance(e, PoolError) else e.status
        yield writer.fail(status, e.message, "record_failed")
        return
    tail = writer.finish(answer)
    if kept is not None:
        crash_point(KEPT)  # the crash window: committed, not yet kept (idempotency.py)
        headers = idempotency.kept_headers(None, ident.trajectory_uid)
        await kept.complete(200, SSE_TYPE, headers, b"".join(kept.chunks) + tail)
    yield tail


def _timed(
    recorded: tuple[dict[str, Any], dict[str, Any] | None], prepared: Prepared, answered: float | None = None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The call's latency (sent to answered in full, in ms; ``answered``: when the answer was
    in, by default now) added to its steps' metadata, as the trace view shows it."""
    answer, extra = recorded
    end = time.perf_counter() if answered is None else answered
    return answer, {**(extra or {}), "latency_ms": round(1000 * (end - prepared.started), 1)}
