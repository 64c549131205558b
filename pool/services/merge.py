"""Prefix-tree merge results: compute, store and serve them.

The merge itself is claw_client.prefix_tree (numpy, shared with trainers). This module
feeds it the pool's token bytes, stores the result as a MergeResult and renders it.

What is stored
--------------
``MergeResult.layout`` holds ``PrefixTree.to_bytes(extra={"step_ids": ...})``: the unique
tokens (4 bytes each) and O(N) integers per merged step (sort order, LCP, lengths, prompt
lengths, step ids), zlib-compressed. Everything else (position ids, parents, subtree ends,
per-step indices, radix nodes) is rebuilt from it in O(U + N) without a sort and without
reading a single step row. Cost: about 4 bytes per unique token, e.g. 144 kB for a
W-agentic group, so the API and trainers read one row instead of every step's delta chain,
and the layout can never disagree with the stats stored next to it.

Idempotency
-----------
``input_hash`` fingerprints the ordered inputs (step id, prompt length, seq_hash). A merge
whose stored hash matches (status done or failed) is skipped. Two workers racing on one key
both compute and the last writer wins; should an older input win the race, its hash no
longer matches the group's and the next request recomputes.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from django.db import transaction

from claw_client import PrefixTree, build_prefix_tree

from .. import tokens
from ..bus import GroupMergeRequested, MergeDone, StepsMergeRequested, emit
from ..errors import NotFound
from ..models import MergeResult, PromptGroup, Step

log = logging.getLogger(__name__)

# Largest group (in step tokens) that GET .../prefix-tree merges synchronously when no
# current result exists. bench.prefix builds ~100-300 M tokens/s, so 2 M tokens is well
# under 100 ms of CPU including the token load; larger groups go to the Celery queue (202).
MERGE_SYNC_MAX_TOKENS = 2_000_000
# Node token spans in the API are cut to this many ids (with "truncated": true).
NODE_TOKENS_SHOWN = 64

_Input = tuple[int, int, bytes, int]  # step id, prompt_len, seq_hash, seq_len


def group_merge_compute(*, group_id: int) -> MergeResult | None:
    """Merge the steps of prompt group ``group_id`` (in step id order) and store the result
    under key ``group:<uid>``.

    Idempotent: an unchanged input is skipped and the stored result returned. Returns None
    when the group no longer exists. A merge that fails on the data itself is stored with
    status "failed" and its error (retrying would fail the same way); database errors
    propagate so that the task can retry.
    """
    group = PromptGroup.objects.filter(id=group_id).only("id", "uid").first()
    if group is None:
        return None
    return _merge(key=group_key(group.uid), group_id=group.id, inputs=_group_inputs(group.id))


def steps_merge_compute(*, key: str, step_ids: Sequence[int]) -> MergeResult:
    """Merge the given steps, in the given order, and store the result under ``key`` (e.g.
    "batch:<id>", "snapshot:<id>"): the on-demand merge of a batch or snapshot.

    Idempotent like :func:`group_merge_compute`. Raises NotFound if a step does not exist
    (nothing is stored).
    """
    ids = list(dict.fromkeys(int(i) for i in step_ids))
    rows = {
        r[0]: r
        for r in Step.objects.filter(id__in=ids).values_list("id", "prompt_len", "seq_hash", "seq_len")
    }
    missing = [i for i in ids if i not in rows]
    if missing:
        raise NotFound(f"{len(missing)} step(s) do not exist, e.g. id {missing[0]}", field="step_ids")
    return _merge(key=key, group_id=None, inputs=[_as_input(rows[i]) for i in ids])


def steps_merge_enqueue(*, key: str, step_ids: Sequence[int]) -> None:
    """Enqueue :func:`steps_merge_compute` once the caller's transaction commits (an effect
    of ``StepsMergeRequested``, pool/tasks.py)."""
    emit(StepsMergeRequested(key=key, step_ids=tuple(int(i) for i in step_ids)))


def group_merge_ensure(*, uid: str, sync_max_tokens: int | None = None) -> MergeResult:
    """The current merge of group ``uid``, for reads.

    If the stored result matches the group's current steps it is returned as is. Otherwise a
    group of at most ``sync_max_tokens`` step tokens is merged now; a larger one gets a
    "pending" result and its merge is enqueued on commit. ``sync_max_tokens`` defaults to
    MERGE_SYNC_MAX_TOKENS. Raises NotFound for an unknown group. Idempotent.
    """
    group = PromptGroup.objects.filter(uid=uid).only("id", "uid").first()
    if group is None:
        raise NotFound(f"prompt group {uid!r} does not exist", field="uid")
    inputs = _group_inputs(group.id)
    key = group_key(group.uid)
    current = MergeResult.objects.filter(key=key).first()
    if current is not None and _is_current(current, _input_hash(inputs)):
        return current
    limit = MERGE_SYNC_MAX_TOKENS if sync_max_tokens is None else sync_max_tokens
    if sum(i[3] for i in inputs) <= limit:
        return _merge(key=key, group_id=group.id, inputs=inputs)
    with transaction.atomic():
        row, _ = MergeResult.objects.select_for_update().get_or_create(
            key=key, defaults={"group_id": group.id}
        )
        if row.status != MergeResult.Status.PENDING:
            row.status = MergeResult.Status.PENDING
            row.save(update_fields=["status", "updated_at"])
        emit(GroupMergeRequested(group_id=group.id))
    return row


def merge_tree_render(result: MergeResult, *, node_tokens: int = NODE_TOKENS_SHOWN) -> dict[str, Any]:
    """The API form of a merge: stats, and the radix tree's nodes when it is done.

    Each node: ``id``, ``parent`` (node id or null), ``start``/``length`` (packed span),
    ``tokens`` (at most ``node_tokens`` ids, ``truncated`` says if cut), ``steps`` (uids of
    the steps passing through it) and ``size`` (tokens in its subtree). One query for the
    step uids; the layout is rebuilt from the stored bytes.
    """
    body: dict[str, Any] = {
        "key": result.key,
        "status": result.status,
        "n_sequences": result.n_sequences,
        "total_tokens": result.total_tokens,
        "unique_tokens": result.unique_tokens,
        "ratio": result.ratio,
        "savings": result.savings,
        "error": result.error or None,
        "updated_at": result.updated_at,
        "nodes": [],
    }
    if result.status != MergeResult.Status.DONE or not result.layout:
        return body
    tree, extra = PrefixTree.from_bytes(bytes(result.layout))
    step_ids = extra["step_ids"].tolist()
    uids = dict(Step.objects.filter(id__in=step_ids).values_list("id", "uid"))
    ids = tree.input_ids
    body["nodes"] = [
        {
            "id": n["id"],
            "parent": n["parent"],
            "start": n["start"],
            "length": n["length"],
            "tokens": ids[n["start"] : n["start"] + min(n["length"], node_tokens)].tolist(),
            "truncated": n["length"] > node_tokens,
            "steps": [uids.get(step_ids[i]) for i in n["sequences"]],
            "size": n["size"],
        }
        for n in tree.nodes()
    ]
    return body


def group_key(uid: str) -> str:
    return f"group:{uid}"


# --- helpers ----------------------------------------------------------------------------------
def _group_inputs(group_id: int) -> list[_Input]:
    rows = (
        Step.objects.filter(trajectory__group_id=group_id)
        .order_by("id")
        .values_list("id", "prompt_len", "seq_hash", "seq_len")
    )
    return [_as_input(r) for r in rows]


def _as_input(row: tuple) -> _Input:
    return (row[0], row[1], bytes(row[2]), row[3])


def _input_hash(inputs: Sequence[_Input]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for step_id, prompt_len, seq_hash, _ in inputs:
        h.update(struct.pack("<qI", step_id, prompt_len))
        h.update(seq_hash)
    return h.digest()


def _is_current(row: MergeResult, input_hash: bytes) -> bool:
    done = row.status in (MergeResult.Status.DONE, MergeResult.Status.FAILED)
    return done and row.input_hash is not None and bytes(row.input_hash) == input_hash


def _merge(*, key: str, group_id: int | None, inputs: Sequence[_Input]) -> MergeResult:
    input_hash = _input_hash(inputs)
    current = MergeResult.objects.filter(key=key).defer("layout").first()
    if current is not None and _is_current(current, input_hash):
        return current
    ids = [i[0] for i in inputs]
    fields: dict[str, Any] = {"n_sequences": len(ids), "input_hash": input_hash, "group_id": group_id}
    try:
        full = tokens.load_sequences(ids)
        t0 = time.perf_counter()
        tree = build_prefix_tree([full[i] for i in ids], [i[1] for i in inputs])
        build_ms = (time.perf_counter() - t0) * 1e3
        layout = tree.to_bytes(extra={"step_ids": np.asarray(ids, dtype=np.int64)})
        stats = tree.stats
        fields.update(
            status=MergeResult.Status.DONE,
            error="",
            total_tokens=stats.total_tokens,
            unique_tokens=stats.unique_tokens,
            layout=layout,
            stats={**stats.as_dict(), "build_ms": round(build_ms, 3), "layout_bytes": len(layout)},
        )
    except ValueError as exc:  # malformed stored tokens: deterministic, a retry would fail again
        log.exception("prefix-tree merge %s failed", key)
        fields.update(
            status=MergeResult.Status.FAILED,
            error=str(exc),
            layout=None,
            total_tokens=0,
            unique_tokens=0,
            stats={},
        )
    with transaction.atomic():
        row, _ = MergeResult.objects.select_for_update().get_or_create(
            key=key, defaults={"group_id": group_id}
        )
        for name, value in fields.items():
            setattr(row, name, value)
        row.save()
        if group_id is not None and row.status == MergeResult.Status.DONE:
            emit(
                MergeDone(
                    group_uid=key.removeprefix("group:"),
                    group_id=group_id,
                    tokens=row.total_tokens,
                    tokens_saved=row.total_tokens - row.unique_tokens,
                )
            )
    return row
