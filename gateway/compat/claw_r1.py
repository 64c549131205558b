"""The Claw-R1 gateway protocol under ``/compat/claw-r1/``, so an agent written for Claw-R1
works by changing only its gateway URL:

* ``POST /init_trajectory`` -> ``{"trajectory_uid", "base_url"}``, base_url = a capability
  URL ``<scheme://host>/compat/claw-r1/c/<token>/<trajectory_uid>/<prompt_uid>/v1``;
* ``POST {base_url}/register_trajectory`` ``{"channel"?, "metadata"?}`` -> ``{"status": "ok"}``
  (``metadata.policy_version`` is stamped on later steps);
* ``POST {base_url}/chat/completions``: the OpenAI gateway (gateway/proxy) with the
  trajectory and prompt group taken from the URL; exact upstream ids, streaming, tools;
* ``POST {base_url}/complete_trajectory`` ``{"reward"?, "channel"?}`` -> ``{"status": "ok"}``
  (the last step gets ``is_last`` and the reward);
* ``POST /submit_steps?channel=train`` ``{"steps": [...]}`` -> ``{"accepted": n}``.

Aliases of older Claw-R1 versions are served too (``{base}/trajectory/complete``,
``/complete_trajectory/<uid>``, ``/register_trajectory`` with ``trajectory_uid`` in the body).

Unlike Claw-R1, every call is authorised, and everything is durable. Claw-R1's own flow sends
no credentials (its trainer posts init_trajectory bare, its agents use the OpenAI client
with ``api_key="not-needed"``), so the credential travels in the URLs:

* a source's **gateway URL** ``/compat/claw-r1/k/<api key>`` serves every endpoint above,
  authorised by the ingest key in its path (``Authorization: Bearer <key>`` on the plain
  paths works too);
* the **capability URL** that init_trajectory returns carries a fresh trajectory token
  (pool.services.capabilities) that alone authorises register, chat/completions,
  completions, models and complete on that one trajectory, until it ends or the token
  expires; an Authorization header there is ignored.

Prompt groups the Claw-R1 way: init_trajectory binds none (its base URL holds a default
prompt uid, which Claw-R1's flow replaces with the real one); the prompt uid of the first
call that uses the URL (register or chat) binds the group, another one later is a 409.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from pool.errors import PoolError
from pool.ingest import rules
from pool.services import steps_ingest, trajectory_complete, trajectory_register
from pool.services.api_keys import VerifiedKey
from pool.services.capabilities import trajectory_init

from ..body import json_object
from ..proxy.access import authorise
from ..proxy.db import run_db
from ..proxy.errors import ProxyError, error_response
from ..validation import parse_step_batch

PREFIX = "/compat/claw-r1"
_OK = b'{"status":"ok"}'
# Claw-R1 step fields -> ours; fields we do not store go to metadata["claw_r1"].
_RENAMED = {"prompt_uid": "prompt_group_uid", "rollout_log_probs": "rollout_logprobs"}
_KEPT = frozenset(
    {
        "prompt_ids",
        "response_ids",
        "reward",
        "trajectory_uid",
        "step_index",
        "policy_version",
        "is_last",
        "metadata",
    }
)


def _view(handler):
    """POST only, authorised (an ingest key in the path or header, or a capability URL's
    token: see gateway/proxy/access.py), JSON errors in OpenAI's shape."""

    @csrf_exempt
    async def view(
        request: HttpRequest, *, api_key: str | None = None, capability: str | None = None, **kwargs: str
    ) -> HttpResponse:
        if request.method != "POST":
            return error_response(
                405, f"method {request.method} not allowed; use POST", code="method_not_allowed"
            )
        try:
            key = await authorise(
                request, api_key=api_key, capability=capability, trajectory_uid=kwargs.get("trajectory_uid")
            )
            return await handler(request, key, **kwargs)
        except ProxyError as e:
            return error_response(e.status, e.message, code=e.code, param=e.param)
        except PoolError as e:
            return error_response(e.status_code, e.message, code=e.code, param=e.field)

    view.__name__ = handler.__name__
    view.__doc__ = handler.__doc__
    return view


@_view
async def init_trajectory(request: HttpRequest, key: VerifiedKey) -> HttpResponse:
    """Open a trajectory and return its capability URL; optional body ``{"prompt_uid",
    "channel", "metadata"}`` (an extension: Claw-R1 sends none). A given prompt_uid binds the
    group now; without one, the URL holds a fresh default uid and nothing is bound until the
    first call names a prompt uid (Claw-R1's flow swaps in the real one)."""
    body = _body(request)
    prompt_uid = body.get("prompt_uid") or None
    if prompt_uid is not None and (
        not isinstance(prompt_uid, str) or not 0 < len(prompt_uid) <= rules.MAX_UID_LEN or "/" in prompt_uid
    ):
        raise ProxyError(
            400,
            f"prompt_uid must be a string of 1 to {rules.MAX_UID_LEN} characters without '/'",
            param="prompt_uid",
        )
    traj, token = await run_db(
        trajectory_init,
        api_key_id=key.key_id,
        source_id=key.source_id,
        prompt_group_uid=prompt_uid,
        channel=body.get("channel"),
        metadata=_metadata(body),
    )
    default_prompt_uid = prompt_uid or uuid.uuid4().hex
    base_url = request.build_absolute_uri(f"{PREFIX}/c/{token}/{traj.uid}/{default_prompt_uid}/v1")
    return _json({"trajectory_uid": traj.uid, "base_url": base_url})


@_view
async def register_trajectory(
    request: HttpRequest, key: VerifiedKey, trajectory_uid: str | None = None, prompt_uid: str | None = None
) -> HttpResponse:
    """``{"channel": "train"|"val", "metadata": {...}}``, both optional."""
    body = _body(request)
    traj = trajectory_uid or body.get("trajectory_uid")
    if not isinstance(traj, str) or not traj:
        raise ProxyError(400, "trajectory_uid is required", param="trajectory_uid")
    await run_db(
        trajectory_register,
        uid=traj,
        prompt_group_uid=prompt_uid if prompt_uid != "-" else None,
        channel=body.get("channel"),
        metadata=_metadata(body),
        source_id=key.source_id,
    )
    return HttpResponse(_OK, content_type="application/json")


@_view
async def complete_trajectory(
    request: HttpRequest, key: VerifiedKey, trajectory_uid: str, prompt_uid: str | None = None
) -> HttpResponse:
    """``{"reward": float, "channel": str}``, both optional."""
    body = _body(request)
    reward = body.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
        raise ProxyError(400, "reward must be a number", param="reward")
    await run_db(
        trajectory_complete,
        uid=trajectory_uid,
        reward=float(reward) if reward is not None else None,
        channel=body.get("channel"),
        reward_last_step=True,
        source_id=key.source_id,
    )
    return HttpResponse(_OK, content_type="application/json")


@_view
async def submit_steps(request: HttpRequest, key: VerifiedKey) -> HttpResponse:
    """White-box steps in Claw-R1's shape; ``?channel=train|val`` names the channel of new
    trajectories. Atomic and idempotent (a step's uid is ``<trajectory_uid>:<step_index>``)."""
    body = _body(request)
    channel = request.GET.get("channel", "train")
    raw = body.get("steps")
    if not isinstance(raw, list):
        raise ProxyError(400, "steps must be an array of step objects", param="steps")
    try:
        batch = parse_step_batch({"steps": [_our_step(s, i) for i, s in enumerate(raw)]})
        await run_db(_ingest, batch, key.source_id, channel)
    except PoolError as e:
        e.field = _their_field(e.field)
        raise
    return _json({"accepted": len(batch)})


def _their_field(field: str | None) -> str | None:
    """An error's field path in Claw-R1's names (``steps[2].prompt_uid``), as the client sent it."""
    if field is None:
        return None
    for theirs, ours in _RENAMED.items():
        field = field.replace(f".{ours}", f".{theirs}")
    return field


def _ingest(batch: list, source_id: int, channel: str) -> None:
    steps_ingest(steps=batch, source_id=source_id, channel=channel)


def _our_step(step: Any, i: int) -> Any:
    """A Claw-R1 StepPayload as our step fields (unknown fields are kept in metadata)."""
    if not isinstance(step, dict):
        return step  # parse_step_batch names the error
    out: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for k, v in step.items():
        if k in _RENAMED:
            if v not in (None, ""):
                out[_RENAMED[k]] = v
        elif k in _KEPT:
            if v is not None:
                out[k] = v
        elif v is not None:
            extra[k] = v
    out.setdefault("step_index", 0)  # Claw-R1's defaults
    if extra:
        out["metadata"] = {**(out.get("metadata") or {}), "claw_r1": extra}
    return out


def _body(request: HttpRequest) -> dict[str, Any]:
    # Lenient: Python's json (Claw-R1's client) writes NaN for a NaN reward; parsed, it is
    # refused by the rules naming its field instead of as malformed JSON.
    return json_object(request.body, empty_ok=True, lenient=True)


def _metadata(body: dict[str, Any]) -> dict[str, Any] | None:
    meta = body.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise ProxyError(400, "metadata must be a JSON object", param="metadata")
    return meta


def _json(payload: dict[str, Any]) -> HttpResponse:
    return HttpResponse(orjson.dumps(payload), content_type="application/json")
