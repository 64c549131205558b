"""The trainer's verdict, back in the pool: per-step (and optionally per-token) statistics a
trainer computed while training on a lease's steps, posted in bulk by lease (``POST
/api/v1/leases/{id}/verdicts``).

Per step: ``importance_ratio`` (exp of the mean training minus rollout logprob over the
response), ``logprob_kl`` (the KL between the rollout and training policies on the response:
the trainer's estimate, k3 by convention), ``advantage`` and ``clipped_fraction`` (of its
response tokens, by the trainer's clip range); per token, any of those names with one value
per response token. Stored against the step and the lease it came in (``StepVerdict``); the
checkpoint is the lease's (``Lease.checkpoint``, once a checkpoint of its run takes it).

A verdict whose ``logprob_kl`` is above the lease's dataset version's
``serving.policy_mismatch_kl`` flags the step ``policy_mismatch`` (pool.flags.Quality): the
drift between the inference engine and the trainer is visible on the step and trace pages,
and datasets filter on it like any quality flag. A flag is never cleared by a later verdict.
"""

from __future__ import annotations

import math
import uuid
from typing import Annotated, Any

import msgspec
import numpy as np
from django.db import transaction
from django.utils import timezone

from pool.errors import Conflict, InvalidInput, NotFound
from pool.flags import Quality
from pool.models import Step
from pool.services.labels import steps_quality_flag_set

from ..models import Consumer, Lease, StepVerdict
from ..specs import spec_parse, struct_parse
from .consume import MAX_BATCH, Actor
from .lineage import _manifest

STATS = ("importance_ratio", "logprob_kl", "advantage", "clipped_fraction")
ITEM_FIELDS = {"uid", "tokens", *STATS}


class VerdictsIn(msgspec.Struct, forbid_unknown_fields=True):
    """What ``POST /api/v1/leases/<id>/verdicts`` takes: the verdicts contract (the API parses
    with it, its schema is derived from it; ``lease_verdicts_post`` checks each verdict)."""

    steps: Annotated[
        list[dict[str, Any]],
        msgspec.Meta(
            min_length=1,
            max_length=MAX_BATCH,
            description='[{"uid", "importance_ratio", "logprob_kl", "advantage", "clipped_fraction", '
            '"tokens": {name: [one per response token]}}]',
        ),
    ]


def verdicts_parse(raw: Any) -> VerdictsIn:
    """A verdicts body as a VerdictsIn, or InvalidInput naming the field."""
    return struct_parse(raw, VerdictsIn)


def lease_verdicts_post(*, lease_id: uuid.UUID, steps: Any, actor: Actor | None = None) -> dict[str, Any]:
    """Store a trainer's verdicts on steps of lease ``lease_id`` (each a step of its batch,
    once) and flag the steps over the dataset's ``serving.policy_mismatch_kl``. Idempotent:
    a repost replaces the lease's verdict on a step (a flag stays). The lease must be open or
    acked (a nacked or expired lease's steps were not trained on: Conflict); another
    source's lease is NotFound; bad input an InvalidInput naming ``steps[i].field``; nothing
    is written when it raises. Returns how many verdicts were stored and steps flagged."""
    items = _validate(steps)
    lease = _lease(lease_id, actor)
    if lease.status not in (Lease.Status.LEASED, Lease.Status.ACKED):
        raise Conflict(f"lease {lease_id} is {lease.status}: its steps were not trained on", field="lease")
    served = set(_manifest(lease.body).get("step_uids") or [])
    for i, item in enumerate(items):
        if item["uid"] not in served:
            raise InvalidInput(
                f"step {item['uid']!r} is not in lease {lease_id}'s batch", field=f"steps[{i}].uid"
            )
    rows = {
        uid: (sid, seq_len - prompt_len)
        for uid, sid, seq_len, prompt_len in Step.objects.filter(
            uid__in=[x["uid"] for x in items]
        ).values_list("uid", "id", "seq_len", "prompt_len")
    }
    verdicts = []
    now = timezone.now()
    for i, item in enumerate(items):
        if item["uid"] not in rows:
            raise NotFound(f"step {item['uid']!r} was removed from the pool", field=f"steps[{i}].uid")
        sid, n_response = rows[item["uid"]]
        fields, stats = _tokens(item.get("tokens"), n_response, f"steps[{i}].tokens")
        verdicts.append(
            StepVerdict(
                lease_id=lease.id,
                step_id=sid,
                token_fields=fields,
                token_stats=stats,
                created_at=now,
                **{k: item.get(k) for k in STATS},
            )
        )
    threshold = spec_parse(lease.dataset_version.spec).serving.policy_mismatch_kl
    drifting = [
        v.step_id
        for v in verdicts
        if threshold is not None and v.logprob_kl is not None and v.logprob_kl > threshold
    ]
    with transaction.atomic():
        StepVerdict.objects.bulk_create(
            verdicts,
            update_conflicts=True,
            unique_fields=["lease", "step"],
            update_fields=[*STATS, "token_fields", "token_stats", "created_at"],
        )
        flagged = steps_quality_flag_set(step_ids=drifting, flag=int(Quality.POLICY_MISMATCH))
    return {"stored": len(verdicts), "flagged": flagged, "policy_mismatch_kl": threshold}


def _lease(lease_id: uuid.UUID, actor: Actor | None) -> Lease:
    q = Lease.objects.select_related("dataset_version").filter(id=lease_id)
    if actor is not None and not actor.admin:
        q = q.filter(consumer_id__in=Consumer.objects.filter(source_id=actor.source_id).values("id"))
    lease = q.first()
    if lease is None:
        raise NotFound(f"lease {lease_id} does not exist", field="lease")
    return lease


def _validate(steps: Any) -> list[dict[str, Any]]:
    if not isinstance(steps, list) or not 1 <= len(steps) <= MAX_BATCH:
        raise InvalidInput(f"steps must be a list of 1-{MAX_BATCH} verdicts", field="steps")
    seen: set[str] = set()
    for i, item in enumerate(steps):
        where = f"steps[{i}]"
        if not isinstance(item, dict):
            raise InvalidInput("a verdict is a JSON object", field=where)
        unknown = sorted(set(item) - ITEM_FIELDS)
        if unknown:
            raise InvalidInput(f"unknown field {unknown[0]!r}", field=f"{where}.{unknown[0]}")
        uid = item.get("uid")
        if not isinstance(uid, str) or not uid:
            raise InvalidInput("uid: the step's uid", field=f"{where}.uid")
        if uid in seen:
            raise InvalidInput(f"step {uid!r} has two verdicts here", field=f"{where}.uid")
        seen.add(uid)
        for name in STATS:
            value = item.get(name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
            ):
                raise InvalidInput(f"{name} must be a finite number or null", field=f"{where}.{name}")
            if value is not None:
                item[name] = float(value)
    return steps


def _tokens(tokens: Any, n_response: int, where: str) -> tuple[list[str], bytes | None]:
    """The per-token rows: (their names, little-endian float32 rows of n_response values)."""
    if tokens is None:
        return [], None
    if not isinstance(tokens, dict) or not tokens:
        raise InvalidInput(f"tokens maps some of {list(STATS)} to one value per response token", field=where)
    names = sorted(tokens)
    rows = []
    for name in names:
        if name not in STATS:
            raise InvalidInput(f"unknown per-token statistic {name!r}", field=f"{where}.{name}")
        values = tokens[name]
        if not isinstance(values, list) or len(values) != n_response:
            raise InvalidInput(
                f"{name} needs one value per response token ({n_response})", field=f"{where}.{name}"
            )
        try:
            arr = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            raise InvalidInput(f"{name} must be numbers", field=f"{where}.{name}") from None
        if arr.ndim != 1 or not np.isfinite(arr).all() or any(isinstance(v, bool) for v in values):
            raise InvalidInput(f"{name} must be finite numbers", field=f"{where}.{name}")
        rows.append(arr.astype("<f4"))
    return names, np.concatenate(rows).tobytes() if rows else None
