"""A pulled batch as verl's ``DataProto`` (verl 0.9), laid out as verl's agent loop lays out
its rollouts, so verl's reward, advantage and actor code take it unmodified::

    from claw_client.integrations.verl import to_dataproto

    with claw.pull("grpo", consumer="verl", batch_size=8, format="padded") as batch:
        data = to_dataproto(batch)            # or format="steps": the same DataProto

Tensors (one row per step; P = the longest prompt or ``prompt_length``, R = the longest
response or ``response_length``):

* ``prompts`` (N, P) left-padded and ``responses`` (N, R) right-padded with ``pad_token_id``,
  ``input_ids`` = prompts | responses, ``attention_mask`` (1 on real tokens), all int64;
* ``position_ids`` = ``clip(cumsum(attention_mask) - 1, 0)`` (verl's
  ``compute_position_id_with_mask``), int64;
* ``response_mask`` int64: 1 on the real response tokens of the steps trained on (a step
  served masked, kept only to keep its group whole, is all 0);
* ``rollout_log_probs`` float32 (0.0 on padding), present when every step trained on has
  rollout logprobs (``has_rollout_logprobs`` says which rows have them);
* ``token_level_scores``, ``token_level_rewards`` and ``rm_scores`` float32: the step's
  effective reward on its last response token, 0.0 elsewhere (a null reward puts none:
  see ``reward``). ``rm_scores`` is where verl's trainer reads a rollout's own scores.

Non-tensor (numpy, one entry per row): ``uid``, the GRPO index: the prompt group uid (a
trajectory without a group is its own group: its trajectory uid); ``prompt_uids`` (the group
uid or None), ``trajectory_uids``, ``step_indices`` (int32; the names Claw-R1's trainer
reads), ``step_uids``, ``policy_versions``, ``staleness``, ``reward`` (null kept),
``reward_scope``, ``outcome_rewards`` (the branch's outcome reward, null while there is
none), ``process_rewards`` (the step's own reward when it does not end its branch, else
null), ``has_rollout_logprobs``. ``meta_info``: ``lease_id``,
``dataset_version``, ``policy_versions`` and ``staleness`` of the pull's manifest.

Images (issue 24): when any row carries stored images, ``multi_modal_data`` holds each row's
images in order as loaded PIL images, ``{"images": [...], "image": [...]}`` (the same list
under both keys: ``images`` is what Claw-R1's VerlBackend and verl's agent loop read from a
step's ``multi_modal_data`` and hand to the processor, ``image`` what verl's RLHFDataset and
vLLM's engine take), and None for a row without images. They are fetched by sha256 through
the client's disk cache (``ClawClient.images``): the pulling client of a ``Batch``, or
``media=`` (a ClawClient, or any ``row -> list[PIL image]``) for a dict or a list of rows.

Lineage: ``open_run`` opens the trainer's training run (verl's config as its config), and
each version it publishes (``run.set_policy_version(global_step)``) is a checkpoint holding
the leases acked since the previous one. After the actor's update, ``post_verdicts`` sends
the trainer's verdict on each step back to the pool, from verl's own tensors::

    run = open_run(claw, consumer="verl", dataset="grpo", config=config)   # OmegaConf or dict
    with claw.pull("grpo", consumer="verl", batch_size=8, format="padded") as batch:
        data = to_dataproto(batch)
        ...                                   # old_log_probs, advantages, update_actor
        post_verdicts(claw, data, clip_ratio=config.actor_rollout_ref.actor.clip_ratio)
    run.set_policy_version(global_step)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from verl.protocol import DataProto

from claw_client import padding
from claw_client.formats import padded_steps

__all__ = ["batch_rows", "open_run", "post_verdicts", "to_dataproto", "verdicts_of"]

# What a step row needs; the rest is optional (metadata, reward_scope, ...).
_ROW_KEYS = ("prompt_ids", "response_ids", "trajectory_uid", "step_index")


def to_dataproto(
    batch: Any,
    *,
    prompt_length: int | None = None,
    response_length: int | None = None,
    pad_token_id: int = 0,
    metadata: bool = False,
    media: Any = None,
) -> DataProto:
    """The DataProto of ``batch``: a client ``Batch``, a pull answer (dict), its ``batch``
    part, or a list of steps (the ``steps`` format's rows), in the ``steps`` or ``padded``
    format. ``prompt_length``/``response_length`` pad to fixed widths (verl's rollout
    config); a longer prompt or response is a ValueError. ``metadata`` also spreads each
    step's metadata keys into non-tensor columns (None where a step lacks one), as Claw-R1's
    VerlBackend does; a key that would replace a column above is left out."""
    rows, info = batch_rows(batch)
    if media is None:
        media = info.get("client")
    if not rows:
        raise ValueError("the batch has no steps: nothing to convert (an empty pull is falsy)")
    lay = padding.layout(
        [r["prompt_ids"] for r in rows],
        [r["response_ids"] for r in rows],
        prompt_width=prompt_length,
        response_width=response_length,
        pad_id=pad_token_id,
    )
    n, w = len(rows), lay.response_width
    rlen = lay.response_lengths
    unmasked = np.array([not r.get("mask", False) for r in rows], dtype=bool)
    logprobs = padding.right(
        [r["rollout_logprobs"] if r.get("rollout_logprobs") is not None else () for r in rows],
        w,
        fill=0.0,
        dtype=np.float32,
    )
    # A step's reward at its last response token (none for a step without response tokens).
    scores = np.zeros((n, w), dtype=np.float32)
    rewarded = [i for i, r in enumerate(rows) if r.get("reward") is not None and rlen[i]]
    scores[rewarded, rlen[rewarded] - 1] = [float(rows[i]["reward"]) for i in rewarded]
    scores_t = torch.from_numpy(scores)
    tensors = {
        "prompts": torch.from_numpy(lay.prompts),
        "responses": torch.from_numpy(lay.responses),
        "input_ids": torch.from_numpy(lay.input_ids),
        "attention_mask": torch.from_numpy(lay.attention_mask),
        "position_ids": torch.from_numpy(lay.position_ids),
        "response_mask": torch.from_numpy((lay.response_real & unmasked[:, None]).astype(np.int64)),
        "token_level_scores": scores_t,
        "token_level_rewards": scores_t.clone(),
        "rm_scores": scores_t.clone(),
    }
    has_logprobs = [r.get("rollout_logprobs") is not None for r in rows]
    if all(h or r.get("mask", False) for h, r in zip(has_logprobs, rows, strict=True)):
        tensors["rollout_log_probs"] = torch.from_numpy(logprobs)
    non_tensors = {
        "uid": _objects(r.get("prompt_group_uid") or r["trajectory_uid"] for r in rows),
        "prompt_uids": _objects(r.get("prompt_group_uid") for r in rows),
        "trajectory_uids": _objects(r["trajectory_uid"] for r in rows),
        "step_indices": np.array([r["step_index"] for r in rows], dtype=np.int32),
        "step_uids": _objects(r.get("uid") for r in rows),
        "policy_versions": _objects(r.get("policy_version") for r in rows),
        "staleness": _objects(r.get("staleness") for r in rows),
        "reward": _objects(r.get("reward") for r in rows),
        "reward_scope": _objects(r.get("reward_scope") for r in rows),
        # The two kinds apart: the branch's outcome and the step's own process reward.
        "outcome_rewards": _objects(r.get("outcome_reward") for r in rows),
        "process_rewards": _objects(r.get("process_reward") for r in rows),
        "has_rollout_logprobs": np.array(has_logprobs, dtype=bool),
    }
    images = _multi_modal_data(rows, media)
    if images is not None:
        non_tensors["multi_modal_data"] = images
    if metadata:
        keys = sorted({k for r in rows for k in (r.get("metadata") or {})} - set(non_tensors))
        for key in keys:
            non_tensors[key] = _objects((r.get("metadata") or {}).get(key) for r in rows)
    manifest = info.get("manifest") or {}
    meta_info = {
        "lease_id": info.get("lease_id"),
        "dataset_version": manifest.get("dataset_version"),
        "policy_versions": manifest.get("policy_versions"),
        "staleness": manifest.get("staleness"),
    }
    return DataProto(
        batch=TensorDict(tensors, batch_size=[n]), non_tensor_batch=non_tensors, meta_info=meta_info
    )


def open_run(
    client: Any,
    *,
    consumer: str,
    dataset: str,
    config: Any = None,
    name: str | None = None,
    code_version: str | None = None,
    uid: str | None = None,
) -> Any:
    """The verl trainer's training run (``ClawClient.open_run``): ``config`` is verl's config
    (an OmegaConf DictConfig, resolved, or a dict), ``code_version`` by default verl's
    version. Publish each version through the run (``run.set_policy_version(step)``): a
    checkpoint holding the leases acked since the previous one."""
    if config is not None and not isinstance(config, Mapping):
        from omegaconf import OmegaConf

        config = OmegaConf.to_container(config, resolve=True)
    if code_version is None:
        import verl

        code_version = f"verl-{getattr(verl, '__version__', 'unknown')}"
    return client.open_run(
        consumer=consumer,
        dataset=dataset,
        name=name,
        config=dict(config) if config is not None else None,
        code_version=code_version,
        uid=uid,
    )


def verdicts_of(
    data: DataProto,
    *,
    clip_ratio: float = 0.2,
    clip_ratio_high: float | None = None,
    log_prob_key: str = "old_log_probs",
    per_token: bool = False,
) -> list[dict[str, Any]]:
    """The trainer's verdict on each step trained on (a row whose ``response_mask`` has a 1),
    from verl's own tensors: ``log_prob_key`` (the training policy's logprobs, verl's
    ``old_log_probs`` from ``compute_log_prob``), ``rollout_log_probs`` and ``advantages``
    (from ``compute_advantage``), over the row's response tokens (``response_mask``):

    * ``importance_ratio``: exp(mean(training - rollout logprob));
    * ``logprob_kl``: the KL between the rollout and training policies, the k3 estimate
      mean(r - 1 - log r), r = exp(training - rollout) per token (>= 0);
    * ``clipped_fraction``: the share of tokens whose ratio r is outside
      [1 - clip_ratio, 1 + clip_ratio_high] (verl's PPO clip range; high defaults to low);
    * ``advantage``: the mean advantage.

    A statistic whose tensor is absent (or a row without rollout logprobs) is left out.
    ``per_token`` adds ``tokens``: r and the k3 term per response token (0 where masked).
    Items as ``POST /api/v1/leases/{id}/verdicts`` takes them."""
    b, nt = data.batch, data.non_tensor_batch
    mask = b["response_mask"].to(torch.float64)
    n_response = b["attention_mask"][:, -mask.shape[1] :].sum(dim=-1).tolist()
    keys = set(b.keys())
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    has_lp = list(nt["has_rollout_logprobs"]) if "has_rollout_logprobs" in nt else [True] * len(data)
    log_ratio = ratio = k3 = None
    if log_prob_key in keys and "rollout_log_probs" in keys:
        log_ratio = (b[log_prob_key].to(torch.float64) - b["rollout_log_probs"].to(torch.float64)) * mask
        ratio = torch.exp(log_ratio)
        k3 = (ratio - 1 - log_ratio) * mask
    out = []
    for i in range(len(data)):
        m = mask[i]
        count = float(m.sum())
        if count == 0:
            continue  # served masked (context): not trained on
        item: dict[str, Any] = {"uid": nt["step_uids"][i]}
        if ratio is not None and has_lp[i]:
            item["importance_ratio"] = math.exp(float(log_ratio[i].sum()) / count)
            item["logprob_kl"] = float(k3[i].sum()) / count
            outside = ((ratio[i] < 1 - clip_ratio) | (ratio[i] > 1 + high)).to(torch.float64) * m
            item["clipped_fraction"] = float(outside.sum()) / count
            if per_token:
                n = int(n_response[i])
                item["tokens"] = {
                    "importance_ratio": (ratio[i] * m)[:n].tolist(),
                    "logprob_kl": k3[i][:n].tolist(),
                }
        if "advantages" in keys:
            item["advantage"] = float((b["advantages"][i].to(torch.float64) * m).sum()) / count
        out.append(item)
    return out


def post_verdicts(
    client: Any, data: DataProto, *, lease_of: Mapping[str, str] | None = None, **kwargs: Any
) -> dict[str, dict[str, Any]]:
    """Post ``verdicts_of(data, **kwargs)`` to the pool, one request per lease; returns each
    lease's answer (stored, flagged). A row's lease: ``lease_of[step uid]``, else
    ``meta_info["step_leases"]`` (a batch gathered from several pulls: Claw-R1's DataPool
    sets it), else the batch's ``meta_info["lease_id"]``."""
    leases = {**(data.meta_info.get("step_leases") or {}), **(lease_of or {})}
    default = data.meta_info.get("lease_id")
    by_lease: dict[str, list[dict[str, Any]]] = {}
    for item in verdicts_of(data, **kwargs):
        lease = leases.get(item["uid"], default)
        if lease is None:
            raise ValueError(f"step {item['uid']!r} has no lease: give lease_of, or convert a pulled batch")
        by_lease.setdefault(lease, []).append(item)
    return {lease: client.post_verdicts(lease, items) for lease, items in by_lease.items()}


def batch_rows(batch: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(step rows, {"lease_id", "manifest"}) of a client Batch, a pull answer, its ``batch``
    part (``steps`` or ``padded`` format) or a list of steps. Padded rows are cut back to
    their real tokens, so both formats give the same rows."""
    info: dict[str, Any] = {}
    if hasattr(batch, "manifest") and hasattr(batch, "batch") and not isinstance(batch, Mapping):
        info = {
            "lease_id": batch.lease_id,
            "manifest": batch.manifest,
            "client": getattr(batch, "_client", None),
        }
        batch = batch.batch or {}
    elif isinstance(batch, Mapping) and "manifest" in batch:
        info = {"lease_id": batch.get("lease_id"), "manifest": batch.get("manifest")}
        batch = batch.get("batch") or {}
    if isinstance(batch, Mapping):
        if "steps" in batch:
            rows = list(batch["steps"])
        elif "prompts" in batch and "responses" in batch:
            rows = padded_steps(batch)
        elif "subtree_end" in batch:
            raise ValueError("the tree format is not a verl batch: pull format='steps' or 'padded'")
        else:
            raise ValueError("not a pulled batch: expected a steps or padded batch")
    else:
        rows = list(batch)
    for i, r in enumerate(rows):
        missing = [k for k in _ROW_KEYS if k not in r]
        if missing:
            raise ValueError(f"step {i} lacks {', '.join(missing)}")
    return rows, info


def _multi_modal_data(rows: list[dict[str, Any]], media: Any) -> np.ndarray | None:
    """Each row's ``{"images": [PIL], "image": [PIL]}`` (None without images); None for a
    batch without any stored image."""
    from claw_client.media import image_refs

    if not any(image_refs(r) for r in rows):
        return None
    if media is None:
        raise ValueError(
            "the batch has images: pass media=ClawClient(...) (or a row -> images function) to fetch them"
        )
    fetch = media.images if hasattr(media, "images") else media
    out: list[dict[str, list[Any]] | None] = []
    for r in rows:
        if image_refs(r):
            pil = list(fetch(r))
            out.append({"images": pil, "image": pil})
        else:
            out.append(None)
    return _objects(out)


def _objects(values: Iterable[Any]) -> np.ndarray:
    items = list(values)
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out
