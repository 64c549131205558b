"""The bus: the one registry of what follows the pool's writes.

A write service stores its rows, then ``emit``s one typed event saying what it stored (the
event types are below: ``StepsWritten``, ``RewardsSet``, ``TrajectoriesEnded``,
``GroupsCompleted``, ``GroupsReady``, ``LabelsSet``, ...). Everything that follows such a
write (trajectory counters, readiness, outbox rows of follow-up tasks, live events, merges,
computed rewards) is an effect registered for that event type, once, from its own app's
``AppConfig.ready()`` (pool/apps.py, curation/apps.py); this module imports no service, no
task and no live notifier. Effects run in the order they were registered, inside the
write's transaction (their writes commit or roll back with it), and must defer anything
outside the database (tasks, live events) with ``transaction.on_commit``.

The step pipeline calls ``apply`` once per write, right after the rows are in. The pool's
own effects of ``StepsWritten``, in their order (pool/apps.py):

1. trajectory counters and status (step_count, tail_index, completion by an is_last step);
   skipped when the write's own statement already moved them (a proxied call's claim)
   (pool/ingest/effects.py);
2. group anchors: the first step 0 stored in a prompt group (pool/ingest/effects.py);
3. rewards (pool/services/rewards.py): outcome rewards (a trajectory ended by a last step
   with a final reward, whose other steps lack one, takes the last step's reward as its
   own, audited), then the effective rewards of the branches a final reward reaches;
4. readiness (pool/services/readiness.py): the steps of trajectories that are ended after
   the write get the bits their trajectory and group decide. A running trajectory's steps
   cannot be ready whatever those bits say, and its completion refreshes them, so a write
   into a running trajectory (every proxied call) adds no query; nor does a batch that
   creates and completes a trajectory (its rows are written with the bits);
5. group completion (pool/services/groups.py), which emits ``GroupsCompleted``: its
   rollouts are settled and the group's merge and computed rewards enqueued on commit;
6. the live dashboard's ``steps`` event (pool/live.py): one publish per write, built from
   this record, sent after the commit; no query but the first sight of a source;
7. trajectory ending (pool/services/trajectories.py): the trajectories its last steps end
   are a ``TrajectoriesEnded``, as are those ``trajectories_complete`` ends; its effects
   (the computed-reward task, the live ``trajectories.completed`` event) have one home.

Effects must not query when there is nothing for them to do: a proxied call on PostgreSQL
is one statement, and the effects of a plain call add none. An effect of ``StepsWritten``
registered with ``quiet_on_append=True`` promises that it neither queries nor writes after
a fused append (its statement already moved the counters; it writes no step 0 of a group
and no last step), so that append needs no transaction for it (``any_registered``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar


# --- event types ---------------------------------------------------------------------------------
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
    prompt_len: int = 0  # token counts: the live step rows show them
    response_len: int = 0


class WrittenTrajectory(NamedTuple):
    id: int
    uid: str
    group_id: int | None
    created: bool  # inserted by this write
    ended: bool  # not running when the write began (late steps of an ended trajectory)
    # its group has an anchor, read or checked by this write (its first step was stored
    # against it): the anchoring effect has nothing to do (effects.group_anchors)
    anchored: bool = False


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

    def settled(self) -> set[int]:
        """The trajectories whose readiness (and so effective rewards) the readiness effect
        settles: those this write ends, or that had ended. A trajectory this write created
        has no steps but these, and a batch writes their rows with the bits it knows
        (pipeline._known_readiness): only older rows need a rewrite."""
        ended = {
            s.trajectory_id
            for s in self.steps
            if s.is_last and not self.trajectories[s.trajectory_id].created
        }
        ended.update(t.id for t in self.trajectories.values() if t.ended)
        return ended


class EndedTrajectory(NamedTuple):
    id: int
    uid: str
    source_id: int | None
    channel: str
    status: str
    step_count: int
    group_id: int | None
    reward_pending: bool  # a reward function of its data source may score it
    just_ended: bool = True  # False: a late last step of a trajectory that had ended


@dataclass(slots=True, frozen=True)
class TrajectoriesEnded:
    """Trajectories a write ended (a last step, or an explicit completion)."""

    trajectories: tuple[EndedTrajectory, ...]


@dataclass(slots=True, frozen=True)
class RewardsSet:
    """Rewards were applied: ``count`` RewardEvents, on these trajectories' steps or themselves."""

    count: int
    trajectory_ids: frozenset[int]


@dataclass(slots=True, frozen=True)
class GroupsCompleted:
    """Open prompt groups whose expected rollouts have all ended, marked complete."""

    group_ids: tuple[int, ...]
    # The trajectories whose ending completed them now (trajectories_complete): their
    # highest step becomes their is_last step when the effect settles their steps.
    mark_last: frozenset[int] = frozenset()


@dataclass(slots=True, frozen=True)
class GroupsReady:
    """Complete groups whose every completed rollout is rewarded, found by a settle, before
    their ``ready_at`` is written (so those without one become ready now)."""

    group_ids: frozenset[int]
    # Those of them that name a task whose statistics have not counted them yet (read with
    # the groups by whoever emits): the task statistics effect has nothing to do without one.
    uncounted: frozenset[int] = frozenset()


@dataclass(slots=True, frozen=True)
class GroupMergeRequested:
    """A group's prefix-tree merge is wanted (its stored one is stale)."""

    group_id: int


@dataclass(slots=True, frozen=True)
class StepsMergeRequested:
    """The merge of these steps is wanted, stored under ``key``."""

    key: str
    step_ids: tuple[int, ...]


@dataclass(slots=True, frozen=True)
class MergeDone:
    """A group's merge was stored."""

    group_uid: str
    group_id: int
    tokens: int
    tokens_saved: int


@dataclass(slots=True, frozen=True)
class FeedbackRecorded:
    feedback_id: int


@dataclass(slots=True, frozen=True)
class LabelsSet:
    """The operator label of these steps was set (``""``: cleared)."""

    step_ids: tuple[int, ...]
    label: str


@dataclass(slots=True, frozen=True)
class UnitsChanged:
    """Rows that decide what a dataset admits changed outside the events above: steps'
    tags or quality flags, a group's expected rollouts, groups and trajectories purged.
    Whoever keeps counts of what datasets admit (curation/services/counts.py) counts these
    units again."""

    group_ids: tuple[int, ...] = ()
    trajectory_ids: tuple[int, ...] = ()
    step_ids: tuple[int, ...] = ()


@dataclass(slots=True, frozen=True)
class PolicyPublished:
    """A trainer published a policy version as a checkpoint of its run
    (``POST /api/v1/policy-versions`` with ``run``; pool/services/policy.py). The pool knows
    no runs: curation records the checkpoint (curation/services/lineage.py) and says what it
    recorded in ``recorded`` (the answer's ``checkpoint``); nothing recorded means no such
    run for the caller, and the publication is refused (404 naming ``run``)."""

    run: str
    version: int
    policy: str
    metadata: dict[str, Any] | None
    source_id: int | None
    # The caller's write sources (pool/tenancy.py; None: unrestricted): its runs are theirs.
    sources: frozenset[int] | None
    recorded: dict[str, Any] = field(default_factory=dict)


# --- the registry ------------------------------------------------------------------------------
E = TypeVar("E")
Effect = Callable[[Any], None]
_registry: dict[type, list[Effect]] = {}
_loud: list[Effect] = []  # StepsWritten effects that may query after a fused append
_within: ContextVar[tuple[type, ...]] = ContextVar("claw_bus_within", default=())  # events being followed up


def register(
    effect: Callable[[E], None],
    on: type[E] = StepsWritten,  # type: ignore[assignment]
    *,
    quiet_on_append: bool = False,
) -> Callable[[E], None]:
    """Run ``effect`` after every event of type ``on`` (idempotent: registering twice is
    once). ``quiet_on_append``: see the module docstring."""
    effects = _registry.setdefault(on, [])
    if effect not in effects:
        effects.append(effect)
        if on is StepsWritten and not quiet_on_append:
            _loud.append(effect)
    return effect


def unregister(effect: Effect) -> None:
    for effects in _registry.values():
        if effect in effects:
            effects.remove(effect)
    if effect in _loud:
        _loud.remove(effect)


def any_registered() -> bool:
    """Whether an effect of ``StepsWritten`` may query after a fused append (any but the
    pool's own, which never do): without one, that append needs no transaction of its own."""
    return bool(_loud)


def emit(event: object) -> None:
    """Run every effect registered for the event's type, in order, in the caller's
    transaction."""
    effects = tuple(_registry.get(type(event), ()))
    if not effects:
        return
    token = _within.set((*_within.get(), type(event)))
    try:
        for effect in effects:
            effect(event)
    finally:
        _within.reset(token)


def within(event_type: type) -> bool:
    """Whether an effect of an event of this type is running now (the event being followed
    up emitted the one at hand): an effect may leave to the outer event's own effect what
    that one covers."""
    return event_type in _within.get()


def apply(written: StepsWritten) -> None:
    """The pipeline's call: the effects of one step write (none for an empty one)."""
    if written.steps:
        emit(written)
