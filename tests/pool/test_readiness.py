"""Readiness bits and quality flags (pool/services/readiness.py, pool/quality.py): each
condition, each flag, the sweep that abandons idle trajectories and repairs missed bits."""

from __future__ import annotations

import random
from datetime import timedelta

import numpy as np
import pytest
from django.utils import timezone

from pool.flags import READY, Quality, Readiness
from pool.ingest.pipeline import steps_ingest
from pool.models import PromptGroup, Step, Trajectory
from pool.quality import is_repetitive
from pool.services.groups import group_upsert
from pool.services.readiness import readiness_sweep
from pool.services.rewards import RewardIn, rewards_apply
from pool.services.trajectories import CompletionIn, trajectories_complete
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db


def bits(uid: str) -> int:
    return Step.objects.get(uid=uid).readiness


def test_each_condition_sets_its_own_bit():
    group_upsert(uid="g", expected_rollouts=2)
    steps_ingest(steps=[step_in("a", 0, prompt=[1, 2], response=[3], group="g")])
    assert bits("a:0") == Readiness.TOKENS_EXACT
    rewards_apply(rewards=[RewardIn(step_uid="a:0", reward=1.0)])
    # (issue 18) while the trajectory runs, its step's reward is a process reward: the step is
    # reward-final once its branch's outcome is, when the completion makes it the final step
    assert bits("a:0") == Readiness.TOKENS_EXACT
    trajectories_complete(completions=[CompletionIn(uid="a")])
    assert bits("a:0") == Readiness.TOKENS_EXACT | Readiness.REWARD_FINAL | Readiness.TRAJECTORY_COMPLETE
    steps_ingest(steps=[step_in("b", 0, prompt=[1, 2], response=[4], group="g", reward=0.0, is_last=True)])
    assert bits("a:0") == bits("b:0") == READY
    assert PromptGroup.objects.get(uid="g").ready_at is not None


def test_a_pending_reward_undoes_readiness_and_the_group_waits_again():
    group_upsert(uid="g", expected_rollouts=1)
    steps_ingest(steps=[step_in("a", 0, prompt=[1], response=[2], group="g", reward=1.0, is_last=True)])
    assert bits("a:0") == READY and PromptGroup.objects.get(uid="g").ready_at is not None
    rewards_apply(rewards=[RewardIn(step_uid="a:0", reward=0.5, final=False)])
    assert bits("a:0") == READY & ~Readiness.REWARD_FINAL
    assert PromptGroup.objects.get(uid="g").ready_at is None


def test_retokenized_steps_lack_only_the_exact_bit():
    steps_ingest(
        steps=[
            step_in("r", 0, prompt=[1], response=[2], reward=1.0, is_last=True, token_source="retokenized")
        ]
    )
    assert bits("r:0") == READY & ~Readiness.TOKENS_EXACT


def test_failed_trajectories_never_become_ready_but_still_end_their_group():
    group_upsert(uid="g", expected_rollouts=2)
    steps_ingest(steps=[step_in("ok", 0, prompt=[1], response=[2], group="g", reward=1.0, is_last=True)])
    steps_ingest(steps=[step_in("bad", 0, prompt=[1], response=[3], group="g", reward=1.0)])
    trajectories_complete(completions=[CompletionIn(uid="bad", status="failed")])
    assert PromptGroup.objects.get(uid="g").status == "complete"
    assert bits("ok:0") == READY and not bits("bad:0") & Readiness.TRAJECTORY_COMPLETE


def test_the_sweep_abandons_idle_trajectories_so_their_group_stops_waiting(settings):
    settings.CLAW_TRAJECTORY_IDLE_TIMEOUT_SECONDS = 60
    group_upsert(uid="g", expected_rollouts=2)
    steps_ingest(steps=[step_in("ok", 0, prompt=[1], response=[2], group="g", reward=1.0, is_last=True)])
    steps_ingest(steps=[step_in("stuck", 0, prompt=[1], response=[3], group="g", reward=1.0)])
    assert readiness_sweep()["abandoned"] == 0  # not idle yet
    later = timezone.now() + timedelta(seconds=61)
    out = readiness_sweep(now=later)
    assert out["abandoned"] == 1 and out["groups_completed"] == 1
    assert Trajectory.objects.get(uid="stuck").status == "abandoned"
    assert bits("ok:0") == READY and PromptGroup.objects.get(uid="g").ready_at is not None
    assert readiness_sweep(now=later) == {
        "abandoned": 0,
        "groups_completed": 0,
        "trajectories_refreshed": 0,
        "groups_settled": 0,
    }


def test_the_sweep_repairs_bits_an_effect_missed():
    steps_ingest(steps=[step_in("a", 0, prompt=[1], response=[2], reward=1.0, is_last=True)])
    assert bits("a:0") == READY
    # as if a crash had lost the effect after the commit: the bits are wrong
    Step.objects.filter(uid="a:0").update(readiness=Readiness.TOKENS_EXACT)
    out = readiness_sweep()
    assert out["trajectories_refreshed"] == 1 and bits("a:0") == READY


def test_step_quality_flags_at_ingest(settings):
    settings.CLAW_QUALITY_MAX_RESPONSE_TOKENS = 50
    rng = random.Random(0)
    healthy = [rng.randrange(150_000) for _ in range(40)]
    steps_ingest(
        steps=[
            step_in("q", 0, prompt=[1], response=healthy, rollout_logprobs=[-0.1] * 40),
            step_in("q", 1, prompt=[1, *healthy, 9], response=[], rollout_logprobs=[]),
            step_in("q", 2, prompt=[2], response=[7, 8] * 30, finish_reason="length"),
            step_in("q", 3, prompt=[3], response=[5], drift=True),
        ]
    )
    flags = dict(Step.objects.values_list("uid", "quality_flags"))
    assert flags["q:0"] == 0
    assert flags["q:1"] == Quality.EMPTY
    assert (
        flags["q:2"] == Quality.TRUNCATED | Quality.REPETITION | Quality.TOO_LONG | Quality.MISSING_LOGPROBS
    )
    assert flags["q:3"] == Quality.DRIFT | Quality.MISSING_LOGPROBS


def test_repetition_detector():
    rng = np.random.default_rng(0)
    assert not is_repetitive(rng.integers(0, 150_000, 500))
    loop = np.tile(rng.integers(0, 150_000, 8), 50)
    assert is_repetitive(loop)
    # a sound start, then a long loop
    assert is_repetitive(np.concatenate([rng.integers(0, 150_000, 100), loop]))
    assert not is_repetitive(np.array([1, 1, 1, 1]))  # too short to judge


def test_group_flags_follow_the_rewards():
    group_upsert(uid="g", expected_rollouts=2)
    steps_ingest(steps=[step_in("a", 0, prompt=[1], response=[5, 6], group="g", reward=1.0, is_last=True)])
    steps_ingest(steps=[step_in("b", 0, prompt=[1], response=[7, 8], group="g", reward=1.0, is_last=True)])
    assert all(f & Quality.ZERO_VARIANCE for f in Step.objects.values_list("quality_flags", flat=True))
    rewards_apply(rewards=[RewardIn(step_uid="b:0", reward=0.0), RewardIn(trajectory_uid="b", reward=0.0)])
    assert not any(f & Quality.ZERO_VARIANCE for f in Step.objects.values_list("quality_flags", flat=True))
    assert not any(f & Quality.DUPLICATE for f in Step.objects.values_list("quality_flags", flat=True))


def test_a_batch_that_ends_an_older_trajectory_refreshes_its_earlier_steps():
    # given a trajectory whose first step came in an earlier batch
    steps_ingest(steps=[step_in("two", 0, prompt=[1], response=[2], reward=1.0)])
    # (issue 18) a running trajectory's step reward is a process reward: not reward-final
    # before its branch's outcome is known
    assert bits("two:0") == Readiness.TOKENS_EXACT
    assert Step.objects.values_list("outcome_reward", "process_reward").get(uid="two:0") == (None, 1.0)
    # when a later batch ends it
    steps_ingest(steps=[step_in("two", 1, prompt=[1, 2, 3], response=[4], reward=1.0, is_last=True)])
    # then both steps are ready: the new one as written, the old one refreshed
    assert bits("two:0") == bits("two:1") == READY
    # and step 1's is the outcome, step 0's a process reward
    assert list(Step.objects.order_by("step_index").values_list("outcome_reward", "process_reward")) == [
        (1.0, 1.0),
        (1.0, None),
    ]


def test_a_reward_on_the_last_step_only_is_the_trajectorys_and_makes_every_step_ready():
    # given a group of two rollouts whose scores come on their last steps only (Claw-R1's
    # MultiStepAgentFlow: the reward is the last step's), the earlier steps unrewarded
    group_upsert(uid="g", expected_rollouts=2)
    for t, reward in (("o1", 1.0), ("o2", 0.0)):
        steps_ingest(
            steps=[
                step_in(t, 0, prompt=[1, 2], response=[3], group="g"),
                step_in(t, 1, prompt=[1, 2, 3, 4], response=[5], group="g", reward=reward, is_last=True),
            ]
        )
    # then each trajectory has its last step's reward, audited, and every step is ready
    assert dict(Trajectory.objects.values_list("uid", "reward")) == {"o1": 1.0, "o2": 0.0}
    from pool.models import RewardEvent

    audit = RewardEvent.objects.filter(trajectory__uid="o1").get()
    assert (audit.new_reward, audit.metadata) == (1.0, {"from_last_step": "o1:1"})
    assert bits("o1:0") == bits("o1:1") == bits("o2:0") == READY
    assert PromptGroup.objects.get(uid="g").ready_at is not None


def test_a_trajectory_with_every_step_rewarded_keeps_no_trajectory_reward():
    steps_ingest(
        steps=[
            step_in("all", 0, prompt=[1], response=[2], reward=0.5),
            step_in("all", 1, prompt=[1, 2, 3], response=[4], reward=1.0, is_last=True),
        ]
    )
    assert Trajectory.objects.get(uid="all").reward is None
    assert bits("all:0") == bits("all:1") == READY


# Each step's group flags once its group is ready: (rollout, its status, response of its two
# steps, reward (trajectory's, else None: its last step's), flags of its two steps). A
# rollout that did not complete repeats a response without being a duplicate of it, and is
# left out of the variance, whose flag every step of the group carries.
GROUP_FLAGS = [
    # every completed rollout rewarded 1.0 (one by its trajectory, one by its last step)
    (
        "flat",
        [
            (
                "a",
                "completed",
                ([5], [6]),
                1.0,
                (Quality.DUPLICATE | Quality.ZERO_VARIANCE, Quality.ZERO_VARIANCE),
            ),
            (
                "b",
                "completed",
                ([5], [7]),
                None,
                (Quality.DUPLICATE | Quality.ZERO_VARIANCE, Quality.ZERO_VARIANCE),
            ),
            ("c", "abandoned", ([5], [6]), None, (Quality.ZERO_VARIANCE, Quality.ZERO_VARIANCE)),
        ],
    ),
    # rewards differ: no variance flag; the same last response in two completed rollouts
    (
        "spread",
        [
            ("a", "completed", ([5], [6]), 1.0, (0, Quality.DUPLICATE)),
            ("b", "completed", ([7], [6]), 0.0, (0, Quality.DUPLICATE)),
            ("c", "failed", ([7], [8]), None, (0, 0)),
        ],
    ),
]


@pytest.mark.parametrize(("name", "rollouts"), GROUP_FLAGS, ids=[g[0] for g in GROUP_FLAGS])
def test_group_flags_are_those_of_the_completed_rollouts(name, rollouts):
    group_upsert(uid=name, expected_rollouts=len(rollouts))
    for r, status, responses, reward, _flags in rollouts:
        steps_ingest(
            steps=[
                step_in(f"{name}-{r}", i, prompt=[1, i], response=resp, group=name, reward=1.0 if i else None)
                for i, resp in enumerate(responses)
            ]
        )
        trajectories_complete(completions=[CompletionIn(uid=f"{name}-{r}", status=status, reward=reward)])
    assert PromptGroup.objects.get(uid=name).ready_at is not None
    flags = dict(Step.objects.values_list("uid", "quality_flags"))
    for r, _status, _resp, _reward, want in rollouts:
        for i, w in enumerate(want):
            assert flags[f"{name}-{r}:{i}"] & (Quality.DUPLICATE | Quality.ZERO_VARIANCE) == w, (r, i)


def test_completing_a_batch_of_groups_costs_the_same_statements_whatever_its_size():
    # given groups of 2 running rollouts of 2 rewarded steps, in batches of 2 and of 6 groups
    from tests.pool.statements import sql_statements

    counts = []
    for n in (2, 6):
        uids = []
        for g in range(n):
            group_upsert(uid=f"cb{n}-{g}", expected_rollouts=2)
            for r in range(2):
                uids.append(f"cb{n}-{g}-r{r}")
                steps_ingest(
                    steps=[
                        step_in(
                            uids[-1], i, prompt=[1, 2, i], response=[3 + r], group=f"cb{n}-{g}", reward=0.5
                        )
                        for i in range(2)
                    ]
                )
        # when one call completes them all
        with sql_statements() as seen:
            trajectories_complete(completions=[CompletionIn(uid=u) for u in uids])
        counts.append(seen)
        # then every step is ready and so is every group, and each rollout's last step (and
        # only it) is its is_last step
        assert {bits(f"{u}:{i}") for u in uids for i in range(2)} == {READY}
        assert PromptGroup.objects.filter(uid__startswith=f"cb{n}-", ready_at__isnull=False).count() == n
        assert set(
            Step.objects.filter(trajectory__uid__in=uids, is_last=True).values_list("uid", flat=True)
        ) == {f"{u}:1" for u in uids}
    # and the call costs the same statements for 2 groups as for 6: the steps' rewards and
    # readiness are one UPDATE (sql.steps_settle), the groups' merge and reward tasks one
    # outbox INSERT, the last steps' is_last set by that same UPDATE (before, each
    # group added two outbox INSERTs, each step was written twice: its rewards, then its
    # readiness bits, and is_last took two UPDATEs, then one of its own); plus one statement each for the trajectories ended, the
    # groups completed and the groups ready: the units they change, marked for the counts
    # kept per saved dataset (curation/services/counts.py; no count here: on PostgreSQL an
    # INSERT that adds no row, on SQLite the read that finds none); the groups' quality
    # flags are one UPDATE (sql.groups_quality; before, two reads and one UPDATE per value);
    # the ready groups' serving scores one read and one upsert (before, four reads and one)
    assert len(counts[0]) == len(counts[1]), (len(counts[0]), len(counts[1]))
    for seen in counts:
        settles = [s for s in seen if s.lstrip().startswith("WITH t AS")]
        outbox = [s for s in seen if "pool_outboxtask" in s]
        assert len(settles) == 1 and len(outbox) == 1, (settles, outbox)
    assert len(counts[0]) == 20, "\n".join(s[:120] for s in counts[0])
