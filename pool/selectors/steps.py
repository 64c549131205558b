"""Reads of steps: the API representation of steps (token ids rebuilt exactly), the last
step of each branch and the discounted returns along it, a door's remembered upstream texts, and the step a Responses call
answered with."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from django.db.models import Max, QuerySet

from .. import flags, tokens
from ..flags import READY, Readiness
from ..generation_texts import response_ids_hash
from ..models import GenerationText, Step, StepMedia
from ..tenancy import Sources
from ..tenancy import q as of_sources

REWARD_FINAL = int(Readiness.REWARD_FINAL)


def steps_render(steps: Sequence[Step]) -> list[dict[str, Any]]:
    """The API representation of steps, token ids rebuilt exactly (one query for all chains).

    Field names and order are the step contract's (pool.ingest.contract.READ_FIELDS): the
    write fields, then what the pool sets, so a read returns what was written. Arrays are
    numpy (the JSON renderer serialises them natively, without a Python list per token).
    """
    full = tokens.load_sequences(s.id for s in steps)
    images = step_images(s.id for s in steps)
    parents = {s.parent_step_id for s in steps if s.parent_step_id is not None}
    # Only steps on a branch (proxied chat calls) have a parent: no query for any other page.
    parent_uids = dict(Step.objects.filter(id__in=parents).values_list("id", "uid")) if parents else {}
    out = []
    for s in steps:
        ids = tokens.bytes_to_ids(full[s.id])
        traj = s.trajectory
        out.append(
            {  # contract.READ_FIELDS, in order (tests/pool/test_ingest_contract.py)
                "trajectory_uid": traj.uid,
                "prompt_group_uid": traj.group.uid if traj.group_id else None,
                "step_index": s.step_index,
                "prompt_ids": ids[: s.prompt_len],
                "response_ids": ids[s.prompt_len :],
                "uid": s.uid,
                "rollout_logprobs": (
                    np.frombuffer(bytes(s.rollout_logprobs), dtype=tokens.LOGPROB_DTYPE)
                    if s.rollout_logprobs is not None
                    else None
                ),
                "token_rewards": (
                    np.frombuffer(bytes(s.token_rewards), dtype=tokens.LOGPROB_DTYPE)
                    if s.token_rewards is not None
                    else None
                ),
                "token_policy_versions": (
                    tokens.bytes_to_runs(bytes(s.token_versions)) if s.token_versions is not None else None
                ),
                # The effective reward (pool/services/effective_reward.py): its own, else
                # its branch's outcome; reward_scope says which. The two kinds apart:
                # outcome_reward and process_reward (after reward_scope).
                "reward": s.effective_reward,
                "reward_source": s.effective_reward_source,
                "policy_version": s.policy_version_id,
                "is_last": s.is_last,
                "finish_reason": s.finish_reason,
                "messages": s.messages,
                "response_text": s.response_text,
                "metadata": s.metadata,
                "multi_modal_data": {"images": images[s.id]} if s.id in images else None,
                "reward_status": s.effective_reward_status,
                "reward_scope": s.reward_scope,
                "outcome_reward": s.outcome_reward,
                "process_reward": s.process_reward,
                "token_source": s.token_source,
                "drift": s.drift,
                "drift_offset": s.drift_offset,
                "branch": s.branch,
                "parent_step_uid": parent_uids.get(s.parent_step_id) if s.parent_step_id else None,
                "created_at": s.created_at,
                "ready": s.readiness == READY,
                "readiness": flags.names(s.readiness, flags.READINESS_NAMES),
                "quality_flags": flags.names(s.quality_flags, flags.QUALITY_NAMES),
                "label": s.label or None,
                "images": images.get(s.id, []),
            }
        )
    return out


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
    rows = (
        StepMedia.objects.filter(step_id__in=ids)
        .order_by("step_id", "position")
        .values_list(
            "step_id", "kind", "source_url", "message_index", "part_index", "token_start", "token_end",
            "media__sha256", "media__media_type", "media__width", "media__height", "media__byte_size",
        )
    )  # fmt: skip
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
    cursor): trajectory and group joined for ``steps_render``, the token bytes and content
    hash left in the database (the render loads the token chains in one query). Only those
    of trajectories of ``sources`` (pool/tenancy.py; None: all)."""
    return (
        Step.objects.with_context()
        .filter(of_sources("trajectory__source_id", sources))
        .defer("seq_delta", "content_hash")
    )


def step_get(*, uid: str, sources: Sources = None) -> Step | None:
    """The step ``uid`` with what ``steps_render`` reads joined, or None (also for a step
    outside ``sources``)."""
    return (
        Step.objects.with_context()
        .filter(of_sources("trajectory__source_id", sources))
        .filter(uid=uid)
        .first()
    )


def step_ids_by_uid(uids: Iterable[str]) -> dict[str, int]:
    """The ids of the steps among these uids (one query); an unknown uid is absent."""
    return dict(Step.objects.filter(uid__in=set(uids)).values_list("uid", "id"))
