"""The trainer: GRPO on pulled rows with verl's advantage and policy loss; ``claw_client`` only.

``grpo_step`` takes the rows of one batch (the ``padded`` format's rows, as
``claw_client.integrations.verl.to_dataproto`` reads them, or the direct baseline's rows),
keeps the answer steps (the tool-call steps are forced tokens, logprob 0.0: nothing to learn),
computes advantages with verl's ``compute_grpo_outcome_advantage`` per prompt group, the new
logprobs of the sampled answer tokens under the decoding constraint (policy.py), and verl's
clipped policy loss (``compute_policy_loss_vanilla``) against the served rollout logprobs.
The rows' rewards are the verifier's; ``permute`` shuffles them across the batch's rollouts
first (the control: a reward that says nothing about the answer).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, compute_policy_loss_vanilla
from verl.workers.config.actor import ActorConfig

from claw_client.integrations.verl import to_dataproto

from .policy import ANSWER_TOKENS, answer_logprobs

LOSS_CONFIG = ActorConfig(
    strategy="fsdp",
    ppo_mini_batch_size=1,
    ppo_micro_batch_size_per_gpu=1,
    clip_ratio=0.2,
    use_dynamic_bsz=False,
    rollout_n=1,
)


def answer_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steps that answered (one sampled digit, then <|end|>), not masked."""
    return [
        r
        for r in rows
        if not r.get("mask") and len(r["response_ids"]) == 2 and int(r["response_ids"][0]) in ANSWER_TOKENS
    ]


def grpo_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    rows: list[dict[str, Any]],
    *,
    permute: np.random.Generator | None = None,
) -> dict[str, Any]:
    """One optimizer step on ``rows``; returns the batch's mean verifier reward (before any
    permutation), the loss and the shape of the batch."""
    answers = answer_rows(rows)
    if not answers:
        raise ValueError("the batch has no answer steps")
    missing = [r["uid"] for r in answers if r.get("reward") is None or r.get("rollout_logprobs") is None]
    if missing:  # a reward on the wrong step, or logprobs lost: train on nothing rather than on 0
        raise ValueError(f"answer steps without a reward or rollout logprobs: {missing[:5]}")
    dp = to_dataproto(answers)
    rewards = dp.batch["token_level_rewards"]
    mask = dp.batch["response_mask"]
    true_mean = float(rewards.sum(-1).mean())
    if permute is not None:
        rewards = rewards[torch.from_numpy(permute.permutation(len(answers)))]
    adv, _ = compute_grpo_outcome_advantage(rewards, mask, dp.non_tensor_batch["uid"])
    old = dp.batch["rollout_log_probs"]
    k = torch.tensor([ANSWER_TOKENS.index(int(t)) for t in dp.batch["responses"][:, 0]])
    prompts = [[int(x) for x in r["prompt_ids"]] for r in answers]
    new = answer_logprobs(model, prompts)[torch.arange(len(answers)), k].float()
    log_prob = torch.cat([new[:, None], torch.zeros_like(old[:, 1:])], dim=1)  # <|end|>: forced, 0.0
    loss_mask = torch.zeros_like(mask)
    loss_mask[:, 0] = mask[:, 0]  # only the sampled token is the policy's choice
    loss, _metrics = compute_policy_loss_vanilla(
        old_log_prob=old, log_prob=log_prob, advantages=adv, response_mask=loss_mask, config=LOSS_CONFIG
    )
    if not math.isfinite(loss.item()):
        raise FloatingPointError(f"non-finite loss {loss.item()}")
    opt.zero_grad()
    loss.backward()
    opt.step()
    return {
        "reward": true_mean,
        "loss": loss.item(),
        "rollouts": len(answers),
        "groups": len(set(dp.non_tensor_batch["uid"])),
        "max_logprob_gap": float((new.detach() - old[:, 0]).abs().max()),
    }
