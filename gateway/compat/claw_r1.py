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
* ``POST /submit_steps?channel=train`` ``{"steps": [...]}`` -> ``{"accepted": n}``;
* white-box flows (claw_r1/agent_flow): ``POST /generate`` ``{"prompt_ids", "sampling_params"}``
  -> ``{"token_ids", "log_probs", "stop_reason"}`` (the upstream's ``/v1/completions`` on the
  token-id prompt with ``return_token_ids``: its exact ids, never re-encoded) and
  ``POST /compute_reward`` ``{"prompt_ids", "response_ids", "num_turns", "extra_fields",
  "dataset_fields"}`` -> ``{"reward_score", "reward_extra_info"}`` (the pool's reward
  function of ``dataset_fields.data_source``: pool/rewards/).

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

import asyncio
import logging
import uuid
from typing import Any

import orjson
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt

from claw_kit.llm import upstream
from claw_kit.web.body import json_object
from claw_kit.web.errors import HttpError
from pool.errors import PoolError
from pool.generation_texts import generation_text_remember
from pool.ingest import rules
from pool.ingest.pipeline import steps_ingest
from pool.rewards import RewardSample
from pool.selectors.steps import generation_texts
from pool.services.api_keys import VerifiedKey
from pool.services.capabilities import trajectory_init
from pool.services.groups import group_upsert
from pool.services.reward_compute import (
    ground_truth_in,
    response_text_lookup,
    reward_function_for,
    sample_score,
)
from pool.services.trajectories import trajectory_complete, trajectory_register

from ..proxy import limits, runner
from ..proxy.db import run_db
from ..proxy.envelope import Call, receive
from ..proxy.faults import fault_event, too_large_answer, upstream_fault
from ..proxy.recording import COMPLETIONS
from ..validation import parse_step_batch

log = logging.getLogger(__name__)

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
        # Claw-R1's Step.multi_modal_data ({"images": [...]}): stored once by content (issue 24)
        "multi_modal_data",
    }
)


def _view(handler):
    """POST only, authorised (an ingest key in the path or header, or a capability URL's
    token: see gateway/proxy/access.py), JSON errors in OpenAI's shape."""

    @csrf_exempt
    async def view(
        request: HttpRequest, *, api_key: str | None = None, capability: str | None = None, **kwargs: str
    ) -> HttpResponseBase:
        async def handle(call: Call) -> HttpResponse:
            return await handler(request, call.key, **kwargs)

        return await receive(
            request,
            handle,
            path_trajectory=kwargs.get("trajectory_uid"),
            api_key=api_key,
            capability=capability,
            identity=False,
        )

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
        raise HttpError(
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
        sources=key.write_sources,
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
        raise HttpError(400, "trajectory_uid is required", param="trajectory_uid")
    meta = _metadata(body)
    group = prompt_uid if prompt_uid != "-" else None
    await run_db(
        trajectory_register,
        uid=traj,
        prompt_group_uid=group,
        channel=body.get("channel"),
        metadata=meta,
        source_id=key.source_id,
        sources=key.write_sources,
    )
    task = (meta or {}).get("task")
    if group is not None and isinstance(task, str) and task:
        # Claw-R1's trajectory metadata names the dataset row: the group rolls out that task.
        await run_db(group_upsert, uid=group, task=task, source_id=key.source_id, sources=key.write_sources)
    return HttpResponse(_OK, content_type="application/json")


@_view
async def complete_trajectory(
    request: HttpRequest, key: VerifiedKey, trajectory_uid: str, prompt_uid: str | None = None
) -> HttpResponse:
    """``{"reward": float, "channel": str}``, both optional."""
    body = _body(request)
    reward = body.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
        raise HttpError(400, "reward must be a number", param="reward")
    await run_db(
        trajectory_complete,
        uid=trajectory_uid,
        reward=float(reward) if reward is not None else None,
        channel=body.get("channel"),
        reward_last_step=True,
        source_id=key.source_id,
        sources=key.write_sources,
    )
    return HttpResponse(_OK, content_type="application/json")


@_view
async def submit_steps(request: HttpRequest, key: VerifiedKey) -> HttpResponse:
    """White-box steps in Claw-R1's shape; ``?channel=train|val`` names the channel of new
    trajectories. Atomic and idempotent (a step's uid is ``<trajectory_uid>:<step_index>``).
    A step whose response ids this source generated through /generate is stored with the
    upstream's text of them."""
    body = _body(request)
    channel = request.GET.get("channel", "train")
    raw = body.get("steps")
    if not isinstance(raw, list):
        raise HttpError(400, "steps must be an array of step objects", param="steps")
    try:
        batch = parse_step_batch({"steps": [_our_step(s, i) for i, s in enumerate(raw)]})
        await run_db(_ingest, batch, key, channel)
    except PoolError as e:
        e.field = _their_field(e.field)
        raise
    return _json({"accepted": len(batch)})


@_view
async def generate(request: HttpRequest, key: VerifiedKey) -> HttpResponse:
    """``{"prompt_ids": [...], "sampling_params": {...}}`` -> ``{"token_ids", "log_probs",
    "stop_reason"}``: the upstream's ``/v1/completions`` on the token-id prompt, with
    ``return_token_ids`` and ``logprobs: 1`` (asked whether or not ``sampling_params.logprobs``
    is, unless CLAW_UPSTREAM_LOGPROBS is off: gateway/proxy/fields.py), ``log_probs`` null
    only when the upstream gave none. The ids are the upstream's own; an upstream that
    returns none is a 502, never a re-encoding.
    Sampling params map as in Claw-R1: max_tokens (default CLAW_GENERATE_MAX_TOKENS),
    temperature, top_p, repetition_penalty (default 1.0 each) and model. The upstream's text
    of the ids is remembered for this source (submit_steps and compute_reward use it)."""
    body = _body(request)
    prompt_ids = _token_ids(body.get("prompt_ids"), "prompt_ids", empty_ok=False)
    payload = {"prompt": prompt_ids, **_sampling(body.get("sampling_params"))}
    headers = upstream.forward_headers(request.headers)
    headers["content-type"] = "application/json"
    try:
        _, resp = await runner.send(COMPLETIONS, payload, headers)
    except upstream.UpstreamFault as f:
        raise await upstream_fault(f, "generate", None, key) from None
    if resp.status_code >= 400:
        detail = upstream.scrub(resp.text[:1000])
        await fault_event(resp.status_code, "http_error", detail, "generate", None, key)
        status = resp.status_code if resp.status_code < 500 else 502
        raise HttpError(status, f"the upstream answered {resp.status_code}: {detail}", code="upstream_error")
    too_large = limits.answer_problem(resp.content)  # before parsing: it could be millions of ids
    if too_large is not None:
        raise await too_large_answer(*too_large, "generate", None, key)
    token_ids, log_probs, stop_reason, text = _generated(resp.content)
    if text is not None:
        try:
            await run_db(generation_text_remember, source_id=key.source_id, response_ids=token_ids, text=text)
        except Exception:  # noqa: BLE001 - the ids are the answer; a lost text is only a lost convenience
            log.exception("could not remember the text of a generation")
    return _json({"token_ids": token_ids, "log_probs": log_probs, "stop_reason": stop_reason})


@_view
async def compute_reward(request: HttpRequest, key: VerifiedKey) -> HttpResponse:
    """``{"prompt_ids", "response_ids", "num_turns", "extra_fields", "dataset_fields"}`` ->
    ``{"reward_score", "reward_extra_info"}``: the pool's reward function registered for
    ``dataset_fields.data_source`` (pool/rewards/), against
    ``dataset_fields.reward_model.ground_truth`` (or ``dataset_fields.ground_truth``), on the
    text of the response ids (remembered from /generate, else CLAW_TOKENIZER). Writes
    nothing: the agent puts the score on its step. 422 when there is no function, no text or
    the function fails, naming the field."""
    body = _body(request)
    _token_ids(body.get("prompt_ids", []), "prompt_ids", empty_ok=True)
    response_ids = _token_ids(body.get("response_ids"), "response_ids", empty_ok=True)
    num_turns = body.get("num_turns", 2)
    if isinstance(num_turns, bool) or not isinstance(num_turns, int) or num_turns < 0:
        raise HttpError(400, "num_turns must be a non-negative integer", param="num_turns")
    extra = _object(body, "extra_fields")
    dataset = _object(body, "dataset_fields")
    data_source = dataset.get("data_source")
    if not isinstance(data_source, str) or not data_source:
        raise HttpError(
            400,
            "dataset_fields.data_source must name the sample's data source",
            param="dataset_fields.data_source",
        )
    text = await run_db(response_text_lookup, source_id=key.source_id, response_ids=response_ids)
    if text is None:
        raise HttpError(
            422,
            "response text unknown: these ids were not generated through /generate by this key's "
            "source, and no CLAW_TOKENIZER is configured to decode them",
            code="text_unknown",
            param="response_ids",
        )
    where = "dataset_fields.data_source"
    resolved = await run_db(reward_function_for, data_source=data_source, field=where)
    sample = RewardSample(
        data_source=data_source,
        response_text=text,
        ground_truth=ground_truth_in(dataset),
        prompt_text=_prompt_text(dataset.get("raw_prompt")),
        metadata={**dataset, "num_turns": num_turns, "extra_fields": extra},
    )
    # Off the database threads: a judge's upstream call may take long.
    result = await asyncio.to_thread(sample_score, resolved=resolved, sample=sample, field=where)
    info = {**result.info, "function": resolved.path}
    return _json({"reward_score": result.score, "reward_extra_info": info})


def _sampling(params: Any) -> dict[str, Any]:
    """Claw-R1's sampling params as the upstream's completion fields."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise HttpError(400, "sampling_params must be a JSON object", param="sampling_params")
    out: dict[str, Any] = {"return_token_ids": True, "skip_special_tokens": False}
    max_tokens = params.get("max_tokens")
    if max_tokens is None:
        max_tokens = settings.CLAW_GENERATE_MAX_TOKENS or None
    elif isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise HttpError(400, "must be a positive integer", param="sampling_params.max_tokens")
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    for name in ("temperature", "top_p", "repetition_penalty"):
        value = params.get(name)
        if value is None:
            value = 1.0
        elif isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise HttpError(400, "must be a non-negative number", param=f"sampling_params.{name}")
        out[name] = value
    if params.get("logprobs"):
        out["logprobs"] = 1
    model = params.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise HttpError(400, "must be a string", param="sampling_params.model")
        out["model"] = model
    return out


def _generated(raw: bytes) -> tuple[list[int], list[float] | None, str | None, str | None]:
    """(token ids, logprobs, finish reason, text) of the upstream's completion answer."""
    try:
        answer = orjson.loads(raw)
        choice = answer["choices"][0]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        raise HttpError(502, "the upstream's answer is not a completion", code="invalid_answer") from None
    if not isinstance(choice, dict):
        raise HttpError(502, "the upstream's answer is not a completion", code="invalid_answer")
    ids = choice.get("token_ids")
    if not isinstance(ids, list) or not all(type(i) is int for i in ids):
        raise HttpError(
            502,
            "the upstream returned no token ids; /generate needs an upstream that honours "
            "return_token_ids (vLLM >= 0.10.2, SGLang)",
            code="no_token_ids",
        )
    logprobs = choice.get("logprobs")
    lps = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    text = choice.get("text")
    return (
        ids,
        lps if isinstance(lps, list) else None,
        choice.get("finish_reason"),
        text if isinstance(text, str) else None,
    )


def _token_ids(value: Any, name: str, *, empty_ok: bool) -> list[int]:
    if not isinstance(value, list) or not all(type(i) is int and 0 <= i <= rules.INT32_MAX for i in value):
        raise HttpError(400, f"{name} must be an array of token ids (integers in [0, 2**31))", param=name)
    if not value and not empty_ok:
        raise HttpError(400, f"{name} must not be empty", param=name)
    if len(value) > settings.CLAW_MAX_TOKENS_PER_STEP:
        raise HttpError(
            400, f"{name} has more than {settings.CLAW_MAX_TOKENS_PER_STEP} token ids", param=name
        )
    return value


def _object(body: dict[str, Any], name: str) -> dict[str, Any]:
    value = body.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise HttpError(400, f"{name} must be a JSON object", param=name)
    return value


def _prompt_text(raw_prompt: Any) -> str | None:
    if isinstance(raw_prompt, list):
        return (
            "\n".join(
                f"{m.get('role', '')}: {m.get('content')}"
                for m in raw_prompt
                if isinstance(m, dict) and isinstance(m.get("content"), str)
            )
            or None
        )
    return raw_prompt if isinstance(raw_prompt, str) else None


def _their_field(field: str | None) -> str | None:
    """An error's field path in Claw-R1's names (``steps[2].prompt_uid``), as the client sent it."""
    if field is None:
        return None
    for theirs, ours in _RENAMED.items():
        field = field.replace(f".{ours}", f".{theirs}")
    return field


def _ingest(batch: list, key: VerifiedKey, channel: str) -> None:
    # Steps of ids this source generated through /generate get the upstream's text (Claw-R1
    # sends none), so pages and rewards have it without a tokenizer.
    textless = [s for s in batch if s.response_text is None and len(s.response_ids)]
    if textless:
        found = generation_texts(source_id=key.source_id, responses=[s.response_ids for s in textless])
        for s, text in zip(textless, found, strict=True):
            s.response_text = text
    steps_ingest(steps=batch, source_id=key.source_id, channel=channel, sources=key.write_sources)


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
    body = json_object(request.body, empty_ok=True, lenient=True)
    found = rules.value_problem(body)
    if found:  # nothing goes upstream or to the database that cannot be stored
        raise HttpError(400, f"{found[0]}: {found[1]}", param=found[0] or None)
    return body


def _metadata(body: dict[str, Any]) -> dict[str, Any] | None:
    meta = body.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise HttpError(400, "metadata must be a JSON object", param="metadata")
    return meta


def _json(payload: dict[str, Any]) -> HttpResponse:
    return HttpResponse(orjson.dumps(payload), content_type="application/json")
