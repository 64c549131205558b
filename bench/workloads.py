"""Standard benchmark workloads (the project's WORKLOADS notes), shared by every benchmark.

W-agentic: one GRPO group of a multi-turn tool-using agent: 8 rollouts x 8 turns = 64 steps,
a shared 4,000-token system/task prompt, 150-token answers, 400-token tool observations.
Step t of a rollout has prompt = system + (answer + observation) of every earlier turn and
response = that turn's answer. 388,800 step tokens, 36,000 unique prefix-tree tokens.

W-agentic-64: the same generator over 64 groups sharing one rng (4,096 steps, ~24.9 M
tokens).

Token ids are uniform in [0, 150000) from ``random.Random(seed)``, drawn in exactly the
order of the published generator, so any two implementations see the same data::

    from bench.workloads import w_agentic, as_pool_bytes
    steps = w_agentic(groups=64)                 # list[AgenticStep]
    sequences, prompt_lens = as_pool_bytes(steps)  # int32 bytes, the pool's storage form
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

VOCAB = 150_000
SYSTEM, ROLLOUTS, TURNS, ANSWER, OBSERVATION = 4_000, 8, 8, 150, 400

# Exact totals of one W-agentic group, for checks.
W_AGENTIC_TOTAL_TOKENS = 388_800
W_AGENTIC_UNIQUE_TOKENS = 36_000


class AgenticStep(NamedTuple):
    """One step: which group/rollout/turn it is, and its token ids."""

    group: int
    rollout: int
    turn: int
    prompt: list[int]
    response: list[int]


def w_agentic(
    groups: int = 1,
    seed: int = 0,
    *,
    system: int = SYSTEM,
    rollouts: int = ROLLOUTS,
    turns: int = TURNS,
    answer: int = ANSWER,
    observation: int = OBSERVATION,
    vocab: int = VOCAB,
) -> list[AgenticStep]:
    """W-agentic (``groups=1``) or W-agentic-64 (``groups=64``), step by step.

    The keyword sizes default to the standard workload; smaller ones give the same shape for
    quick tests (e.g. a tiny model with a small ``vocab``). Prompts share list objects'
    elements, not the lists themselves, so callers may mutate a step's lists freely.
    """
    rng = random.Random(seed)
    steps: list[AgenticStep] = []
    for g in range(groups):
        sys_prompt = [rng.randrange(vocab) for _ in range(system)]
        for r in range(rollouts):
            ctx = list(sys_prompt)
            for t in range(turns):
                resp = [rng.randrange(vocab) for _ in range(answer)]
                steps.append(AgenticStep(g, r, t, ctx, resp))
                ctx = ctx + resp + [rng.randrange(vocab) for _ in range(observation)]
    return steps


def step_bytes(step: AgenticStep) -> bytes:
    """The step's full sequence (prompt + response) as little-endian int32 bytes."""
    return np.array(step.prompt + step.response, dtype="<i4").tobytes()


def as_pool_bytes(steps: Sequence[AgenticStep]) -> tuple[list[bytes], list[int]]:
    """Sequences as the pool stores them (int32 bytes) and their prompt lengths."""
    return [step_bytes(s) for s in steps], [len(s.prompt) for s in steps]
