"""OpenAI-compatible endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /v1/models``, also under the scoped base URL ``/t/<trajectory>/<group>/v1/`` and the
capability URL ``/t/c/<token>/<trajectory>/<group>/v1/`` (the token alone authorises).

Plain async Django views (no DRF): under ASGI a call never holds a thread while the
upstream works, so one process keeps hundreds of calls in flight. Per call:

1. the agent's credential is checked: its key (scope ingest, cached) or the trajectory token
   of a capability URL (see access.py);
2. the trajectory is taken from the path, else X-Claw-Trajectory, else minted; its uid is
   returned in the X-Claw-Trajectory response header in every case;
3. the body goes upstream asking for the exact token ids and the sampled tokens' logprobs
   (fields.py: ``return_token_ids: true``, ``logprobs``);
4. the answer is recorded as steps, committed, and only then returned (or, streamed, the
   final ``data: [DONE]`` sent). vLLM's id fields and the logprobs are taken out of what the
   agent receives unless it asked for them itself.

Faults: connection refused -> 502, timeout -> 504, an upstream 4xx/5xx is passed through
with its body; each is stored as an Event of type ``upstream_error`` and no step is written.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from claw_site.redaction import redact
from pool.errors import PoolError
from pool.ingest import rules
from pool.services import gateway_event_record
from pool.services.api_keys import VerifiedKey

from ..body import check_length, json_object
from . import fields, upstream
from .access import authorise
from .db import run_db
from .errors import ProxyError, error_response
from .recording import CHAT, COMPLETIONS, Identity, Outcome, record_answer
from .stream import StreamAccumulator, sse_data

log = logging.getLogger(__name__)

TRAJECTORY_HEADER = "X-Claw-Trajectory"
_PATHS = {CHAT: "/v1/chat/completions", COMPLETIONS: "/v1/completions"}


@csrf_exempt
async def chat_completions(
    request: HttpRequest,
    trajectory_uid: str | None = None,
    prompt_group_uid: str | None = None,
    *,
    api_key: str | None = None,
    capability: str | None = None,
) -> HttpResponseBase:
    """``POST /v1/chat/completions`` (streamed or not), recorded as one step per choice."""
    return await _complete(request, CHAT, trajectory_uid, prompt_group_uid, api_key, capability)


@csrf_exempt
async def completions(
    request: HttpRequest,
    trajectory_uid: str | None = None,
    prompt_group_uid: str | None = None,
    *,
    api_key: str | None = None,
    capability: str | None = None,
) -> HttpResponseBase:
    """``POST /v1/completions`` (streamed or not), recorded as one step per choice."""
    return await _complete(request, COMPLETIONS, trajectory_uid, prompt_group_uid, api_key, capability)


@csrf_exempt
async def models(
    request: HttpRequest,
    trajectory_uid: str | None = None,
    prompt_group_uid: str | None = None,
    *,
    api_key: str | None = None,
    capability: str | None = None,
) -> HttpResponseBase:
    """``GET /v1/models``: the upstream's model list, passed through."""
    if request.method != "GET":
        return error_response(405, f"method {request.method} not allowed; use GET", code="method_not_allowed")
    try:
        key = await authorise(request, api_key=api_key, capability=capability, trajectory_uid=trajectory_uid)
    except ProxyError as e:
        return error_response(e.status, e.message, code=e.code, param=e.param)
    try:
        resp = await upstream.request(
            "GET", "/v1/models", content=None, headers=upstream.forward_headers(request.headers)
        )
    except upstream.UpstreamFault as f:
        await fault_event(f.status, f.kind, f.message, "models", None, key)
        return error_response(f.status, f.message, code=f.kind)
    if resp.status_code >= 400:
        await fault_event(
            resp.status_code, "http_error", upstream.scrub(resp.text[:2000]), "models", None, key
        )
        return _passthrough_error(resp.status_code, resp.content)
    return HttpResponse(resp.content, status=resp.status_code, content_type="application/json")


@csrf_exempt
async def unknown_endpoint(request: HttpRequest, **kwargs: str) -> HttpResponseBase:
    """Any other path under a gateway base URL (embeddings, audio...): not proxied. The
    path is named with any key or token in it masked (claw_site/redaction.py)."""
    return error_response(404, f"the gateway does not serve {redact(request.path)}", code="unknown_endpoint")


# --- completions ------------------------------------------------------------------------------
async def _complete(
    request: HttpRequest,
    endpoint: str,
    path_trajectory: str | None,
    path_group: str | None,
    api_key: str | None,
    capability: str | None,
) -> HttpResponseBase:
    ident: Identity | None = None
    try:
        ident = _identity(request, path_trajectory, path_group)
        if request.method != "POST":
            raise ProxyError(405, f"method {request.method} not allowed; use POST", code="method_not_allowed")
        key = await authorise(
            request, api_key=api_key, capability=capability, trajectory_uid=ident.trajectory_uid
        )
        body = _json_body(request)
        response = await _forward(request, endpoint, ident, key, body)
    except ProxyError as e:
        response = error_response(e.status, e.message, code=e.code, param=e.param)
    except PoolError as e:
        response = error_response(e.status_code, e.message, code=e.code, param=e.field)
    if ident is not None:
        response[TRAJECTORY_HEADER] = ident.trajectory_uid
    return response


def _identity(request: HttpRequest, path_trajectory: str | None, path_group: str | None) -> Identity:
    meta = request.META
    traj = path_trajectory or meta.get("HTTP_X_CLAW_TRAJECTORY") or None
    new = traj is None
    if traj is None:
        traj = uuid.uuid4().hex
    group = path_group if path_group is not None else meta.get("HTTP_X_CLAW_PROMPT_GROUP") or None
    if group == "-":  # the scoped URL's "no group"
        group = None
    for name, value in (("trajectory", traj), ("prompt group", group)):
        if value is not None and (not value.strip() or len(value) > rules.MAX_UID_LEN):
            raise ProxyError(
                400, f"the {name} uid must be 1 to {rules.MAX_UID_LEN} characters", code="invalid_uid"
            )
    version = meta.get("HTTP_X_CLAW_POLICY_VERSION")
    policy_version = None
    if version not in (None, ""):
        try:
            policy_version = int(version)
        except ValueError:
            policy_version = -1
        if not 0 <= policy_version < 2**63:
            raise ProxyError(
                400, "X-Claw-Policy-Version must be a non-negative integer", code="invalid_policy_version"
            )
    return Identity(trajectory_uid=traj, prompt_group_uid=group, policy_version=policy_version, new=new)


def _json_body(request: HttpRequest) -> dict[str, Any]:
    length = request.META.get("CONTENT_LENGTH")
    check_length(int(length) if length and length.isdigit() else None)
    return json_object(request.body)


async def _forward(
    request: HttpRequest, endpoint: str, ident: Identity, key: VerifiedKey, body: dict[str, Any]
) -> HttpResponseBase:
    headers = upstream.forward_headers(request.headers)
    a = fields.ask(endpoint, body)
    path = _PATHS[endpoint]
    if body.get("stream") is True:
        return await _stream(endpoint, ident, key, body, path, a, headers)
    try:
        resp = await fields.request(a, path, headers)
    except upstream.UpstreamFault as f:
        raise await upstream_fault(f, endpoint, ident, key) from None
    if resp.status_code >= 400:
        await fault_event(
            resp.status_code, "http_error", upstream.scrub(resp.text[:2000]), endpoint, ident, key
        )
        return _passthrough_error(resp.status_code, resp.content)
    try:
        answer = orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        msg = "the upstream answered with a body that is not a JSON object"
        raise await invalid_answer(msg, endpoint, ident, key)
    outcome = await _record(endpoint, ident, key, body, answer)
    if a.strips:  # the answer is parsed already: what the agent did not ask for goes here
        fields.strip(answer, a)
        out = orjson.dumps(answer)
    else:
        out = resp.content
    response = HttpResponse(out, status=resp.status_code, content_type="application/json")
    if outcome.steps:
        response["X-Claw-Steps"] = ",".join(s.uid for s in outcome.steps)
    return response


async def _record(
    endpoint: str,
    ident: Identity,
    key: VerifiedKey,
    body: dict[str, Any],
    answer: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> Outcome:
    """Commit the call's steps; a database failure is answered 503 (the agent may retry),
    a Conflict (ended trajectory, other group) with its own status."""
    try:
        return await run_db(
            record_answer,
            endpoint=endpoint,
            ident=ident,
            request=body,
            answer=answer,
            source_id=key.source_id,
            extra=extra,
        )
    except PoolError as e:
        await fault_event(
            e.status_code, "record_rejected", e.message, endpoint, ident, key, event_type="record_failed"
        )
        raise
    except DatabaseError as e:
        log.exception("recording a proxied call failed")
        await fault_event(
            503, "database_error", type(e).__name__, endpoint, ident, key, event_type="record_failed"
        )
        raise ProxyError(
            503, "the call could not be recorded (database error); retry", code="record_failed"
        ) from None


# --- streaming --------------------------------------------------------------------------------
async def _stream(
    endpoint: str,
    ident: Identity,
    key: VerifiedKey,
    body: dict[str, Any],
    path: str,
    a: fields.Ask,
    headers: dict[str, str],
) -> HttpResponseBase:
    try:
        resp, raw = await fields.open_stream(a, path, headers)
    except upstream.UpstreamFault as f:
        raise await upstream_fault(f, endpoint, ident, key) from None
    if raw is not None or resp.status_code >= 400:
        raw = raw if raw is not None else await fields.read_closed(resp)
        return await _stream_error(resp.status_code, raw, endpoint, ident, key)
    if "text/event-stream" not in resp.headers.get("content-type", ""):
        await resp.aclose()
        msg = "the upstream did not answer the stream request with an event stream"
        raise await invalid_answer(msg, endpoint, ident, key)
    response = StreamingHttpResponse(
        _relay(resp, endpoint, ident, key, body, a), content_type="text/event-stream; charset=utf-8"
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def _relay(
    resp: httpx.Response,
    endpoint: str,
    ident: Identity,
    key: VerifiedKey,
    body: dict[str, Any],
    a: fields.Ask,
) -> AsyncIterator[bytes]:
    """Relay the upstream's events one by one; at ``[DONE]``, record, then send ``[DONE]``.
    A stream that breaks, errors or ends without ``[DONE]`` records an Event, not a step,
    and ends with an OpenAI error event (the SDKs raise it)."""
    acc = StreamAccumulator(chat=endpoint == CHAT)
    done = False
    try:
        async for data in sse_data(resp.aiter_raw()):
            if data == b"[DONE]":
                done = True
                break
            try:
                chunk = orjson.loads(data)
            except orjson.JSONDecodeError:
                yield b"data: " + data + b"\n\n"
                continue
            if not isinstance(chunk, dict):
                continue
            if chunk.get("error") and not chunk.get("choices"):
                await fault_event(
                    502,
                    "stream_error",
                    upstream.scrub(data[:2000].decode(errors="replace")),
                    endpoint,
                    ident,
                    key,
                )
                yield b"data: " + data + b"\n\n"
                return
            acc.add(chunk)
            if a.strips:  # each chunk is parsed already: what the agent did not ask for goes here
                fields.strip(chunk, a)
                data = orjson.dumps(chunk)
            yield b"data: " + data + b"\n\n"
    except httpx.HTTPError as exc:
        f = upstream.fault(exc)
        await fault_event(f.status, f.kind, f.message, endpoint, ident, key)
        yield _error_event(f.status, f.message, f.kind)
        return
    finally:
        await resp.aclose()
    if not done:
        msg = "the upstream stream ended without [DONE]"
        await fault_event(502, "stream_incomplete", msg, endpoint, ident, key)
        yield _error_event(502, msg, "stream_incomplete")
        return
    try:
        await _record(endpoint, ident, key, body, acc.answer())
    except (PoolError, ProxyError) as e:
        status = e.status_code if isinstance(e, PoolError) else e.status
        yield _error_event(status, e.message, "record_failed")
        return
    yield b"data: [DONE]\n\n"


async def _stream_error(
    status: int, raw: bytes, endpoint: str, ident: Identity, key: VerifiedKey
) -> HttpResponse:
    await fault_event(
        status, "http_error", upstream.scrub(raw[:2000].decode(errors="replace")), endpoint, ident, key
    )
    return _passthrough_error(status, raw)


def _error_event(status: int, message: str, code: str) -> bytes:
    err = orjson.loads(error_response(status, message, code=code).content)
    return b"data: " + orjson.dumps(err) + b"\n\n"


# --- shared -----------------------------------------------------------------------------------
def _passthrough_error(status: int, raw: bytes) -> HttpResponse:
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


async def upstream_fault(
    f: upstream.UpstreamFault, endpoint: str, ident: Identity | None, key: VerifiedKey
) -> ProxyError:
    """An upstream that could not be reached or timed out: stored as an Event, returned as
    the ProxyError to raise (``raise await upstream_fault(...) from None``)."""
    await fault_event(f.status, f.kind, f.message, endpoint, ident, key)
    return ProxyError(f.status, f.message, code=f.kind)


async def invalid_answer(message: str, endpoint: str, ident: Identity | None, key: VerifiedKey) -> ProxyError:
    """An upstream answer that is not what was asked for (not a completion, not an event
    stream): a 502 ``invalid_answer``, stored as an Event."""
    await fault_event(502, "invalid_answer", message, endpoint, ident, key)
    return ProxyError(502, message, code="invalid_answer")


async def fault_event(
    status: int,
    kind: str,
    message: str,
    endpoint: str,
    ident: Identity | None,
    key: VerifiedKey,
    *,
    event_type: str = "upstream_error",
) -> None:
    """Store a failed call as an Event (best effort: a database outage must not mask the
    fault the agent is about to receive)."""
    payload = {"status": status, "kind": kind, "endpoint": endpoint, "message": message}
    try:
        await run_db(
            gateway_event_record,
            type=event_type,
            payload=payload,
            trajectory_uid=ident.trajectory_uid if ident else None,
            source_id=key.source_id,
        )
    except Exception:  # noqa: BLE001 - see docstring
        log.exception("could not record a gateway event (%s %s)", event_type, kind)
