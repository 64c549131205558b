"""Outcome and process rewards stored right at every moment (pool/services/effective_reward.py).

One white-box trajectory of 3 steps on one branch is written in separate calls, in every
order the API accepts: each step alone (the is_last step may come first), step 1's process
reward 0.5 with the step or late through the rewards service, and the outcome 0.2 in one of
three ways: on step 2 marked is_last, as the trajectory's reward at completion, or on step 2
without is_last, becoming the outcome when the trajectory completes (completion before or
after the other steps). After every call every stored reward column of every step is
compared with the expectation computed by hand below (``expected``), and at the end the
periodic repair finds nothing to repair.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import pytest

from pool.flags import Readiness
from pool.ingest.pipeline import steps_ingest
from pool.models import Step
from pool.services.readiness import readiness_sweep
from pool.services.rewards import RewardIn, rewards_apply
from pool.services.trajectories import CompletionIn, trajectories_complete
from tests.pool.factories import random_ids, step_in

pytestmark = pytest.mark.django_db

PROCESS, OUTCOME = 0.5, 0.2
# How the outcome arrives: "last" on step 2 marked is_last; "trajectory" as the completion's
# reward; "final" on step 2 (not marked), the outcome once a completion ends the branch.
OUTCOMES = ("last", "trajectory", "final")


@dataclass(frozen=True)
class Order:
    outcome: str
    late: bool  # step 1's reward by the rewards service after the step, not with it
    events: tuple[str, ...]  # "w0" "w1" "w2" (writes), "r1" (the late reward), "c" (completion)

    @property
    def name(self) -> str:
        return f"{self.outcome}-{'late' if self.late else 'with'}-{'.'.join(self.events)}"


def _orders() -> list[Order]:
    out = []
    for outcome in OUTCOMES:
        for late in (False, True):
            events = ["w0", "w1", "w2"] + (["r1"] if late else []) + ([] if outcome == "last" else ["c"])
            for perm in itertools.permutations(events):
                # a late reward needs its step; a completion needs step 2 stored (a trajectory
                # that ended refuses a step past its known length)
                if late and perm.index("r1") < perm.index("w1"):
                    continue
                if "c" in perm and perm.index("c") < perm.index("w2"):
                    continue
                out.append(Order(outcome, late, perm))
    return out


ORDERS = _orders()

# The stored columns compared, in this order.
COLUMNS = (
    "reward",
    "reward_status",
    "reward_source",
    "effective_reward",
    "effective_reward_source",
    "reward_scope",
    "outcome_reward",
    "process_reward",
)


def expected(order: Order, done: set[str]) -> dict[int, tuple]:
    """By hand, for a branch of steps 0, 1, 2 (step 2 its final step once the trajectory
    ended): step 1's own reward is a process reward; the outcome is known once the
    trajectory ended (step 2 marked is_last written, or the completion); a step without an
    own reward is served the outcome (scope branch when it is step 2's own reward, trajectory
    when it is the completion's); a step is reward-final once the outcome is known."""
    ended = "c" in done or (order.outcome == "last" and "w2" in done)
    outcome = OUTCOME if ended else None
    out: dict[int, tuple] = {}
    for i in (0, 1, 2):
        if f"w{i}" not in done:
            continue
        own, source = None, None
        if i == 1 and ("r1" in done if order.late else True):
            own, source = PROCESS, "rule"
        if i == 2 and order.outcome in ("last", "final"):
            own, source = OUTCOME, "env"
        if own is not None:
            process = None if (ended and i == 2) else own
            row = (own, "final", source, own, source, "step", outcome, process)
        elif outcome is not None:
            scope = "trajectory" if order.outcome == "trajectory" else "branch"
            row = (None, "pending", None, outcome, "env", scope, outcome, None)
        else:
            row = (None, "pending", None, None, None, None, None, None)
        out[i] = (*row, outcome is not None)
    return out


def _stored(traj: str) -> dict[int, tuple]:
    return {
        row[0]: (*row[1:-1], bool(row[-1] & Readiness.REWARD_FINAL))
        for row in Step.objects.filter(trajectory__uid=traj)
        .order_by("step_index")
        .values_list("step_index", *COLUMNS, "readiness")
    }


def _steps(traj: str, order: Order) -> dict[str, object]:
    rng = random.Random(3)
    ctx = random_ids(rng, 12)
    out = {}
    for i in (0, 1, 2):
        response = random_ids(rng, 4)
        extra: dict = {}
        if i == 1 and not order.late:
            extra = {"reward": PROCESS, "reward_source": "rule"}
        if i == 2 and order.outcome in ("last", "final"):
            extra = {"reward": OUTCOME}
        if i == 2 and order.outcome == "last":
            extra["is_last"] = True
        out[f"w{i}"] = step_in(traj, i, prompt=list(ctx), response=response, policy_version=1, **extra)
        ctx = ctx + response
    return out


@pytest.mark.parametrize("order", ORDERS, ids=lambda o: o.name)
def test_the_stored_reward_columns_are_right_after_every_call(order: Order):
    # given: the three steps of the trajectory, to be written one call each
    steps = _steps("t", order)
    done: set[str] = set()
    for event in order.events:
        # when: the next call of this order
        if event.startswith("w"):
            steps_ingest(steps=[steps[event]])
        elif event == "r1":
            rewards_apply(rewards=[RewardIn(reward=PROCESS, step_uid="t:1", source="rule")])
        else:
            reward = OUTCOME if order.outcome == "trajectory" else None
            trajectories_complete(completions=[CompletionIn(uid="t", reward=reward)])
        done.add(event)
        # then: every column of every stored step is the hand-computed one
        assert _stored("t") == expected(order, done), f"after {event}"
    # and: the periodic repair finds nothing wrong
    assert readiness_sweep()["trajectories_refreshed"] == 0
    assert _stored("t") == expected(order, done)


def test_every_order_is_covered():
    # 3 ways of the outcome x (reward with the step: 3 writes; late: and the reward after
    # step 1), with the completion after step 2 where there is one
    assert len(ORDERS) == 6 + 12 + 12 + 30 + 12 + 30
