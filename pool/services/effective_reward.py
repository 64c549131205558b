"""The rewards of a step: the one definition every reader serves.

Two kinds of reward reach a step, and they are kept apart:

* the **outcome** of its branch: the own *final* reward of the branch's final step (the step
  marked ``is_last``, else, once the trajectory has ended, its highest ``step_index``), else
  its trajectory's reward; the same on every step of the branch (``Step.outcome_reward``);
* a **process** reward: any other own reward, a reward of that step alone (a rule that
  checked one tool call) (``Step.process_reward``). It never reaches another step.

A step's effective reward is

1. its own reward (``Step.reward``, final or provisional), scope ``step``; else
2. its branch's outcome from the final step's own reward, scope ``branch``; else
3. its branch's outcome from the trajectory's reward, scope ``trajectory``; else
4. none (NULL, scope NULL).

A step is reward-final (the readiness bit REWARD_FINAL) once its branch's outcome is known
and its own reward, if it has one, is final: a step with a process reward only waits for
its branch's outcome like the others.

All of it is stored on the step (``effective_reward``, ``reward_scope``,
``effective_reward_source``, ``outcome_reward``, ``process_reward`` and the bit) so that a
dataset filter, a batch, a snapshot, the API, the admin and the pages read columns. A row is
built with what its write knows (plan.step_row: an own reward is a process reward until its
step is known to end its branch); everything else is recomputed here, by ``steps_refresh``,
which every change of a fact above calls inside the writer's transaction: readiness's
``trajectories_refresh`` (a trajectory ended, its reward set, a group completed), rewards on
steps (``rewards_apply``, whose own rewards are written by the same statement) and a write
holding a rewarded step (the ingest effects).

How rewards reach the steps at delivery is the consumer's choice, per dataset
(``grouping.reward_assignment``, applied by ``assign``):

* ``each_step`` (default): every step carries its effective reward;
* ``last_step``: the last step of each branch carries its effective reward, the other
  steps their own one if they have it, else 0.0 with scope ``none`` (Claw-R1's own pool);
* ``discounted_return`` (with ``grouping.gamma``): every step carries its return along its
  branch, G_t = r_t + gamma * G_{t+1}, where r_t is its process reward (0 without one) and
  the branch's final step also adds the outcome (0 while there is none); scope ``return``.

Whatever the assignment, every row keeps ``outcome_reward`` and ``process_reward``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

from .. import sql
from ..models import Step
from ..selectors.steps import branch_ends, branch_returns

EACH_STEP = "each_step"
LAST_STEP = "last_step"
DISCOUNTED_RETURN = "discounted_return"
ASSIGNMENTS = (EACH_STEP, LAST_STEP, DISCOUNTED_RETURN)
SCOPE_NONE = "none"  # served by ``last_step`` only, never stored
SCOPE_RETURN = "return"  # served by ``discounted_return`` only, never stored
# Trajectories per statement (a chunk is one UPDATE: sql.steps_settle).
CHUNK = 1000

Own = Mapping[int, tuple[float | None, str, str | None]]


def steps_refresh(
    *,
    trajectory_ids: Iterable[int],
    own: Own | None = None,
    bits: bool = False,
    mark_last: Collection[int] = (),
) -> None:
    """Recompute the reward columns (effective reward, outcome, process reward and the
    REWARD_FINAL bit) of every step of these trajectories: one UPDATE per chunk
    (``sql.steps_settle``, set-based; only rows whose values change are written). ``own``:
    step id -> (reward, reward_status, reward_source) to store as those steps' own rewards
    (rewards_apply), written by the same UPDATE. ``bits``: also the readiness bits their
    trajectory and group decide (readiness.trajectories_refresh). ``mark_last``: those of
    them ending now, whose highest step becomes their is_last step in the same statement.
    Idempotent; call inside the writer's transaction (which holds the trajectories' row locks)."""
    ids = sorted(set(trajectory_ids))
    rows = [(sid, *values) for sid, values in (own or {}).items()]
    for chunk in _chunks(ids):
        sql.steps_settle(chunk, own=rows, bits=bits, mark_last=mark_last)


def assign(
    rows: Sequence[dict[str, Any]],
    *,
    mode: str,
    trajectory_ids: Iterable[int],
    gamma: float | None = None,
    branches: Sequence[int] | None = None,
) -> None:
    """Apply a dataset's ``reward_assignment`` (and ``gamma``) to rendered rows
    (pool.selectors.steps_render or a snapshot's) of these trajectories, in place: one query
    of their branches for ``last_step`` and ``discounted_return``, none for ``each_step``.
    ``branches``: each row's branch, where the rows do not hold it. ``outcome_reward`` and
    ``process_reward`` are left as they are."""
    if mode == EACH_STEP:
        return
    if mode == DISCOUNTED_RETURN:
        returns = branch_returns(trajectory_ids, gamma=1.0 if gamma is None else gamma)
        for i, r in enumerate(rows):
            branch = branches[i] if branches is not None else r["branch"]
            r["reward"], r["reward_scope"] = (
                returns[(r["trajectory_uid"], branch, r["step_index"])],
                SCOPE_RETURN,
            )
        return
    ends = branch_ends(trajectory_ids)
    for i, r in enumerate(rows):
        if r["reward_scope"] == Step.RewardScope.STEP:
            continue
        branch = branches[i] if branches is not None else r["branch"]
        if (r["trajectory_uid"], branch, r["step_index"]) in ends:
            continue
        r["reward"], r["reward_scope"], r["reward_source"] = 0.0, SCOPE_NONE, None


def _chunks(ids: list[int]) -> Iterator[list[int]]:
    for i in range(0, len(ids), CHUNK):
        yield ids[i : i + CHUNK]
