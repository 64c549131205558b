"""Test data builders for the pool: steps through the real write path, and row counts.

Steps are written with ``steps_ingest`` (the one write path), never with the ORM, so every
test's data went through the same encoding as production data.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np

from pool.ingest.contract import StepIn
from pool.ingest.pipeline import steps_ingest
from pool.models import Event, Feedback, PolicyVersion, PromptGroup, RewardEvent, Step, Trajectory


def ids(values: list[int] | np.ndarray) -> np.ndarray:
    """Token ids as the int32 array StepIn expects."""
    return np.asarray(values, dtype=np.int32)


def random_ids(rng: random.Random, n: int, *, high: int = 150_000) -> list[int]:
    return [rng.randrange(high) for _ in range(n)]


def step_in(
    traj: str,
    index: int,
    *,
    prompt: list[int],
    response: list[int],
    group: str | None = None,
    uid: str | None = None,
    **extra: Any,
) -> StepIn:
    """A StepIn as gateway.validation would build it (uid defaults to '<traj>:<index>')."""
    logprobs = extra.pop("rollout_logprobs", None)
    return StepIn(
        uid=uid or f"{traj}:{index}",
        trajectory_uid=traj,
        step_index=index,
        prompt_ids=ids(prompt),
        response_ids=ids(response),
        prompt_group_uid=group,
        rollout_logprobs=np.asarray(logprobs, dtype=np.float64) if logprobs is not None else None,
        **extra,
    )


def trajectory_with_steps(
    traj: str, n: int, *, group: str | None = None, seed: int = 0, prompt_len: int = 40, turn_len: int = 20
) -> list[Step]:
    """Store a multi-turn trajectory of ``n`` steps (each prompt extends the previous prompt
    and response) and return the created steps in step order."""
    rng = random.Random(seed)
    ctx = random_ids(rng, prompt_len)
    batch = []
    for i in range(n):
        response = random_ids(rng, turn_len)
        batch.append(step_in(traj, i, prompt=list(ctx), response=response, group=group))
        ctx = ctx + response + random_ids(rng, turn_len)
    result = steps_ingest(steps=batch)
    return sorted(result.created, key=lambda s: s.step_index)


def pool_counts() -> dict[str, int]:
    """Row counts of every table a write could touch; compare before and after a request."""
    return {
        model.__name__: model.objects.count()
        for model in (Step, Trajectory, PromptGroup, PolicyVersion, RewardEvent, Event, Feedback)
    }
