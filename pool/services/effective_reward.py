"""The effective reward of a step: the one definition every reader serves.

A step's effective reward is

1. its own reward (``Step.reward``, final or provisional), scope ``step``; else
2. its branch's: the own *final* reward of the last step (highest ``step_index``) of its
   trajectory and branch that has one, scope ``branch`` (Claw-R1's shape: the outcome
   reward on the last step reaches the earlier steps); else
3. its trajectory's reward, scope ``trajectory``; else
4. none (NULL, scope NULL): the step is not reward-final.

It is stored on the step (``effective_reward``, ``reward_scope``, ``effective_reward_source``)
so that a dataset filter, a batch, a snapshot, the API, the admin and the pages read one
column. Steps with an own reward get it when their reward is written (the row build,
``sql.steps_reward_set``); the others are recomputed here, by ``steps_refresh``, which
every change of a fact above calls inside the writer's transaction: readiness's
``trajectories_refresh`` (a trajectory ended, its reward set, a group completed), rewards on
steps (``rewards_apply``) and a write holding a rewarded step (the ingest effects). The
readiness bit REWARD_FINAL follows from it (``sql.steps_readiness_set``): a final own
reward, or no own reward and an effective one.

How the outcome reaches the steps of a multi-step trajectory is the consumer's choice, per
dataset (``grouping.reward_assignment``, applied at delivery by ``assign``):

* ``each_step`` (default): every step carries its effective reward;
* ``last_step``: the last step of each branch carries its effective reward, the other
  steps their own one if they have it, else 0.0 with scope ``none`` (Claw-R1's own pool).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .. import sql
from ..models import Step

EACH_STEP = "each_step"
LAST_STEP = "last_step"
ASSIGNMENTS = (EACH_STEP, LAST_STEP)
SCOPE_NONE = "none"  # served by ``last_step`` only, never stored
# Trajectories per statement (a chunk is one SELECT and at most one UPDATE).
CHUNK = 1000


def steps_refresh(*, trajectory_ids: Iterable[int]) -> None:
    """Recompute the effective reward of every step without an own reward in these
    trajectories (only rows whose value changes are written): one SELECT of the steps'
    narrow reward columns, joined to their trajectory's reward, and at most one UPDATE per
    chunk. Idempotent; call inside the writer's transaction, before readiness is
    recomputed from it."""
    ids = sorted(set(trajectory_ids))
    for chunk in _chunks(ids):
        steps = list(
            Step.objects.filter(trajectory_id__in=chunk)
            .order_by("trajectory_id", "branch", "-step_index")
            .values_list(
                "id",
                "trajectory_id",
                "branch",
                "reward",
                "reward_status",
                "reward_source",
                "effective_reward",
                "effective_reward_source",
                "reward_scope",
                "trajectory__reward",
                "trajectory__reward_source",
            )
        )
        # The branch's reward: its last step with a final own reward (rows come last first).
        branch: dict[tuple[int, int], tuple[float, str | None]] = {}
        for _id, tid, b, reward, status, source, *_rest in steps:
            if status == Step.RewardStatus.FINAL:
                branch.setdefault((tid, b), (reward, source))
        rows = []
        for (
            sid,
            tid,
            b,
            reward,
            _status,
            _source,
            old_reward,
            old_source,
            old_scope,
            t_reward,
            t_source,
        ) in steps:
            if reward is not None:
                continue  # its own: written with it
            new = _effective(branch.get((tid, b)), (t_reward, t_source) if t_reward is not None else None)
            if new != (old_reward, old_source, old_scope):
                rows.append((sid, *new))
        for start in range(0, len(rows), CHUNK):
            sql.steps_effective_reward_set(rows[start : start + CHUNK])


def _effective(
    branch: tuple[float, str | None] | None, trajectory: tuple[float, str | None] | None
) -> tuple[float | None, str | None, str | None]:
    """(reward, source, scope) of a step without an own reward."""
    if branch is not None:
        return branch[0], branch[1] or Step.RewardSource.ENV, Step.RewardScope.BRANCH
    if trajectory is not None:
        return trajectory[0], trajectory[1] or Step.RewardSource.ENV, Step.RewardScope.TRAJECTORY
    return None, None, None


def assign(
    rows: Sequence[dict[str, Any]],
    *,
    mode: str,
    branch_ends: set[tuple[str, int, int]],
    branches: Sequence[int] | None = None,
) -> None:
    """Apply a dataset's ``reward_assignment`` to rendered rows (pool.selectors.steps_render
    or a snapshot's), in place. ``branch_ends``: (trajectory uid, branch, step_index) of the
    last step of each branch of the rows' trajectories (``pool.selectors.branch_ends``);
    ``branches``: each row's branch, where the rows do not hold it."""
    if mode == EACH_STEP:
        return
    for i, r in enumerate(rows):
        if r["reward_scope"] == Step.RewardScope.STEP:
            continue
        branch = branches[i] if branches is not None else r["branch"]
        if (r["trajectory_uid"], branch, r["step_index"]) in branch_ends:
            continue
        r["reward"], r["reward_scope"], r["reward_source"] = 0.0, SCOPE_NONE, None


def _chunks(ids: list[int]) -> Iterator[list[int]]:
    for i in range(0, len(ids), CHUNK):
        yield ids[i : i + CHUNK]
