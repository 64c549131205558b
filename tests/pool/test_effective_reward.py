"""The effective reward (pool/services/effective_reward.py): one definition, read by every
reader. Each case writes a trajectory through the one write path, rewards it one of the
ways the API allows, and compares every step's (reward, reward_scope, reward_source,
reward-final) and its two kinds (outcome_reward, process_reward) as a read returns them
(pool.selectors.steps_render) with the definition: its own reward, else its branch's
outcome (the own final reward of the branch's final step, else its trajectory's reward).
Writes in every order: tests/pool/test_reward_kinds.py."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from django.db import models

from pool.flags import Readiness
from pool.ingest.pipeline import steps_ingest
from pool.models import Step
from pool.selectors.steps import steps_render
from pool.services.effective_reward import DISCOUNTED_RETURN, EACH_STEP, LAST_STEP, assign
from pool.services.readiness import readiness_sweep
from pool.services.rewards import RewardIn, rewards_apply
from pool.services.trajectories import CompletionIn, trajectories_complete
from tests.pool.factories import random_ids, step_in

pytestmark = pytest.mark.django_db


@dataclass(frozen=True)
class Case:
    """Steps as (branch, own reward or None), in step order; then the rewards that arrive;
    then each step's expected (reward, scope, source, final) and (outcome, process)."""

    name: str
    steps: list[tuple[int, float | None]]
    expected: list[tuple[float | None, str | None, str | None, bool]]
    kinds: list[tuple[float | None, float | None]] = field(default_factory=list)
    complete: float | None = None  # POST /complete {"reward": r} (None: complete without one)
    complete_source: str = "env"
    late: dict[int, tuple[float, str, bool]] = field(default_factory=dict)  # index -> (reward, source, final)
    ended: bool = True


CASES = [
    Case(
        "every step its own",
        steps=[(0, 0.1), (0, 0.2), (0, 0.3)],
        expected=[(0.1, "step", "env", True), (0.2, "step", "env", True), (0.3, "step", "env", True)],
        # the last step's is the outcome; the others' are process rewards
        kinds=[(0.3, 0.1), (0.3, 0.2), (0.3, None)],
    ),
    Case(
        "last step only (Claw-R1): the others take the branch's",
        steps=[(0, None), (0, None), (0, 1.0)],
        expected=[(1.0, "branch", "env", True), (1.0, "branch", "env", True), (1.0, "step", "env", True)],
        kinds=[(1.0, None)] * 3,
    ),
    Case(
        "trajectory reward at completion",
        steps=[(0, None), (0, None)],
        complete=0.75,
        expected=[(0.75, "trajectory", "env", True), (0.75, "trajectory", "env", True)],
        kinds=[(0.75, None)] * 2,
    ),
    Case(
        "a human trajectory reward says human",
        steps=[(0, None)],
        complete=0.5,
        complete_source="human",
        expected=[(0.5, "trajectory", "human", True)],
        kinds=[(0.5, None)],
    ),
    Case(
        "own beats branch beats trajectory",
        steps=[(0, 0.2), (0, None), (0, 0.9), (1, None)],
        complete=-1.0,
        expected=[
            (0.2, "step", "env", True),
            (0.9, "branch", "env", True),
            (0.9, "step", "env", True),
            (-1.0, "trajectory", "env", True),  # branch 1 has no rewarded step
        ],
        kinds=[(0.9, 0.2), (0.9, None), (0.9, None), (-1.0, None)],
    ),
    Case(
        "each branch its own last reward",
        steps=[(0, None), (0, 1.0), (1, None), (1, 0.0)],
        expected=[
            (1.0, "branch", "env", True),
            (1.0, "step", "env", True),
            (0.0, "branch", "env", True),
            (0.0, "step", "env", True),
        ],
        kinds=[(1.0, None), (1.0, None), (0.0, None), (0.0, None)],
    ),
    Case(
        "late reward on the last step by POST /rewards",
        steps=[(0, None), (0, None)],
        late={1: (0.4, "rule", True)},
        expected=[(0.4, "branch", "rule", True), (0.4, "step", "rule", True)],
        kinds=[(0.4, None), (0.4, None)],
    ),
    Case(
        "a provisional own reward is served as its own but is not final, nor reaches the branch",
        steps=[(0, None), (0, None)],
        late={1: (0.3, "model", False)},
        expected=[(None, None, None, False), (0.3, "step", "model", False)],
        kinds=[(None, None), (None, None)],  # not final: no outcome yet
    ),
    Case(
        "nothing rewarded: no reward at all",
        steps=[(0, None), (0, None)],
        expected=[(None, None, None, False), (None, None, None, False)],
    ),
    Case(
        # (until issue 18 a running trajectory's rewarded step was taken for its branch's
        # end, and its reward reached the earlier steps)
        "a running trajectory: an own reward is a process reward, the branch has no outcome yet",
        steps=[(0, None), (0, 0.6)],
        ended=False,
        expected=[(None, None, None, False), (0.6, "step", "env", False)],
        kinds=[(None, None), (None, 0.6)],
    ),
    Case(
        # issue 18: a process reward on one turn used to override the outcome for every other
        # turn (steps 0 and 2 were served 0.5, scope branch)
        "a late process reward stays on its step; the outcome reaches the others",
        steps=[(0, None), (0, None), (0, None)],
        late={1: (0.5, "rule", True)},
        complete=0.2,
        expected=[
            (0.2, "trajectory", "env", True),
            (0.5, "step", "rule", True),
            (0.2, "trajectory", "env", True),
        ],
        kinds=[(0.2, None), (0.2, 0.5), (0.2, None)],
    ),
]


def _write(case: Case, traj: str) -> None:
    rng = random.Random(7)
    ctx = random_ids(rng, 16)
    batch = []
    for i, (branch, reward) in enumerate(case.steps):
        response = random_ids(rng, 4)
        batch.append(
            step_in(
                traj, i, prompt=list(ctx), response=response, branch=branch, reward=reward, policy_version=1
            )
        )
        ctx = ctx + response
    steps_ingest(steps=batch)
    for index, (reward, source, final) in case.late.items():
        rewards_apply(
            rewards=[RewardIn(reward=reward, step_uid=f"{traj}:{index}", source=source, final=final)]
        )
    if case.ended:
        trajectories_complete(
            completions=[CompletionIn(uid=traj, reward=case.complete, reward_source=case.complete_source)]
        )


def _served(traj: str) -> list[tuple]:
    steps = list(Step.objects.with_context().filter(trajectory__uid=traj).order_by("step_index"))
    rows = steps_render(steps)
    return [(r["reward"], r["reward_scope"], r["reward_source"], r["reward_status"] == "final") for r in rows]


def _kinds(traj: str) -> list[tuple]:
    steps = list(Step.objects.with_context().filter(trajectory__uid=traj).order_by("step_index"))
    return [(r["outcome_reward"], r["process_reward"]) for r in steps_render(steps)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_step_is_served_its_effective_reward(case: Case):
    """README: "A step's effective reward is defined once (pool/services/effective_reward.py)
    and stored on the step: its own reward, else its branch's (the own final reward of the
    last step of its trajectory and branch that has one), else its trajectory's."
    README: "reward_scope says which (step, branch or trajectory; null while there is none)
    and reward_source where that reward came from (env, rule, model or human)."
    README: "A provisional own reward is served as the step's reward, but the step is not
    reward-final (reward_status pending) and the reward does not reach its branch."
    README: "The trajectory's reward applies to every branch unless a branch gets its own: a
    step without a reward of its own is served its branch's reward, else its trajectory's
    (the effective reward: see What a trainer receives)." """
    # given/when: the trajectory written and rewarded as the case says
    _write(case, "t")
    # then: every step's read is the definition's, and its REWARD_FINAL bit agrees
    assert _served("t") == case.expected
    assert _kinds("t") == (case.kinds or [(None, None)] * len(case.steps))
    bits = list(
        Step.objects.filter(trajectory__uid="t").order_by("step_index").values_list("readiness", flat=True)
    )
    assert [bool(b & Readiness.REWARD_FINAL) for b in bits] == [e[3] for e in case.expected]


@pytest.mark.parametrize("case", [c for c in CASES if c.ended], ids=lambda c: c.name)
def test_the_sweep_repairs_nothing_after_the_writers(case: Case):
    # given: a case written through the services
    _write(case, "t")
    before = _served("t")
    # when: the periodic repair runs
    out = readiness_sweep()
    # then: it found nothing wrong, and the reads are unchanged
    assert out["trajectories_refreshed"] == 0 and _served("t") == before


def test_the_sweep_repairs_a_missing_effective_reward():
    # given: a trajectory rewarded at completion whose steps lost their effective reward (a
    # crash between the reward and its effects, simulated by clearing the columns)
    _write(CASES[2], "t")
    Step.objects.filter(trajectory__uid="t").update(effective_reward=None, reward_scope=None, readiness=0)
    # when: the sweep runs
    readiness_sweep()
    # then: the steps are served the trajectory's reward again
    assert [s[:2] for s in _served("t")] == [(0.75, "trajectory"), (0.75, "trajectory")]


def test_a_reward_on_the_final_step_is_the_outcome_and_one_on_another_step_a_process_reward():
    """README: "A branch gets its outcome from a final reward on its final step (POST
    /api/v1/rewards with step_uid; its final step is its step marked is_last, else, once the
    trajectory has ended, its highest step), and its other steps without one are served it."
    README: "A reward on any other step is a process reward of that step alone: it reaches no
    other step." (the service under that endpoint)"""
    # given: a running trajectory whose step 1 of 3 was rewarded, then its step 2
    _write(Case("x", steps=[(0, None), (0, 0.2), (0, None)], expected=[], ended=False), "t")
    rewards_apply(rewards=[RewardIn(reward=1.0, step_uid="t:2")])
    # then: while it runs, both are process rewards: no step has an outcome
    assert [s[:2] for s in _served("t")] == [(None, None), (0.2, "step"), (1.0, "step")]
    assert _kinds("t") == [(None, None), (None, 0.2), (None, 1.0)]
    # when: it completes, step 2 is its final step: its reward is the branch's outcome
    trajectories_complete(completions=[CompletionIn(uid="t")])
    assert [s[:2] for s in _served("t")] == [(1.0, "branch"), (0.2, "step"), (1.0, "step")]
    assert _kinds("t") == [(1.0, None), (1.0, 0.2), (1.0, None)]


def test_last_step_assignment_serves_zero_with_scope_none_to_the_other_steps():
    """README: "With last_step the last step of each branch carries it, and the other steps
    their own reward if they have one, else 0.0 with reward_scope none and reward_source null
    (as Claw-R1's own pool serves them):" """
    # given: a trajectory of two branches rewarded at completion, with one own step reward
    _write(
        Case("x", steps=[(0, None), (0, 0.3), (0, None), (1, None), (1, None)], complete=1.0, expected=[]),
        "t",
    )
    steps = list(Step.objects.with_context().filter(trajectory__uid="t").order_by("step_index"))
    rows = steps_render(steps)
    # when: served under each assignment
    each = [dict(r) for r in rows]
    assign(each, mode=EACH_STEP, trajectory_ids={steps[0].trajectory_id})
    last = [dict(r) for r in rows]
    assign(last, mode=LAST_STEP, trajectory_ids={steps[0].trajectory_id})
    # then: each_step serves every effective reward (step 1's is a process reward: branch 0's
    # outcome is the trajectory's, its final step 2 having none); last_step the branch ends'
    # and own ones
    assert [(r["reward"], r["reward_scope"]) for r in each] == [
        (1.0, "trajectory"),
        (0.3, "step"),
        (1.0, "trajectory"),
        (1.0, "trajectory"),
        (1.0, "trajectory"),
    ]
    assert [(r["reward"], r["reward_scope"], r["reward_source"]) for r in last] == [
        (0.0, "none", None),
        (0.3, "step", "env"),
        (1.0, "trajectory", "env"),
        (0.0, "none", None),
        (1.0, "trajectory", "env"),
    ]
    # and: both keep the two kinds apart
    for served in (each, last):
        assert [(r["outcome_reward"], r["process_reward"]) for r in served] == [
            (1.0, None),
            (1.0, 0.3),
            (1.0, None),
            (1.0, None),
            (1.0, None),
        ]


def test_discounted_return_assignment_serves_each_step_its_return_along_its_branch():
    """README: "With discounted_return (and grouping.gamma in [0, 1], 1 when left out) every
    step carries its return along its branch, G_t = r_t + gamma x G_{t+1}, where r_t is its
    process reward (0 without one) and the branch's final step also adds the outcome;
    reward_scope is return." """
    # given: branch 0 of 3 steps with a process reward on step 0 and the outcome 0.2 on its
    # final step; branch 1 of 2 steps with a process reward on its first, no outcome of its own
    _write(
        Case("x", steps=[(0, 0.5), (0, None), (0, 0.2), (1, 0.1), (1, None)], complete=None, expected=[]),
        "t",
    )
    steps = list(Step.objects.with_context().filter(trajectory__uid="t").order_by("step_index"))
    for gamma, want in (
        # by hand: branch 0: G2 = 0.2, G1 = g*0.2, G0 = 0.5 + g*G1; branch 1 has no outcome
        # (its final step 4 and the trajectory have no reward): G4 = 0, G3 = 0.1
        (0.9, [0.5 + 0.9 * 0.9 * 0.2, 0.9 * 0.2, 0.2, 0.1, 0.0]),
        (1.0, [0.7, 0.2, 0.2, 0.1, 0.0]),
        (0.0, [0.5, 0.0, 0.2, 0.1, 0.0]),
    ):
        # when: served under discounted_return with this gamma
        rows = steps_render(steps)
        assign(rows, mode=DISCOUNTED_RETURN, gamma=gamma, trajectory_ids={steps[0].trajectory_id})
        # then: each step's return, scope return, and the two kinds as stored
        assert [r["reward"] for r in rows] == pytest.approx(want)
        assert {r["reward_scope"] for r in rows} == {"return"}
        assert [(r["outcome_reward"], r["process_reward"]) for r in rows] == [
            (0.2, 0.5),
            (0.2, None),
            (0.2, None),
            (None, 0.1),
            (None, None),
        ]


@pytest.mark.parametrize("case", [c for c in CASES if c.ended], ids=lambda c: c.name)
def test_the_migration_backfill_gives_what_the_live_definition_gives(case: Case):
    # given: a case written through the services, then its effective columns wiped, as rows
    # stored before migration 0011 had them
    import importlib

    from django.apps import apps

    from pool.models import Trajectory

    _write(case, "t")
    served, kinds = _served("t"), _kinds("t")
    Step.objects.filter(trajectory__uid="t").update(
        effective_reward=None,
        effective_reward_source=None,
        reward_scope=None,
        outcome_reward=None,
        process_reward=None,
    )
    Step.objects.filter(trajectory__uid="t", reward__isnull=True).update(
        readiness=models.F("readiness").bitand(~int(Readiness.REWARD_FINAL) & 0xFF)
    )
    Trajectory.objects.filter(uid="t").update(reward_source=None)
    # when: the migrations' backfills run (twice: they are idempotent), 0011's then 0017's
    # (the outcome and process rewards, and the branch rule of issue 18)
    for name in ("0011_effective_reward", "0017_step_outcome_process_rewards"):
        backfill = importlib.import_module(f"pool.migrations.{name}").backfill
        backfill(apps, None)
        backfill(apps, None)
    # then: every step reads as the services made it
    assert _served("t") == served and _kinds("t") == kinds
