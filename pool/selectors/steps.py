"""Reads of steps: the API representation of steps (token ids rebuilt exactly), the last
step of each branch and the discounted returns along it, a door's remembered upstream texts, and the step a Responses call
answered with."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from django.db.models import Max, QuerySet, TextField
from django.db.models.functions import Cast

from .. import compiled, flags, tokens
from ..flags import READY, Readiness
from ..generation_texts import response_ids_hash
from ..lookups import Many
from ..models import GenerationText, Step, StepMedia
from ..tenancy import Sources
from ..tenancy import q as of_sources

REWARD_FINAL = int(Readiness.REWARD_FINAL)


# The columns a step row is read from, as plain tuples (no Step, Trajectory or PromptGroup
# instances are built): every representation of a step (the API's reads, a pull's batch, a
# snapshot's files, the pages' token views) comes from ``steps_read``.
_COLUMNS = (
    "id",
    "uid",
    "trajectory_id",
    "trajectory__uid",
    "trajectory__group__uid",
    "step_index",
    "prompt_len",
    "rollout_logprobs",
    "token_rewards",
    "token_versions",
    "effective_reward",
    "effective_reward_source",
    "policy_version_id",
    "is_last",
    "finish_reason",
    "reward_scope",
    "outcome_reward",
    "process_reward",
    "token_source",
    "drift",
    "drift_offset",
    "branch",
    "parent_step_id",
    "created_at",
    "readiness",
    "quality_flags",
    "label",
)
# Then, with the texts, the response text; last the JSON columns, read as their text and
# parsed with orjson (Django's JSONField parses with the standard library: 16 us of a W-pool
# step's metadata, more than the rest of its row): the metadata, and with the texts the
# messages.
_PARENT = _COLUMNS.index("parent_step_id")


def _columns(texts: bool) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The fields and the named expressions a step row is read from, in ``_rows``' order."""
    if texts:
        return (*_COLUMNS, "response_text"), {
            "metadata_json": Cast("metadata", TextField()),
            "messages_json": Cast("messages", TextField()),
        }
    return _COLUMNS, {"metadata_json": Cast("metadata", TextField())}


def _json(text: str | None) -> Any:
    """A JSON column's value from its text (None for SQL NULL). orjson refuses what the
    standard library takes (integers past 64 bits): those go through ``json``."""
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


@dataclass(slots=True)
class StepRows:
    """Steps as read: their rows (the API representation, below) and, row by row, what a
    file writer builds its columns from without converting the arrays back (the raw token,
    logprob and per-token reward bytes), with each step's id, trajectory id and branch."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    trajectory_ids: list[int] = field(default_factory=list)
    branches: list[int] = field(default_factory=list)
    prompts: list[bytes] = field(default_factory=list)
    responses: list[bytes] = field(default_factory=list)
    logprobs: list[bytes | None] = field(default_factory=list)
    token_rewards: list[bytes | None] = field(default_factory=list)


def steps_read(ids: Sequence[int], *, order: Sequence[str] | None = None, texts: bool = True) -> StepRows:
    """The one reader of steps: each row the API representation, token ids rebuilt exactly
    (three queries for any number of steps: the rows, the token chains, the images; a fourth
    for the parent uids of proxied branches).

    Rows come in the order of ``ids``, or the database's ``order`` (field names) when given; an
    id with no step is left out. Field names and order are the step contract's
    (pool.ingest.contract.READ_FIELDS): the write fields, then what the pool sets, so a read
    returns what was written. ``texts=False`` leaves ``messages`` and ``response_text`` out
    (unread: a snapshot's files do not hold them). Arrays are numpy (the JSON renderer
    serialises them natively, without a Python list per token)."""
    if not ids:
        return StepRows()
    order = tuple(order) if order is not None else None
    rows = compiled.read(_steps_by_id(texts, order), ids=Many(ids))
    if order is not None:
        read = rows
    else:
        found = {r[0]: r for r in rows}
        read = [found[i] for i in ids if i in found]
    return _rows(read, texts=texts)


@compiled.shaped
def _steps_by_id(texts: bool, order: tuple[str, ...] | None):
    """The build of ``steps_read``'s row query (pool/compiled.py: compiled once per shape)."""

    def build(*, ids: Many):
        fields, json_columns = _columns(texts)
        qs = Step.objects.filter(id__any=ids).values_list(*fields, *json_columns.values())
        return qs.order_by(*order) if order is not None else qs

    return build


def _names(cache: dict[int, list[str]], value: int, table: dict[str, int]) -> list[str]:
    """``flags.names(value, table)`` through ``cache`` (a fresh list per row)."""
    got = cache.get(value)
    if got is None:
        got = cache[value] = flags.names(value, table)
    return list(got)


def steps_render(steps: Sequence[Step] | Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The API representation of these steps, in their order: Step instances (only their
    ids are used: ``steps_read`` reads the rest) or the value rows ``steps_listed`` and
    ``step_get`` read (built as they are, no second read)."""
    if steps and isinstance(steps[0], dict):
        return _rows([tuple(v.values()) for v in steps], texts=True).rows
    return steps_read([s.id for s in steps]).rows


def _rows(read: list[tuple[Any, ...]], *, texts: bool) -> StepRows:
    """Rows from the columns read (``_columns(texts)``), with
    their token chains, images and branch parents (a query each, the last only for steps on
    a proxied branch)."""
    out = StepRows()
    if not read:
        return out
    step_ids = [r[0] for r in read]
    full = tokens.load_sequences(step_ids)
    images = step_images(step_ids)
    parents = {r[_PARENT] for r in read if r[_PARENT] is not None}
    # Only steps on a branch (proxied chat calls) have a parent: no query for any other page.
    parent_uids = dict(Step.objects.filter(id__in=parents).values_list("id", "uid")) if parents else {}
    # The flag names of each bit pattern, computed once per pattern (a batch holds few).
    readiness_of: dict[int, list[str]] = {}
    quality_of: dict[int, list[str]] = {}
    lp_dtype, token_dtype, token_bytes = tokens.LOGPROB_DTYPE, tokens.TOKEN_DTYPE, tokens.TOKEN_BYTES
    n = len(_COLUMNS)
    for r in read:
        (
            sid, uid, traj_id, traj_uid, group_uid, step_index, prompt_len, lp, token_rewards,
            token_runs, reward, reward_source, policy_version, is_last, finish_reason,
            reward_scope, outcome_reward, process_reward, token_source, drift, drift_offset,
            branch, parent_id, created_at, readiness, quality, label,
        ) = r[:n]  # fmt: skip
        metadata = r[n + 1] if texts else r[n]
        seq = full[sid]
        cut = prompt_len * token_bytes
        prompt, response = seq[:cut], seq[cut:]
        lp = bytes(lp) if lp is not None else None
        token_rewards = bytes(token_rewards) if token_rewards is not None else None
        row = {  # contract.READ_FIELDS, in order (tests/pool/test_ingest_contract.py)
            "trajectory_uid": traj_uid,
            "prompt_group_uid": group_uid,
            "step_index": step_index,
            "prompt_ids": np.frombuffer(prompt, dtype=token_dtype),
            "response_ids": np.frombuffer(response, dtype=token_dtype),
            "uid": uid,
            "rollout_logprobs": np.frombuffer(lp, dtype=lp_dtype) if lp is not None else None,
            "token_rewards": np.frombuffer(token_rewards, dtype=lp_dtype)
            if token_rewards is not None
            else None,
            "token_policy_versions": (
                tokens.bytes_to_runs(bytes(token_runs)) if token_runs is not None else None
            ),
            # The effective reward (pool/services/effective_reward.py): its own, else its
            # branch's outcome; reward_scope says which. The two kinds apart: outcome_reward
            # and process_reward (after reward_scope).
            "reward": reward,
            "reward_source": reward_source,
            "policy_version": policy_version,
            "is_last": is_last,
            "finish_reason": finish_reason,
        }
        if texts:
            row["messages"], row["response_text"] = _json(r[n + 2]), r[n]
        step_images_ = images.get(sid)
        row |= {
            "metadata": _json(metadata),
            "multi_modal_data": {"images": step_images_} if step_images_ is not None else None,
            # Step.effective_reward_status
            "reward_status": "final" if readiness & REWARD_FINAL else "pending",
            "reward_scope": reward_scope,
            "outcome_reward": outcome_reward,
            "process_reward": process_reward,
            "token_source": token_source,
            "drift": drift,
            "drift_offset": drift_offset,
            "branch": branch,
            "parent_step_uid": parent_uids.get(parent_id) if parent_id is not None else None,
            "created_at": created_at,
            "ready": readiness == READY,
            "readiness": _names(readiness_of, readiness, flags.READINESS_NAMES),
            "quality_flags": _names(quality_of, quality, flags.QUALITY_NAMES),
            "label": label or None,
            "images": step_images_ or [],
        }
        out.rows.append(row)
        out.ids.append(sid)
        out.trajectory_ids.append(traj_id)
        out.branches.append(branch)
        out.prompts.append(prompt)
        out.responses.append(response)
        out.logprobs.append(lp)
        out.token_rewards.append(token_rewards)
    return out


def _images_of(*, ids: Many):
    """The build of ``step_images``' query (pool/compiled.py)."""
    return (
        StepMedia.objects.filter(step_id__any=ids)
        .order_by("step_id", "position")
        .values_list(
            "step_id", "kind", "source_url", "message_index", "part_index", "token_start", "token_end",
            "media__sha256", "media__media_type", "media__width", "media__height", "media__byte_size",
        )
    )  # fmt: skip


def step_images(step_ids: Iterable[int]) -> dict[int, list[dict[str, Any]]]:
    """Each step's images in order, as reads and batch formats carry them (one query for
    all the steps; steps without images are absent):

    ``{"sha256", "media_type", "width", "height", "byte_size", "url"}`` with ``url`` the
    download path (GET /api/v1/media/<sha256>), plus where the image sits in the step
    (``message_index``, ``part_index``, the placeholder span ``token_start``/``token_end``)
    and ``kind``: "stored", or "url" for a remote image passed through and never fetched,
    whose ``url`` is the address the agent sent and whose sha256 and sizes are null."""
    ids = list(step_ids)
    out: dict[int, list[dict[str, Any]]] = {}
    if not ids:
        return out
    rows = compiled.read(_images_of, ids=Many(ids))
    for step_id, kind, url, msg, part, start, end, sha, media_type, width, height, size in rows:
        out.setdefault(step_id, []).append(
            {
                "sha256": sha,
                "media_type": media_type,
                "width": width,
                "height": height,
                "byte_size": size,
                "url": media_path(sha) if sha else url,
                "kind": kind,
                "message_index": msg,
                "part_index": part,
                "token_start": start,
                "token_end": end,
            }
        )
    return out


def media_path(sha256: str) -> str:
    """The download path of a stored image (gateway/urls.py: media-detail)."""
    return f"/api/v1/media/{sha256}"


def branch_ends(trajectory_ids: Iterable[int]) -> set[tuple[str, int, int]]:
    """(trajectory uid, branch, step_index) of the last step of each branch of these
    trajectories: the steps a ``last_step`` reward assignment rewards
    (pool/services/effective_reward.py ``assign``). One query."""
    ids = list(set(trajectory_ids))
    if not ids:
        return set()
    return {
        (uid, branch, last)
        for uid, branch, last in Step.objects.filter(trajectory_id__in=ids)
        .values_list("trajectory__uid", "branch")
        .annotate(last=Max("step_index"))
        .values_list("trajectory__uid", "branch", "last")
    }


def branch_returns(trajectory_ids: Iterable[int], *, gamma: float) -> dict[tuple[str, int, int], float]:
    """(trajectory uid, branch, step_index) -> the step's discounted return along its branch,
    G_t = r_t + gamma * G_{t+1}: r_t its process reward (0 without one), and the branch's
    final step (marked ``is_last``, else its highest step_index) also adds the branch's
    outcome (0 while there is none). The ``discounted_return`` reward assignment
    (pool/services/effective_reward.py ``assign``). One query of the narrow reward columns."""
    ids = list(set(trajectory_ids))
    out: dict[tuple[str, int, int], float] = {}
    if not ids:
        return out
    steps: dict[tuple[str, int], list[tuple[int, bool, float | None, float | None]]] = {}
    for uid, branch, index, is_last, process, outcome in (
        Step.objects.filter(trajectory_id__in=ids)
        .order_by("trajectory_id", "branch", "-step_index")
        .values_list("trajectory__uid", "branch", "step_index", "is_last", "process_reward", "outcome_reward")
    ):
        steps.setdefault((uid, branch), []).append((index, is_last, process, outcome))
    for (uid, branch), rows in steps.items():  # each branch's steps, last first
        final = next((index for index, is_last, _p, _o in rows if is_last), rows[0][0])
        g = 0.0
        for index, _last, process, outcome in rows:
            r = process or 0.0
            if index == final:
                r += outcome or 0.0
            g = r + gamma * g
            out[(uid, branch, index)] = g
    return out


def generation_texts(
    *, source_id: int | None, responses: Sequence[Sequence[int] | np.ndarray]
) -> list[str | None]:
    """The remembered upstream text of each response (pool/services/generation_texts.py) of
    this source, None where unknown. One query."""

    if source_id is None or not responses:
        return [None] * len(responses)
    keys = [response_ids_hash(r) for r in responses]
    found = {
        bytes(h): text
        for h, text in GenerationText.objects.filter(
            source_id=source_id, response_hash__in=set(keys)
        ).values_list("response_hash", "text")
    }
    return [found.get(k) for k in keys]


def step_by_response_id(
    *, trajectory_uid: str, response_id: str, sources: Sources = None
) -> dict[str, Any] | None:
    """The text form (messages, response_text, metadata) of the step a door answered with
    ``response_id`` (its ``metadata.response_id``), or None. Looked up within one trajectory
    (step_traj_index_uniq narrows it to that trajectory's steps); Responses'
    ``previous_response_id`` resolves here; a trajectory outside ``sources``
    (pool/tenancy.py) has none."""
    row = (
        Step.objects.filter(trajectory__uid=trajectory_uid, metadata__response_id=response_id)
        .filter(of_sources("trajectory__source_id", sources))
        .values("messages", "response_text", "metadata")
        .first()
    )
    return dict(row) if row is not None else None


def steps_listed(sources: Sources = None) -> QuerySet[Step]:
    """The steps ``GET /api/v1/steps`` pages through (the view applies its filters and
    cursor) as the value rows ``steps_render`` builds from: one query per page. Only those
    of trajectories of ``sources`` (pool/tenancy.py; None: all)."""
    fields, json_columns = _columns(texts=True)
    return Step.objects.filter(of_sources("trajectory__source_id", sources)).values(*fields, **json_columns)


def step_get(*, uid: str, sources: Sources = None) -> dict[str, Any] | None:
    """The step ``uid`` as ``steps_render`` builds it from (its value row), or None (also for
    a step outside ``sources``)."""
    fields, json_columns = _columns(texts=True)
    return (
        Step.objects.filter(of_sources("trajectory__source_id", sources))
        .filter(uid=uid)
        .values(*fields, **json_columns)
        .first()
    )


def step_ids_by_uid(uids: Iterable[str]) -> dict[str, int]:
    """The ids of the steps among these uids (one query); an unknown uid is absent."""
    return dict(Step.objects.filter(uid__in=set(uids)).values_list("uid", "id"))
