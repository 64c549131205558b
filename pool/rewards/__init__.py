"""Reward functions the pool computes itself, chosen by a sample's data source.

A function is named in settings.CLAW_REWARD_FUNCTIONS (``{"gsm8k": "pool.rewards.builtin.gsm8k"}``)
or by a RewardFunction row in the admin (which wins for the same name); see registry.py.
Two kinds, marked by the decorators of base.py:

* ``@rule``/``@per_sample(source=...)``: ``fn(sample) -> RewardResult | float``, one sample at
  a time (gsm8k, math boxed answers);
* ``@group(source=...)``: ``fn(samples) -> list[RewardResult | float]``, a whole GRPO group at
  once, scored relative to each other (the LLM judge of judge.py).

pool/services/reward_compute.py runs them when a trajectory or a group completes; the Claw-R1
``/compute_reward`` door runs them on one sample.
"""

from .base import RewardError, RewardResult, RewardSample, group, per_sample, rule

__all__ = ["RewardError", "RewardResult", "RewardSample", "group", "per_sample", "rule"]
