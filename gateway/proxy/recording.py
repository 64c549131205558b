"""From an upstream answer to pool steps.

``record_answer`` runs on a database thread (gateway/proxy/db.py): it turns the agent's
request and the upstream's (whole or accumulated) answer into a ProxiedCall, one choice per
step, and appends it to its trajectory through the pool's one write pipeline
(pool.ingest.pipeline.steps_append). OpenAI notions stay here: choices, n, and drift against the
previous call (the trajectory's tail, which the pipeline hands to ``_steps_of``).

Branches (gateway/proxy/branches.py): a chat call whose messages do not extend any earlier
call's conversation starts a new branch of its trajectory (``branch``, ``parent_step``); that
is not drift. Drift: a step's prompt ids should start with the prompt + response ids of the
call it continues (the previous call, or for a chat call the latest call of the branch its
messages extend). When none of that call's steps is a prefix of the prompt, the step is
stored with ``drift=True`` and ``drift_offset`` = the first mismatching position (the longest
common prefix with any of them). Nothing is repaired or truncated. n > 1: the choices are
alternative answers to one prompt; they take consecutive indexes and carry
``metadata.choice_index`` and ``metadata.n``, and the next call's reference is whichever of
them its prompt extends.

Token ids, in order of preference:
1. the upstream's own (vLLM/SGLang ``return_token_ids``): token_source "upstream", exact;
2. CLAW_TOKENIZER's re-encoding of the text: token_source "retokenized";
3. none: a step without ids is not trainable, so the call is stored as an Event of type
   ``untokenized_call`` holding its text, and no step is written.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.db import DatabaseError

from claw_kit.llm import tokenizer
from pool import tokens
from pool.errors import InvalidInput
from pool.ingest.claim import Tail
from pool.ingest.contract import StepIn
from pool.ingest.media import ImageIn
from pool.ingest.pipeline import (
    AppendRequest,
    AppendTarget,
    append_groupable,
    steps_append,
    steps_append_group,
)
from pool.ingest.plan import Stored
from pool.models import Step
from pool.services.groups import group_upsert
from pool.services.service_events import gateway_event_record
from pool.tenancy import OWN

from . import branches
from .images import chat_images, has_images

CHAT = "chat.completions"
COMPLETIONS = "completions"

# Request fields that are not sampling parameters (recorded elsewhere, or transport only).
_NOT_PARAMS = frozenset({"messages", "prompt", "tools", "stream", "stream_options", "return_token_ids"})


@dataclass(slots=True)
class Identity:
    """Where a call's steps go. ``new``: the gateway minted the trajectory uid."""

    trajectory_uid: str
    prompt_group_uid: str | None = None
    policy_version: int | None = None
    new: bool = False
    task: str | None = None  # X-Claw-Task: the task the prompt group rolls out


@dataclass(slots=True)
class ProxiedChoice:
    """One choice of an upstream answer, with its exact token ids."""

    prompt_ids: np.ndarray
    response_ids: np.ndarray
    rollout_logprobs: np.ndarray | None = None
    finish_reason: str | None = None
    response_text: str | None = None
    metadata: dict = field(default_factory=dict)


@dataclass(slots=True)
class ProxiedCall:
    """A completed upstream call: who made it, what was asked, every choice."""

    trajectory_uid: str
    choices: list[ProxiedChoice]
    token_source: str
    prompt_group_uid: str | None = None
    policy_version: int | None = None
    messages: list | None = None
    metadata: dict = field(default_factory=dict)
    # The gateway minted the trajectory uid for this call: no row can exist yet.
    new_trajectory: bool = False
    # Set while building its steps: (branches before it, its messages' hash chain, the decision).
    branching: tuple[branches.Branches, list[bytes], branches.Decision] | None = None
    # The images of its messages, in order (gateway/proxy/images.py); every choice's step has them.
    images: list[ImageIn] = field(default_factory=list)


@dataclass(slots=True)
class RecordedStep:
    uid: str
    step_index: int
    drift: bool
    drift_offset: int | None
    branch: int = 0


@dataclass(slots=True)
class Outcome:
    steps: list[RecordedStep] = field(default_factory=list)
    event: str | None = None  # the Event type stored instead of steps, if any


def record_answer(
    *,
    endpoint: str,
    ident: Identity,
    request: dict[str, Any],
    answer: dict[str, Any],
    source_id: int | None,
    extra: dict[str, Any] | None = None,
    sources: frozenset[int] | None | object = OWN,
) -> Outcome:
    """Store the call as steps (or as an Event when it cannot be a step); see the module
    docstring. ``extra``: metadata a door adds to every step (its protocol, its reply id).
    Raises Conflict when the trajectory takes no steps (ended, other group)."""
    call = build_call(endpoint=endpoint, ident=ident, request=request, answer=answer, extra=extra)
    if call is None:
        gateway_event_record(
            type="untokenized_call",
            trajectory_uid=ident.trajectory_uid,
            source_id=source_id,
            payload={
                "reason": "the upstream returned no token ids and no local tokenizer is configured (CLAW_TOKENIZER)",
                **_text_of(endpoint, request, answer),
            },
        )
        return Outcome(event="untokenized_call")
    try:
        if ident.task is not None and ident.prompt_group_uid is not None:
            # The group names its task (created with it when new): pool/services/task_catalog.py.
            group_upsert(uid=ident.prompt_group_uid, task=ident.task, source_id=source_id, sources=sources)
        return Outcome(steps=record_call(call=call, source_id=source_id, sources=sources))
    except InvalidInput as exc:  # e.g. longer than CLAW_MAX_TOKENS_PER_STEP: never truncated
        gateway_event_record(
            type="unrecorded_call",
            trajectory_uid=ident.trajectory_uid,
            source_id=source_id,
            payload={"reason": exc.message, "field": exc.field, **_text_of(endpoint, request, answer)},
        )
        return Outcome(event="unrecorded_call")


@dataclass(slots=True)
class RecordJob:
    """A call for :func:`record_group`: :func:`record_answer`'s arguments."""

    endpoint: str
    ident: Identity
    request: dict[str, Any]
    answer: dict[str, Any]
    source_id: int | None
    sources: frozenset[int] | None | object = OWN
    extra: dict[str, Any] | None = None


def groupable(endpoint: str, ident: Identity, request: dict[str, Any], answer: dict[str, Any]) -> bool:
    """Whether the call may be recorded in a group commit (:func:`record_group`): one choice,
    no images, no task to name, and a trajectory whose fused append applies (memory only: the
    event loop asks)."""
    choices = answer.get("choices")
    if ident.task is not None or not isinstance(choices, list) or len(choices) != 1:
        return False
    if endpoint == CHAT and has_images(request):
        return False
    return append_groupable(
        _target(ident.trajectory_uid, ident.prompt_group_uid, ident.policy_version, ident.new), 1
    )


def record_group(jobs: list[RecordJob]) -> list[Outcome | None]:
    """Record the calls of ``jobs`` as :func:`record_answer` does, their steps committed
    together (pool.ingest.pipeline.steps_append_group; the proxied calls' writer thread,
    gateway/proxy/db.py). None for a call that did not join (anything but a plain fused
    append, or a database error that rolled the group back): the caller records it alone,
    with record_answer, which decides and answers for it."""
    calls: list[ProxiedCall | None] = []
    requests: list[AppendRequest] = []
    for job in jobs:
        call = build_call(
            endpoint=job.endpoint, ident=job.ident, request=job.request, answer=job.answer, extra=job.extra
        )
        if call is None or len(call.choices) != 1 or call.images:
            calls.append(None)
            continue
        calls.append(call)
        requests.append(
            AppendRequest(
                target=_target(
                    call.trajectory_uid, call.prompt_group_uid, call.policy_version, call.new_trajectory
                ),
                count=1,
                build=functools.partial(_steps_of, call),
                source_id=job.source_id,
                sources=job.sources,
            )
        )
    try:
        written = iter(steps_append_group(requests))
    except DatabaseError:
        return [None] * len(jobs)
    out: list[Outcome | None] = []
    for call in calls:
        steps = next(written) if call is not None else None
        out.append(None if call is None or steps is None else Outcome(steps=_recorded(call, steps)))
    return out


def record_call(
    *, call: ProxiedCall, source_id: int | None, sources: frozenset[int] | None | object = OWN
) -> list[RecordedStep]:
    """Append one step per choice of ``call`` to its trajectory (pool.ingest.pipeline.steps_append):
    atomic, committed before the agent gets its answer; not idempotent (every call is a new
    generation). ``sources``: the writer's (pool/tenancy.py; None: any). Raises Conflict
    when the trajectory has ended or belongs to another group (UidTaken: another source),
    InvalidInput when a step breaks a rule (e.g. CLAW_MAX_TOKENS_PER_STEP, never truncated)."""
    written = steps_append(
        target=_target(call.trajectory_uid, call.prompt_group_uid, call.policy_version, call.new_trajectory),
        count=len(call.choices),
        build=lambda tail: _steps_of(call, tail),
        source_id=source_id,
        sources=sources,
    )
    return _recorded(call, written)


def _target(trajectory_uid: str, group_uid: str | None, version: int | None, new: bool) -> AppendTarget:
    return AppendTarget(
        trajectory_uid=trajectory_uid, prompt_group_uid=group_uid, policy_version=version, new=new
    )


def _recorded(call: ProxiedCall, written: list[StepIn]) -> list[RecordedStep]:
    """After the write: the branch tips the call leaves (branches.known), its steps."""
    if call.branching is not None:
        state, messages_chain, decision = call.branching
        tips = [
            branches.Tip(
                step_id=s.row_id or 0,  # set by the pipeline once written
                branch=decision.branch,
                chain=messages_chain
                + branches.chain(
                    [branches.reply_message(c.response_text, c.metadata)],
                    start=messages_chain[-1] if messages_chain else b"",
                ),
            )
            for s, c in zip(written, call.choices, strict=True)
        ]
        branches.known.put(call.trajectory_uid, branches.after(state, written[-1].step_index + 1, tips))
    return [RecordedStep(s.uid, s.step_index, s.drift, s.drift_offset, s.branch) for s in written]


def _steps_of(call: ProxiedCall, tail: Tail) -> list[StepIn]:
    """The call's steps, one per choice, with their branch (gateway/proxy/branches.py) and
    their drift against the call they continue."""
    n = len(call.choices)
    out = []
    decision, against = _branch(call, tail)
    for i, c in enumerate(call.choices):
        drift, offset = _drift(c.prompt_ids, against) if against is not None else (False, None)
        meta = dict(call.metadata)
        if decision is not None and not decision.continued and decision.parent is not None:
            meta["branched_after_messages"] = decision.common
        meta.update(c.metadata)
        if n > 1:
            meta["choice_index"] = i
            meta["n"] = n
        out.append(
            StepIn(
                trajectory_uid=call.trajectory_uid,
                step_index=0,  # numbered by the pipeline once claimed
                prompt_ids=c.prompt_ids,
                response_ids=c.response_ids,
                rollout_logprobs=c.rollout_logprobs,
                finish_reason=c.finish_reason[:32] if c.finish_reason else None,
                messages=call.messages,
                response_text=c.response_text,
                metadata=meta,
                token_source=call.token_source,
                drift=drift,
                drift_offset=offset,
                branch=decision.branch if decision is not None else 0,
                parent_step_id=decision.parent.step_id if decision is not None and decision.parent else None,
                field_prefix=f"choices[{i}]",
                images=list(call.images),
            )
        )
    return out


def _branch(call: ProxiedCall, tail: Tail) -> tuple[branches.Decision | None, Tail | None]:
    """(the call's branch decision, the steps its drift is measured against: None for a new
    branch). Calls without messages, and calls after steps without messages, keep the
    token-only rule: drift against the previous call, branch 0."""
    call.branching = None
    if call.messages is None:
        return None, tail
    state = branches.known.get(call.trajectory_uid, tail.end) or branches.load(call.trajectory_uid, tail.end)
    if tail.end > 0 and not state.tips:
        return None, tail
    messages_chain = branches.chain(call.messages)
    decision = branches.decide(state, messages_chain)
    call.branching = (state, messages_chain, decision)
    if not decision.continued or decision.parent is None:
        return decision, None
    if any(s.id == decision.parent.step_id for s in tail.steps):
        return decision, tail
    # It continues a branch other than the previous call's (a main agent after its sub-agent).
    stored = Stored(decision.parent.step_id, 0, branches.tip_ids(decision.parent.step_id))
    return decision, Tail(end=tail.end, steps=[stored])


def _drift(prompt: np.ndarray, tail: Tail) -> tuple[bool, int | None]:
    """(drift, first mismatching position) of ``prompt`` against the previous call: no drift
    when the prompt starts with any previous choice's prompt + response."""
    if not tail.steps:
        return False, None
    best = -1
    for p in tail.steps:
        shared = tokens.common_prefix_len(prompt, p.full)
        if shared == len(p.full):
            return False, None
        best = max(best, shared)
    return True, best


def build_call(
    *,
    endpoint: str,
    ident: Identity,
    request: dict[str, Any],
    answer: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> ProxiedCall | None:
    """The ProxiedCall of an answer, or None when no token ids can be had."""
    chat = endpoint == CHAT
    raws = sorted(
        (c for c in answer.get("choices") or () if isinstance(c, dict)), key=lambda c: c.get("index", 0)
    )
    top_prompt = answer.get("prompt_token_ids")
    exact: list[tuple[np.ndarray, np.ndarray] | None] = []
    for raw in raws:
        prompt = _ids(raw.get("prompt_token_ids", top_prompt))
        response = _ids(raw.get("token_ids"))
        exact.append((prompt, response) if prompt is not None and response is not None else None)
    token_source = Step.TokenSource.UPSTREAM
    tok = None
    if not raws or any(e is None for e in exact):
        tok = tokenizer.get_tokenizer()
        if tok is None or not raws:
            return None
        token_source = Step.TokenSource.RETOKENIZED
    choices = []
    for raw, ids in zip(raws, exact, strict=True):
        if tok is not None:
            ids = _retokenize(tok, chat, request, raw)
        prompt_ids, response_ids = ids  # type: ignore[misc]
        choices.append(
            ProxiedChoice(
                prompt_ids=prompt_ids,
                response_ids=response_ids,
                rollout_logprobs=_logprobs(raw, chat, len(response_ids)),
                finish_reason=raw.get("finish_reason"),
                response_text=_reply_text(raw, chat),
                metadata=_choice_meta(raw, chat, request),
            )
        )
    meta: dict[str, Any] = {"endpoint": endpoint, "model": answer.get("model") or request.get("model")}
    if answer.get("id"):
        meta["response_id"] = answer["id"]
    if answer.get("usage"):
        meta["usage"] = answer["usage"]
    if request.get("tools"):
        meta["tools"] = request["tools"]
    meta["params"] = {k: v for k, v in request.items() if k not in _NOT_PARAMS}
    if extra:
        meta.update(extra)
    # Images: stored once by content; the messages keep each one's download path instead of
    # its bytes (a screenshot agent re-sends its last screenshots in every call).
    images, messages = chat_images(request.get("messages")) if chat else ([], None)
    return ProxiedCall(
        trajectory_uid=ident.trajectory_uid,
        prompt_group_uid=ident.prompt_group_uid,
        policy_version=ident.policy_version,
        new_trajectory=ident.new,
        token_source=token_source,
        messages=messages,
        metadata=meta,
        choices=choices,
        images=images,
    )


# --- helpers ------------------------------------------------------------------------------------
def _ids(raw: Any) -> np.ndarray | None:
    """An int32 array of token ids, or None when ``raw`` is not a list of ids in [0, 2**31).
    struct packs a list of ints three times faster than array("i") or numpy (a 2.4k-token
    prompt: 17 against 55 us here), and refuses non-ints and values past int32 as they do."""
    if not isinstance(raw, list):
        return None
    buf = bytearray(4 * len(raw))
    try:
        struct.pack_into(f"{len(raw)}i", buf, 0, *raw)
    except struct.error:
        return None
    arr = np.frombuffer(buf, dtype=np.int32)
    if len(arr) and int(arr.min()) < 0:
        return None
    return arr


def _retokenize(
    tok: Any, chat: bool, request: dict[str, Any], raw: dict[str, Any]
) -> tuple[np.ndarray, np.ndarray]:
    if chat:
        reply = {k: v for k, v in (raw.get("message") or {}).items() if v is not None}
        reply.setdefault("role", "assistant")
        prompt, response = tokenizer.chat_ids(tok, request.get("messages") or [], request.get("tools"), reply)
    else:
        prompt, response = tokenizer.completion_ids(
            tok, _completion_prompt(request, raw), raw.get("text") or ""
        )
    return np.asarray(prompt, dtype=np.int32), np.asarray(response, dtype=np.int32)


def _completion_prompt(request: dict[str, Any], raw: dict[str, Any]) -> Any:
    """The prompt a completion choice answers (batched prompts: choice index // n)."""
    prompt = request.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        n = request.get("n") or 1
        i = min(raw.get("index", 0) // max(1, int(n)), len(prompt) - 1)
        return prompt[i]
    return prompt


def _logprobs(raw: dict[str, Any], chat: bool, n_tokens: int) -> np.ndarray | None:
    """Per-token logprobs of the response, when the upstream gave one finite value per id."""
    lp = raw.get("logprobs")
    if not isinstance(lp, dict):
        return None
    if chat:
        entries = lp.get("content")
        values = (
            [e.get("logprob") for e in entries if isinstance(e, dict)] if isinstance(entries, list) else None
        )
    else:
        values = lp.get("token_logprobs")
    if not isinstance(values, list) or len(values) != n_tokens or n_tokens == 0:
        return None
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return arr if bool(np.isfinite(arr).all()) else None


def _reply_text(raw: dict[str, Any], chat: bool) -> str | None:
    if chat:
        content = (raw.get("message") or {}).get("content")
        return content if isinstance(content, str) else None
    text = raw.get("text")
    return text if isinstance(text, str) else None


def _choice_meta(raw: dict[str, Any], chat: bool, request: dict[str, Any]) -> dict[str, Any]:
    """Per-choice fields worth keeping: tool calls and any other reply field (reasoning...)."""
    if chat:
        message = raw.get("message") or {}
        return {k: v for k, v in message.items() if k not in ("role", "content") and v is not None}
    prompt = _completion_prompt(request, raw)
    return {"prompt": prompt} if isinstance(prompt, str) else {}


def _text_of(endpoint: str, request: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    """The call as text, for an Event: what was asked and what came back."""
    chat = endpoint == CHAT
    out: dict[str, Any] = {"endpoint": endpoint, "model": answer.get("model") or request.get("model")}
    if chat:
        out["messages"] = request.get("messages")
        if request.get("tools"):
            out["tools"] = request["tools"]
    else:
        out["prompt"] = request.get("prompt")
    out["choices"] = [
        {
            "index": c.get("index"),
            "finish_reason": c.get("finish_reason"),
            **({"message": c.get("message")} if chat else {"text": c.get("text")}),
        }
        for c in answer.get("choices") or ()
        if isinstance(c, dict)
    ]
    return out
