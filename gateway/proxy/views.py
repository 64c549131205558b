"""OpenAI-compatible endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /v1/models``, also under the scoped base URL ``/t/<trajectory>/<group>/v1/`` and the
capability URL ``/t/c/<token>/<trajectory>/<group>/v1/`` (the token alone authorises).

Plain async Django views (no DRF): under ASGI a call never holds a thread while the
upstream works, so one process keeps hundreds of calls in flight. Chat completions and
completions are doors (doors/chat.py, the identity translation) served by the runner
(runner.py), as every door is. Per call:

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

from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from claw_kit.llm import upstream
from claw_kit.redaction import redact
from claw_kit.web.errors import HttpError, error_response

from . import envelope
from .access import authorise
from .doors.chat import CHAT_DOOR, COMPLETIONS_DOOR, passthrough_error
from .faults import fault_event
from .runner import Route, door_view, route_view

TRAJECTORY_HEADER = envelope.TRAJECTORY_HEADER

__all__ = ["TRAJECTORY_HEADER", "chat_completions", "completions", "models", "unknown_endpoint"]


chat_completions = door_view(
    lambda: CHAT_DOOR, "``POST /v1/chat/completions`` (streamed or not), recorded as one step per choice."
)
completions = door_view(
    lambda: COMPLETIONS_DOOR, "``POST /v1/completions`` (streamed or not), recorded as one step per choice."
)


async def _models(request: HttpRequest, route: Route) -> HttpResponseBase:
    if request.method != "GET":
        return error_response(405, f"method {request.method} not allowed; use GET", code="method_not_allowed")
    try:
        key = await authorise(
            request, api_key=route.api_key, capability=route.capability, trajectory_uid=route.trajectory_uid
        )
    except HttpError as e:
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
        return passthrough_error(resp.status_code, resp.content)
    return HttpResponse(resp.content, status=resp.status_code, content_type="application/json")


models = route_view(_models, "``GET /v1/models``: the upstream's model list, passed through.")


@csrf_exempt
async def unknown_endpoint(request: HttpRequest, **kwargs: str) -> HttpResponseBase:
    """Any other path under a gateway base URL (embeddings, audio...): not proxied. The
    path is named with any key or token in it masked (claw_kit/redaction.py)."""
    return error_response(404, f"the gateway does not serve {redact(request.path)}", code="unknown_endpoint")
