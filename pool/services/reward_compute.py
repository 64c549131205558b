"""Rewards the pool computes itself (pool/rewards/), when a trajectory or a group completes,
and for one sample on request (Claw-R1's ``/compute_reward``).

What a completed trajectory is scored by, read from its last step, then the trajectory,
then its prompt group (the first that has it):

* **data source**: ``metadata["data_source"]`` (Claw-R1 and verl put the dataset row's fields
  in the step metadata), else the group's ``dataset``. The function is the one registered
  for that name (pool/rewards/registry.py), else for the group's dataset;
* **ground truth**: ``metadata["reward_model"]["ground_truth"]`` (verl's layout), else
  ``metadata["ground_truth"]``, else the group's ``ground_truth``;
* **response text**: the step's stored ``response_text`` (what the gateway saw), else the
  text remembered from Claw-R1's ``/generate`` for the same ids, else CLAW_TOKENIZER's
  decoding of the ids; otherwise the rollout fails with "response text unknown";
* **prompt text** (for the judge): the step's chat ``messages``, else
  ``metadata["raw_prompt"]`` (Claw-R1's), else none.

The reward goes through rewards_apply as the last step's and the trajectory's reward
(source "rule" or "model", final, audited as RewardEvents with the function in their
metadata), so every step of the trajectory gets its REWARD_FINAL bit and readiness follows.
A trajectory that already has a reward (its own, the client's) is never scored. A failing
function, an unknown text or a judge fault is recorded as a RewardFailure row for that
trajectory (updated on a retry, deleted once the reward is made) and never stops the other
rollouts. Per-sample functions run in the trajectory's task; group functions (the judge) in
the group's task once the group is complete, over all its unrewarded rollouts at once (a
trajectory without a group is judged alone).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import orjson
from django.db import IntegrityError, transaction
from django.db.models import F, OuterRef, Q, Subquery
from django.utils import timezone

from claw_kit.llm.tokenizer import get_tokenizer

from .. import tokens
from ..errors import Unprocessable
from ..models import PromptGroup, RewardFailure, Step, Trajectory
from ..rewards.base import RewardError, RewardResult, RewardSample, as_result, is_group, source_of
from ..rewards.registry import Resolved, resolve
from ..selectors.steps import generation_texts
from .rewards import RewardIn, rewards_apply

log = logging.getLogger(__name__)

TEXT_UNKNOWN = (
    "response text unknown: the step has no response_text, no text was remembered from "
    "/generate for its ids, and no CLAW_TOKENIZER is configured to decode them"
)


def sample_reward_compute(
    *,
    data_source: str,
    response_text: str,
    ground_truth: Any = None,
    prompt_text: str | None = None,
    metadata: dict[str, Any] | None = None,
    field: str = "data_source",
) -> tuple[RewardResult, Resolved]:
    """Score one sample with the function of ``data_source``; writes nothing. Raises
    Unprocessable (naming ``field``) when no function is registered for it or it fails."""
    resolved = reward_function_for(data_source=data_source, field=field)
    sample = RewardSample(
        data_source=data_source,
        response_text=response_text,
        ground_truth=ground_truth,
        prompt_text=prompt_text,
        metadata=metadata or {},
    )
    return sample_score(resolved=resolved, sample=sample, field=field), resolved


def reward_function_for(*, data_source: str, field: str = "data_source") -> Resolved:
    """The function registered for ``data_source`` (one query); Unprocessable naming
    ``field`` when there is none or its path does not import."""
    try:
        resolved = resolve(data_source)
    except RewardError as e:
        raise Unprocessable(str(e), field=field) from None
    if resolved is None:
        raise Unprocessable(f"no reward function is registered for data source {data_source!r}", field=field)
    return resolved


def sample_score(*, resolved: Resolved, sample: RewardSample, field: str = "data_source") -> RewardResult:
    """Run the function on one sample (no database: callers run it off their database
    thread, a judge call may take long); Unprocessable naming ``field`` when it fails."""
    try:
        [result] = _run(resolved.fn, [sample])
    except Exception as e:  # noqa: BLE001 - any failure of user code is reported, not raised
        raise Unprocessable(
            f"reward function {resolved.path} failed: {_error_text(e)}", field=field
        ) from None
    return result


def trajectory_rewards_compute(*, trajectory_id: int) -> dict[str, int]:
    """Score a completed trajectory with its per-sample function (a group function too when
    it has no group). Idempotent: a trajectory with a reward, or not completed, is skipped.
    Returns counts of rewarded, failed and skipped rollouts."""
    rollouts = _pending(Trajectory.objects.filter(id=trajectory_id, status=Trajectory.Status.COMPLETED))
    return _score(rollouts, group_functions=all(r.group_id is None for r in rollouts))


def group_rewards_compute(*, group_id: int) -> dict[str, int]:
    """Score the unrewarded completed rollouts of a complete group: a group function over all
    of them in one call, per-sample functions one by one. Idempotent (rewarded rollouts are
    skipped); an open or vanished group is skipped."""
    if not PromptGroup.objects.filter(id=group_id, status=PromptGroup.Status.COMPLETE).exists():
        return {"rewarded": 0, "failed": 0, "skipped": 0}
    rollouts = _pending(Trajectory.objects.filter(group_id=group_id, status=Trajectory.Status.COMPLETED))
    return _score(rollouts, group_functions=True)


def response_text_lookup(*, source_id: int | None, response_ids: list[int]) -> str | None:
    """The text of response ids a source generated: remembered from /generate, else
    CLAW_TOKENIZER's decoding; None when neither knows it."""
    [text] = generation_texts(source_id=source_id, responses=[response_ids])
    if text is None:
        text = _decode(response_ids)
    return text


def _decode(ids: Any) -> str | None:

    tok = get_tokenizer()
    if tok is None:
        return None
    return tok.decode(list(map(int, ids)), skip_special_tokens=True)


# --- reading --------------------------------------------------------------------------------------
@dataclass(slots=True)
class _Rollout:
    trajectory_id: int
    trajectory_uid: str
    group_id: int | None
    step: Step
    data_source: str | None
    dataset: str | None
    ground_truth: Any
    text: str | None
    prompt_text: str | None
    metadata: dict[str, Any] = field(default_factory=dict)


def _pending(trajectories: Any) -> list[_Rollout]:
    """The unrewarded rollouts among ``trajectories``: each one's last step, with what it is
    scored by (see the module docstring)."""
    trajs = {t.id: t for t in trajectories.filter(reward__isnull=True).select_related("group").order_by("id")}
    if not trajs:
        return []
    last_index = Step.objects.filter(trajectory_id=OuterRef("trajectory_id")).order_by("-step_index")
    steps = list(
        Step.objects.filter(
            trajectory_id__in=list(trajs),
            step_index=Subquery(last_index.values("step_index")[:1]),
            reward_status=Step.RewardStatus.PENDING,
        )
        .defer("seq_delta", "rollout_logprobs", "seq_hash", "content_hash", "response_hash")
        .order_by("trajectory_id")
    )
    texts = _texts(steps)
    out = []
    for step in steps:
        t = trajs[step.trajectory_id]
        g = t.group
        layers = [step.metadata or {}, t.metadata or {}, (g.metadata if g else None) or {}]
        data_source = _first(m.get("data_source") for m in layers)
        truth = _first(ground_truth_in(m) for m in layers)
        if truth is None and g is not None:
            truth = g.ground_truth
        out.append(
            _Rollout(
                trajectory_id=t.id,
                trajectory_uid=t.uid,
                group_id=t.group_id,
                step=step,
                data_source=data_source if isinstance(data_source, str) else None,
                dataset=(g.dataset or None) if g else None,
                ground_truth=truth,
                text=texts.get(step.id),
                prompt_text=_prompt_text(step),
                metadata=step.metadata or {},
            )
        )
    return out


def _first(values: Any) -> Any:
    for v in values:
        if v is not None:
            return v
    return None


def ground_truth_in(meta: dict[str, Any]) -> Any:
    """``meta["reward_model"]["ground_truth"]`` (verl's layout), else ``meta["ground_truth"]``."""
    rm = meta.get("reward_model")
    if isinstance(rm, dict) and rm.get("ground_truth") is not None:
        return rm["ground_truth"]
    return meta.get("ground_truth")


def _texts(steps: list[Step]) -> dict[int, str]:
    """Response text per step id, where known (stored, remembered, or decoded)."""
    out = {s.id: s.response_text for s in steps if s.response_text is not None}
    missing = [s for s in steps if s.response_text is None]
    if not missing:
        return out
    full = tokens.load_sequences([s.id for s in missing])
    responses = {s.id: tokens.bytes_to_ids(full[s.id])[s.prompt_len :] for s in missing}
    by_source: dict[int | None, list[Step]] = defaultdict(list)
    for s in missing:
        by_source[s.source_id].append(s)
    for source_id, group in by_source.items():
        found = generation_texts(source_id=source_id, responses=[responses[s.id] for s in group])
        out.update({s.id: text for s, text in zip(group, found, strict=True) if text is not None})
    for s in missing:
        if s.id not in out:
            text = _decode(responses[s.id])
            if text is None:
                break  # no tokenizer configured
            out[s.id] = text
    return out


def _prompt_text(step: Step) -> str | None:
    messages = step.messages or (step.metadata or {}).get("raw_prompt")
    if isinstance(messages, list):
        lines = [
            f"{m.get('role', '')}: {m.get('content') or ''}"
            for m in messages
            if isinstance(m, dict) and isinstance(m.get("content") or "", str)
        ]
        return "\n".join(lines) or None
    return messages if isinstance(messages, str) else None


# --- scoring --------------------------------------------------------------------------------------
@dataclass(slots=True)
class _Outcome:
    rewards: list[RewardIn] = field(default_factory=list)
    rewarded: list[_Rollout] = field(default_factory=list)
    failures: list[tuple[_Rollout, str, str]] = field(default_factory=list)  # rollout, path, error
    skipped: int = 0


def _score(rollouts: list[_Rollout], *, group_functions: bool) -> dict[str, int]:
    out = _Outcome()
    buckets: dict[str, tuple[Resolved, list[_Rollout]]] = {}
    for r in rollouts:
        if r.data_source is None and r.dataset is None:
            out.skipped += 1
            continue
        try:
            resolved = resolve(r.data_source, r.dataset)
        except RewardError as e:
            out.failures.append((r, "", str(e)))
            continue
        if resolved is None:
            out.skipped += 1
            continue
        buckets.setdefault(resolved.path, (resolved, []))[1].append(r)
    for resolved, members in buckets.values():
        if is_group(resolved.fn) and not group_functions:
            out.skipped += len(members)  # the group's task scores them together
            continue
        known = []
        for r in members:
            if r.text is None:
                out.failures.append((r, resolved.path, TEXT_UNKNOWN))
            else:
                known.append(r)
        if is_group(resolved.fn):
            _score_together(resolved, known, out)
        else:
            for r in known:
                _score_together(resolved, [r], out)
    _record(out)
    return {"rewarded": len(out.rewarded), "failed": len(out.failures), "skipped": out.skipped}


def _score_together(resolved: Resolved, members: list[_Rollout], out: _Outcome) -> None:
    if not members:
        return
    samples = [
        RewardSample(
            data_source=r.data_source or r.dataset or "",
            response_text=r.text or "",
            ground_truth=r.ground_truth,
            prompt_text=r.prompt_text,
            metadata=r.metadata,
            key=r.trajectory_uid,
        )
        for r in members
    ]
    try:
        results = _run(resolved.fn, samples)
    except Exception as e:  # noqa: BLE001 - user code: recorded, never raised
        log.warning("reward function %s failed: %s", resolved.path, _error_text(e))
        out.failures.extend((r, resolved.path, _error_text(e)) for r in members)
        return
    source = source_of(resolved.fn)
    for r, result in zip(members, results, strict=True):
        meta = {"function": resolved.path, "data_source": resolved.name, "info": _json_safe(result.info)}
        out.rewards.append(RewardIn(reward=result.score, step_uid=r.step.uid, source=source, metadata=meta))
        out.rewards.append(
            RewardIn(reward=result.score, trajectory_uid=r.trajectory_uid, source=source, metadata=meta)
        )
        out.rewarded.append(r)


def _run(fn: Any, samples: list[RewardSample]) -> list[RewardResult]:
    if is_group(fn):
        values = fn(samples)
        if not isinstance(values, list | tuple) or len(values) != len(samples):
            raise RewardError(f"the group reward function returned no list of {len(samples)} scores")
        return [as_result(v) for v in values]
    return [as_result(fn(s)) for s in samples]


def _error_text(e: BaseException) -> str:
    text = (str(e) or type(e).__name__).replace("\x00", "")[:4000]  # PostgreSQL text takes no NUL
    return text if isinstance(e, RewardError) else f"{type(e).__name__}: {text}"


def _json_safe(value: Any) -> Any:
    return orjson.loads(orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS))


# --- writing --------------------------------------------------------------------------------------
@transaction.atomic
def _record(out: _Outcome) -> None:
    """Apply the rewards (one rewards_apply: all or none), then the failures. A rollout that
    got a reward meanwhile (the client's, a concurrent run's) keeps it."""
    if out.rewarded:
        ids = [r.trajectory_id for r in out.rewarded]
        # Delivered ones too (leased or in a snapshot): their rewards are frozen
        # (pool/services/delivery.py), so a late score is dropped, not an error of the task.
        taken = set(
            Trajectory.objects.filter(id__in=ids)
            .filter(Q(reward__isnull=False) | Q(delivered_at__isnull=False))
            .values_list("id", flat=True)
        )
        taken.update(
            Step.objects.filter(
                id__in=[r.step.id for r in out.rewarded], reward_status=Step.RewardStatus.FINAL
            ).values_list("trajectory_id", flat=True)
        )
        kept = [r for r in out.rewarded if r.trajectory_id not in taken]
        keys = {r.trajectory_uid for r in kept} | {r.step.uid for r in kept}
        rewards_apply(rewards=[x for x in out.rewards if (x.trajectory_uid or x.step_uid) in keys])
        RewardFailure.objects.filter(trajectory_id__in=[r.trajectory_id for r in kept]).delete()
    now = timezone.now()
    for r, path, error in out.failures:
        data_source = (r.data_source or r.dataset or "")[:128]
        values = {"step_id": r.step.id, "function": path[:255], "error": error}
        updated = RewardFailure.objects.filter(trajectory_id=r.trajectory_id, data_source=data_source).update(
            attempts=F("attempts") + 1, updated_at=now, **values
        )
        if not updated:
            try:
                with transaction.atomic():
                    RewardFailure.objects.create(
                        trajectory_id=r.trajectory_id, data_source=data_source, **values
                    )
            except IntegrityError:  # a concurrent run recorded it first
                RewardFailure.objects.filter(trajectory_id=r.trajectory_id, data_source=data_source).update(
                    attempts=F("attempts") + 1, updated_at=now, **values
                )
