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

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from django.db.models import FilteredRelation, Q

from .. import sql
from ..flags import Readiness
from ..models import Step, Trajectory
from ..selectors.steps import branch_ends, branch_returns

EACH_STEP = "each_step"
LAST_STEP = "last_step"
DISCOUNTED_RETURN = "discounted_return"
ASSIGNMENTS = (EACH_STEP, LAST_STEP, DISCOUNTED_RETURN)
SCOPE_NONE = "none"  # served by ``last_step`` only, never stored
SCOPE_RETURN = "return"  # served by ``discounted_return`` only, never stored
# Trajectories per statement (a chunk is one SELECT and at most one UPDATE).
CHUNK = 1000

_RF = int(Readiness.REWARD_FINAL)
_FIELDS = (
    "id",
    "trajectory_id",
    "branch",
    "step_index",
    "is_last",
    "reward",
    "reward_status",
    "reward_source",
    "effective_reward",
    "effective_reward_source",
    "reward_scope",
    "outcome_reward",
    "process_reward",
    "readiness",
    "chunk_trajectory__reward",
    "chunk_trajectory__reward_source",
    "chunk_trajectory__status",
)


Own = Mapping[int, tuple[float | None, str, str | None]]


def steps_refresh(*, trajectory_ids: Iterable[int], own: Own | None = None) -> None:
    """Recompute the reward columns (effective reward, outcome, process reward and the
    REWARD_FINAL bit) of every step of these trajectories (only rows whose values change
    are written): one SELECT of the steps' narrow reward columns, joined to their
    trajectory's reward and status, and at most one UPDATE per chunk. ``own``: step id ->
    (reward, reward_status, reward_source) to store as those steps' own rewards (rewards_apply),
    written by the same UPDATE. Idempotent; call inside the writer's transaction (which
    holds the trajectories' row locks), before readiness is recomputed from it."""
    ids = sorted(set(trajectory_ids))
    own = own or {}
    for chunk in _chunks(ids):
        steps = [
            (*row[:5], *own[row[0]], *row[8:]) if row[0] in own else row
            for row in Step.objects.filter(trajectory_id__in=chunk)
            .annotate(chunk_trajectory=_trajectories(chunk))
            .values_list(*_FIELDS)
        ]
        rows = [
            (sid, *st[5:8], sid in own, *new)
            for st, (sid, old, new) in zip(steps, decide(steps), strict=True)
            if new != old or sid in own  # else the row as stored already says it
        ]
        for start in range(0, len(rows), CHUNK):
            sql.steps_rewards_set(rows[start : start + CHUNK])


def _trajectories(ids: list[int]) -> FilteredRelation:
    """The steps' trajectories, joined on their ids and restricted to ``ids`` in the join
    itself: PostgreSQL then reads them by primary key (a merge join of two index scans)
    instead of hashing a scan of the whole trajectory table, which it chose for a chunk of
    250 trajectories once the pool held 1M steps (60 ms, growing with the pool; 2.4 ms
    so, bench/growth.py)."""
    return FilteredRelation("trajectory", condition=Q(trajectory__id__in=ids))


Columns = tuple[float | None, str | None, str | None, float | None, float | None, bool]


def decide(steps: Sequence[tuple]) -> Iterator[tuple[int, Columns, Columns]]:
    """(step id, stored columns, defined columns) of each step, from rows of ``_FIELDS``
    holding every step of their trajectories. The columns: (effective reward, its source,
    its scope, outcome reward, process reward, reward-final)."""
    final: dict[tuple[int, int], int] = {}  # (trajectory, branch) -> step_index of its final step
    marked: set[tuple[int, int]] = set()
    for _sid, tid, b, index, is_last, *_rest, t_status in steps:
        key = (tid, b)
        if is_last:
            if key not in marked or index > final[key]:
                final[key] = index
            marked.add(key)
        elif key not in marked and t_status != Trajectory.Status.RUNNING:
            final[key] = max(final.get(key, index), index)
    outcome: dict[tuple[int, int], tuple[float, str, str]] = {}
    for _sid, tid, b, index, _last, reward, status, source, *_rest in steps:
        if final.get((tid, b)) == index and reward is not None and status == Step.RewardStatus.FINAL:
            outcome[(tid, b)] = (reward, source or Step.RewardSource.ENV, Step.RewardScope.BRANCH)
    for (
        sid,
        tid,
        b,
        index,
        _last,
        reward,
        status,
        source,
        eff,
        eff_source,
        scope,
        old_outcome,
        old_process,
        readiness,
        t_reward,
        t_source,
        _t_status,
    ) in steps:
        out = outcome.get((tid, b))
        if out is None and t_reward is not None:
            out = (t_reward, t_source or Step.RewardSource.ENV, Step.RewardScope.TRAJECTORY)
        outcome_value = out[0] if out is not None else None
        if reward is not None:
            process = None if final.get((tid, b)) == index else reward
            new: Columns = (
                reward,
                source,
                Step.RewardScope.STEP,
                outcome_value,
                process,
                outcome_value is not None and status == Step.RewardStatus.FINAL,
            )
        elif out is not None:
            new = (*out, outcome_value, None, True)
        else:
            new = (None, None, None, None, None, False)
        yield sid, (eff, eff_source, scope, old_outcome, old_process, bool(readiness & _RF)), new


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
