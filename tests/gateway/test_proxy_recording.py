"""gateway.proxy.recording.record_call through the pool's pipeline (pool.ingest.pipeline.steps_append),
in process on the test database: step indexes, drift against the previous call (from the
in-process hint or from the pool), the fused fast path and its fallback."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.proxy import branches
from gateway.proxy.recording import ProxiedCall, ProxiedChoice
from gateway.proxy.recording import record_call as _record_call
from pool.errors import Conflict, InvalidInput
from pool.ingest.claim import recent
from pool.ingest.contract import StepIn
from pool.ingest.pipeline import steps_ingest
from pool.models import Step, Trajectory
from pool.services.rewards import RewardIn, rewards_apply
from pool.services.trajectories import trajectory_complete

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_cache():
    recent.clear()
    yield
    recent.clear()


def record(*, call: ProxiedCall):
    return _record_call(call=call, source_id=None)


def ids(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int32)


def call(traj: str, prompt: list[int], *responses: list[int], new: bool = False, **kw) -> ProxiedCall:
    return ProxiedCall(
        trajectory_uid=traj,
        token_source=Step.TokenSource.UPSTREAM,
        new_trajectory=new,
        choices=[ProxiedChoice(prompt_ids=ids(*prompt), response_ids=ids(*r)) for r in responses],
        **kw,
    )


def full(uid: str) -> list[int]:
    from pool import tokens

    s = Step.objects.get(uid=uid)
    return tokens.bytes_to_ids(tokens.load_sequences([s.id])[s.id]).tolist()


PROMPT = list(range(10, 40))  # 30 tokens: enough to be stored as a delta (MIN_SHARED_TOKENS)


@pytest.mark.parametrize("cached", [True, False])
def test_drift_is_measured_against_the_previous_call(django_capture_on_commit_callbacks, cached):
    # given: a first call, remembered in the process cache or not
    with django_capture_on_commit_callbacks(execute=cached):
        record(call=call("t", PROMPT, [1, 2, 3], new=True))

    # when: a second call that extends it and a third that rewrites position 5
    with django_capture_on_commit_callbacks(execute=cached):
        ok = record(call=call("t", [*PROMPT, 1, 2, 3, 7, 7], [4]))
    edited = [*PROMPT, 1, 2, 3, 7, 7, 4, 9]
    edited[5] = 0
    bad = record(call=call("t", edited, [5]))

    # then
    assert [(r.step_index, r.drift, r.drift_offset) for r in ok + bad] == [(1, False, None), (2, True, 5)]
    s2 = Step.objects.get(uid="t:2")
    assert (s2.drift, s2.drift_offset) == (True, 5)
    assert full("t:2") == [*edited, 5]  # stored as sent, not repaired


def test_after_n_choices_the_next_call_may_extend_any_of_them():
    # given: a call with 3 choices (recorded, cache cleared: the pool is read)
    record(call=call("n", PROMPT, [1], [2, 2], [3, 3, 3], new=True))
    recent.clear()

    # when: the next call continues choice 2
    [nxt] = record(call=call("n", [*PROMPT, 3, 3, 3, 8], [9]))

    # then: indexes 0..2 are the choices, 3 the continuation, without drift
    assert [s.step_index for s in Step.objects.filter(trajectory__uid="n").order_by("step_index")] == [
        0,
        1,
        2,
        3,
    ]
    assert [Step.objects.get(uid=f"n:{i}").metadata["choice_index"] for i in range(3)] == [0, 1, 2]
    assert (nxt.step_index, nxt.drift) == (3, False)


def test_a_stale_cache_entry_falls_back_to_the_general_path(django_capture_on_commit_callbacks):
    # given: a proxied call the process remembers, then a white-box step written around it
    with django_capture_on_commit_callbacks(execute=True):
        record(call=call("mixed", PROMPT, [1], new=True))
    steps_ingest(
        steps=[
            StepIn(
                uid="mixed:1",
                trajectory_uid="mixed",
                step_index=1,
                prompt_ids=ids(*PROMPT, 1, 6),
                response_ids=ids(2),
            )
        ]
    )

    # when: the next proxied call (the cache still believes index 1 is next)
    [rec] = record(call=call("mixed", [*PROMPT, 1, 6, 2, 5], [3]))

    # then: it takes index 2 and is checked against the white-box step
    assert (rec.step_index, rec.drift) == (2, False)
    assert Trajectory.objects.get(uid="mixed").step_count == 3
    assert full("mixed:2") == [*PROMPT, 1, 6, 2, 5, 3]


def test_the_fast_path_stores_deltas_exactly_like_steps_ingest(django_capture_on_commit_callbacks):
    # given: two turns through the proxy, the second through the cached fast path
    with django_capture_on_commit_callbacks(execute=True):
        record(call=call("delta", PROMPT, [1, 2], new=True))
    with django_capture_on_commit_callbacks(execute=True):
        record(call=call("delta", [*PROMPT, 1, 2, 3], [4]))

    # then: the second step is a delta on the first and reads back exactly
    s0, s1 = Step.objects.filter(trajectory__uid="delta").order_by("step_index")
    assert (s1.seq_parent_id, s1.seq_shared, s1.seq_depth) == (s0.id, len(PROMPT) + 2, 1)
    assert full("delta:1") == [*PROMPT, 1, 2, 3, 4]
    assert Trajectory.objects.get(uid="delta").step_count == 2


def test_policy_version_and_group_are_stamped():
    # given / when: a call naming a group and a version, then one naming neither
    record(call=call("pv", PROMPT, [1], prompt_group_uid="g", policy_version=4))
    record(call=call("pv", [*PROMPT, 1], [2]))

    # then: both steps carry the version; the trajectory is in the group
    assert list(Step.objects.filter(trajectory__uid="pv").values_list("policy_version_id", flat=True)) == [
        4,
        4,
    ]
    assert Trajectory.objects.get(uid="pv").group.uid == "g"
    with pytest.raises(Conflict):
        record(call=call("pv", PROMPT, [1], prompt_group_uid="other"))


def test_an_ended_trajectory_takes_no_more_calls(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        record(call=call("ended", PROMPT, [1], new=True))
    trajectory_complete(uid="ended", reward=1.0, reward_last_step=True)

    with pytest.raises(Conflict):
        record(call=call("ended", [*PROMPT, 1], [2]))
    last = Step.objects.get(uid="ended:0")
    assert (last.is_last, last.reward) == (True, 1.0)


def test_oversized_calls_are_refused_not_truncated(settings):
    settings.CLAW_MAX_TOKENS_PER_STEP = 31
    with pytest.raises(InvalidInput):
        record(call=call("big", PROMPT, [1, 2]))
    assert not Trajectory.objects.filter(uid="big").exists()


@pytest.mark.parametrize("new", [True, False], ids=["minted", "named"])
def test_a_call_whose_step_uid_is_taken_is_a_conflict_and_writes_nothing(new):
    # given: a white-box step that holds the uid the call's first step would get ("taken:0")
    steps_ingest(
        steps=[
            StepIn(
                uid="taken:0",
                trajectory_uid="elsewhere",
                step_index=0,
                prompt_ids=ids(*PROMPT),
                response_ids=ids(1),
            )
        ]
    )
    before = (Step.objects.count(), Trajectory.objects.count())
    # when: the trajectory's first call is recorded (fused path for a minted uid, else general)
    with pytest.raises(Conflict) as exc:
        record(call=call("taken", PROMPT, [2], new=new))
    # then: 409 naming the trajectory, and nothing written (not even the trajectory)
    assert exc.value.field == "trajectory_uid"
    assert (Step.objects.count(), Trajectory.objects.count()) == before


@pytest.mark.parametrize("cached", [True, False])
def test_branches_are_the_same_from_the_process_cache_or_the_pool(django_capture_on_commit_callbacks, cached):
    # given: a main agent's first call and a sub-agent's call (caches kept, or dropped
    # after every call so that each call reads the pool)
    branches.known.clear()

    def chat(
        messages: list[dict], prompt: list[int], text: str, response: list[int], new: bool = False
    ) -> None:
        choice = ProxiedChoice(prompt_ids=ids(*prompt), response_ids=ids(*response), response_text=text)
        c = ProxiedCall(
            trajectory_uid="b",
            token_source="upstream",
            new_trajectory=new,
            messages=messages,
            choices=[choice],
        )
        with django_capture_on_commit_callbacks(execute=cached):
            record(call=c)
        if not cached:
            recent.clear()
            branches.known.clear()

    main = [{"role": "user", "content": "main"}]
    chat(main, PROMPT, "r0", [1, 2, 3], new=True)
    chat([{"role": "user", "content": "sub"}], [7, 7, 7], "r1", [4])

    # when: the main agent resumes (its reply echoed with an SDK's extra null field), then
    # rewrites its last user message
    chat(
        [*main, {"role": "assistant", "content": "r0", "refusal": None}, {"role": "user", "content": "more"}],
        [*PROMPT, 1, 2, 3, 9],
        "r2",
        [5],
    )
    chat(
        [*main, {"role": "assistant", "content": "r0"}, {"role": "user", "content": "MORE"}],
        [*PROMPT, 1, 2, 3, 8],
        "r3",
        [6],
    )

    # then: sub-agent = branch 1 off step 0; the resumed call continues branch 0 off step 0
    # (its tokens checked against step 0: no drift); the rewrite is branch 2 off step 2
    rows = Step.objects.filter(trajectory__uid="b").order_by("step_index")
    assert [(s.branch, s.parent_step.uid if s.parent_step else None, s.drift) for s in rows] == [
        (0, None, False),
        (1, "b:0", False),
        (0, "b:0", False),
        (2, "b:2", False),
    ]
    assert rows[3].metadata["branched_after_messages"] == 2


def test_a_trajectory_reward_reaches_every_branch_end_without_its_own(django_capture_on_commit_callbacks):
    """README: "A completion that gives the reward to the last step (Claw-R1's
    complete_trajectory) gives it to the last step of every branch that has no reward yet." """
    # given: a main agent (steps 0 and 3 on branch 0), a sub-agent (steps 1 and 2 on branch 1,
    # step 2 rewarded on its own) and a compaction (step 4, branch 2)
    branches.known.clear()

    def chat(messages: list[dict], prompt: list[int], response: list[int], new: bool = False) -> None:
        choice = ProxiedChoice(prompt_ids=ids(*prompt), response_ids=ids(*response), response_text="r")
        c = ProxiedCall(
            trajectory_uid="rb",
            token_source="upstream",
            new_trajectory=new,
            messages=messages,
            choices=[choice],
        )
        with django_capture_on_commit_callbacks(execute=True):
            record(call=c)

    main = [{"role": "user", "content": "main"}]
    chat(main, PROMPT, [1], new=True)
    sub = [{"role": "user", "content": "sub"}]
    chat(sub, [7, 7], [2])
    chat([*sub, {"role": "assistant", "content": "r"}, {"role": "user", "content": "go"}], [7, 7, 2, 8], [3])
    chat(
        [*main, {"role": "assistant", "content": "r"}, {"role": "user", "content": "more"}],
        [*PROMPT, 1, 9],
        [4],
    )
    chat([{"role": "user", "content": "summary"}], [5, 5], [6])
    steps = {s.step_index: s for s in Step.objects.filter(trajectory__uid="rb")}
    assert [steps[i].branch for i in range(5)] == [0, 1, 1, 0, 2]
    rewards_apply(rewards=[RewardIn(reward=0.25, step_uid=steps[2].uid)])

    # when: the trajectory completes with a reward for its last step (Claw-R1's way)
    trajectory_complete(uid="rb", reward=1.0, reward_last_step=True)

    # then: the last step of each branch has it, but the sub-agent's own reward stands, and
    # steps inside a branch get none of their own
    got = dict(Step.objects.filter(trajectory__uid="rb").values_list("step_index", "reward"))
    assert got == {0: None, 1: None, 2: 0.25, 3: 1.0, 4: 1.0}
