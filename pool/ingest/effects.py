"""Effects: everything that follows "steps were stored", in one place.

The pipeline calls ``apply`` once per write, inside the write's transaction, right after the
rows are in. The pool's own effects run first:

1. trajectory counters and status (step_count, tail_index, completion by an is_last step);
   skipped when the write's own statement already moved them (a proxied call's claim);
2. group anchors: the first step 0 stored in a prompt group;
3. group completion, which enqueues the group's prefix-tree merge and computed rewards on
   commit;
4. outcome rewards: a trajectory ended by a last step with a final reward, whose other
   steps lack one, takes the last step's reward as its own (audited);
   computed rewards: a trajectory ended by a last step without a final reward gets its
   reward task enqueued on commit (pool/services/reward_compute.py);
5. readiness (pool/services/readiness.py): the steps of trajectories that are ended after
   the write get the bits their trajectory and group decide. A running trajectory's steps
   cannot be ready whatever those bits say, and its completion refreshes them, so a write
   into a running trajectory (every proxied call) adds no query; nor does a batch that
   creates and completes a trajectory (its rows are written with the bits);
5. after the registered effects, the live dashboard's ``steps`` (and
   ``trajectories.completed``) event (pool/live.py): one publish per write, built from this
   record, sent after the commit; no query but the first sight of a source.

Other apps react to stored steps by registering an effect from their AppConfig.ready()
(``register``); the pool never imports them. An effect receives the ``StepsWritten`` record,
runs inside the transaction (so its writes commit or roll back with the steps) and must defer
anything outside the database (tasks, live events) with ``transaction.on_commit``. Effects
must not query when there is nothing for them to do: a proxied call on PostgreSQL is one
statement, and the effects of a plain call add none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from .. import live
from ..models import PromptGroup
from . import backends


class WrittenStep(NamedTuple):  # a tuple: built once per stored step, on the hot path
    id: int
    uid: str
    trajectory_id: int
    step_index: int
    is_last: bool
    reward_final: bool
    policy_version: int | None
    token_source: str
    drift: bool


class WrittenTrajectory(NamedTuple):
    id: int
    uid: str
    group_id: int | None
    created: bool  # inserted by this write
    ended: bool  # not running when the write began (late steps of an ended trajectory)


@dataclass(slots=True, frozen=True)
class StepsWritten:
    """What one write stored. ``counted``: the trajectory counters are already final."""

    steps: tuple[WrittenStep, ...]
    trajectories: dict[int, WrittenTrajectory]
    source_id: int | None
    door: str  # "batch" (client-chosen indexes) or "append" (claimed indexes)
    channel: str = ""  # the channel the write named (a trajectory it created has it)
    counted: bool = False
    tails: dict[int, int] = field(default_factory=dict)  # trajectory id -> first index of this append


Effect = Callable[[StepsWritten], None]
_registry: list[Effect] = []


def register(effect: Effect) -> Effect:
    """Run ``effect`` after every step write (idempotent: registering twice is once)."""
    if effect not in _registry:
        _registry.append(effect)
    return effect


def any_registered() -> bool:
    """Whether effects beyond the pool's own are registered. The pool's own never query
    after a fused append (its statement already moved the counters; it writes no step 0 of
    a group and no last step), so without registered effects that append needs no
    transaction of its own."""
    return bool(_registry)


def unregister(effect: Effect) -> None:
    if effect in _registry:
        _registry.remove(effect)


def apply(written: StepsWritten) -> None:
    """Run the pool's effects, then every registered one (see the module docstring)."""
    if not written.steps:
        return
    if not written.counted:
        _count(written)
    _anchor(written)
    rewarded = _outcome_rewards(written)
    _effective_rewards(written, done=rewarded)
    _readiness(written)
    _complete_groups(written)
    _computed_rewards(written)
    for effect in tuple(_registry):
        effect(written)
    live.steps_written(written)


def _count(written: StepsWritten) -> None:
    end: dict[int, int] = {}
    tail: dict[int, int] = {}
    last: set[int] = set()
    for s in written.steps:
        tid = s.trajectory_id
        end[tid] = max(end.get(tid, 0), s.step_index + 1)
        tail[tid] = max(tail.get(tid, 0), s.step_index)
        if s.is_last:
            last.add(tid)
    tail.update(written.tails)  # an append's tail is its first index, not its last
    backends.trajectories_after_write([(tid, n, tail[tid], tid in last) for tid, n in end.items()])


def _anchor(written: StepsWritten) -> None:
    """The first step 0 of a group becomes its anchor: the parent candidate of the other
    rollouts' first steps, which share the group prompt."""
    first: dict[int, int] = {}
    for s in written.steps:
        if s.step_index == 0:
            gid = written.trajectories[s.trajectory_id].group_id
            if gid is not None:
                first.setdefault(gid, s.id)
    for gid, sid in first.items():
        PromptGroup.objects.filter(id=gid, anchor_step__isnull=True).update(anchor_step_id=sid)


def _complete_groups(written: StepsWritten) -> None:
    groups = {
        written.trajectories[s.trajectory_id].group_id
        for s in written.steps
        if s.is_last and written.trajectories[s.trajectory_id].group_id is not None
    }
    if groups:
        # Imported here: pool.services re-exports the pipeline, so a module-level import
        # would be circular.
        from ..services.groups import groups_check_complete

        groups_check_complete(group_ids=groups)  # type: ignore[arg-type]


def _outcome_rewards(written: StepsWritten) -> set[int]:
    """A trajectory ended by a last step with a final reward of its own, but without a
    reward itself, takes that reward as the trajectory's (audited, through rewards_apply)
    when some of its steps have no final reward: the outcome reward of Claw-R1's flows,
    which put the score on the last step only. Without it the earlier steps would never be
    ready, nor the group. One query, only for a write that holds such a last step; a
    trajectory whose every step is rewarded (W-ingest) is left as it is."""
    last = [s.id for s in written.steps if s.is_last and s.reward_final]
    if not last:
        return set()
    from django.db.models import Exists, OuterRef

    from ..models import Step
    from ..services.rewards import RewardIn, rewards_apply

    unrewarded = Step.objects.filter(trajectory_id=OuterRef("trajectory_id")).exclude(
        reward_status=Step.RewardStatus.FINAL
    )
    rows = list(
        Step.objects.filter(id__in=last, trajectory__reward__isnull=True, reward__isnull=False)
        .filter(Exists(unrewarded))
        .order_by("trajectory_id")
        .values_list("trajectory__uid", "reward", "reward_source", "uid", "trajectory_id")
    )
    if rows:
        rewards_apply(
            rewards=[
                RewardIn(
                    trajectory_uid=t,
                    reward=float(r),
                    source=src or Step.RewardSource.ENV,
                    metadata={"from_last_step": uid},
                )
                for t, r, src, uid, _tid in rows
            ],
            source_id=written.source_id,
        )
    return {row[4] for row in rows}


def _computed_rewards(written: StepsWritten) -> None:
    """A trajectory ended by a last step without a final reward: its data source may name a
    reward function (pool/services/reward_compute.py); the task decides, after commit. No
    query here."""
    ended = {s.trajectory_id for s in written.steps if s.is_last and not s.reward_final}
    if ended:
        from .. import tasks

        for tid in sorted(ended):
            tasks.enqueue_on_commit(tasks.trajectory_rewards_compute, tid)


def _effective_rewards(written: StepsWritten, *, done: set[int]) -> None:
    """A final reward written on a step becomes the effective reward of the steps of its
    branch that have none (pool/services/effective_reward.py): refreshed for the
    trajectories where such steps may exist (the write holds one, or the trajectory had
    steps before it), unless readiness settles them anyway. No query for a write without a
    rewarded step (every proxied call), nor for a batch whose trajectories it creates with
    every step rewarded (W-ingest). ``done``: trajectories the outcome rewards refreshed."""
    rewarded = {s.trajectory_id for s in written.steps if s.reward_final}
    if not rewarded:
        return
    unrewarded = {s.trajectory_id for s in written.steps if not s.reward_final}
    settled = _settled(written)
    refresh = {
        tid
        for tid in rewarded
        if tid not in settled
        and tid not in done
        and (tid in unrewarded or not written.trajectories[tid].created)
    }
    if refresh:
        from ..services.effective_reward import steps_refresh

        steps_refresh(trajectory_ids=refresh)


def _settled(written: StepsWritten) -> set[int]:
    """The trajectories whose readiness (and so effective rewards) ``_readiness`` settles:
    those this write ends, or that had ended. A trajectory this write created has no steps
    but these, and a batch writes their rows with the bits it knows
    (pipeline._known_readiness): only older rows need a rewrite."""
    ended = {
        s.trajectory_id
        for s in written.steps
        if s.is_last and not written.trajectories[s.trajectory_id].created
    }
    ended.update(t.id for t in written.trajectories.values() if t.ended)
    return ended


def _readiness(written: StepsWritten) -> None:
    ended = _settled(written)
    if ended:
        from ..services.readiness import trajectories_settle

        trajectories_settle(trajectory_ids=ended)
