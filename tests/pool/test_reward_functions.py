"""Rewards the pool computes itself (pool/rewards/, pool/services/reward_compute.py): the
built-in functions one by one, then through the tasks that completion enqueues on commit,
the LLM judge against the demo upstream, and failures isolated per rollout."""

from __future__ import annotations

import json

import pytest

from claw_site.demo import upstream as demo
from pool import tasks
from pool.errors import Unprocessable
from pool.flags import READY, Readiness
from pool.generation_texts import generation_text_remember
from pool.ingest.pipeline import steps_ingest
from pool.models import PromptGroup, RewardEvent, RewardFailure, RewardFunction, Step, Trajectory
from pool.rewards import RewardError, RewardSample, builtin, judge
from pool.services.groups import group_upsert
from pool.services.reward_compute import sample_reward_compute
from pool.services.trajectories import trajectory_complete
from tests.gateway.conftest import demo_upstream  # noqa: F401 - the session fixture
from tests.live import refused_port
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db(transaction=False)


def sample(text: str, truth=None, source: str = "gsm8k") -> RewardSample:
    return RewardSample(data_source=source, response_text=text, ground_truth=truth)


def explode(sample: RewardSample) -> float:
    """A reward function that always fails (registered by dotted path in a test)."""
    raise RuntimeError(f"cannot score {sample.response_text!r}")


# --- the built-in functions ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "truth", "score"),
    [
        ("6 * 7 = 42.\n#### 42", "42", 1.0),
        ("#### 1,000.0", "1000", 1.0),
        ("#### $1,234.50", "1234.5", 1.0),
        ("first #### 7 then corrected #### 42", 42, 1.0),
        ("#### 41", "42", 0.0),
        ("The answer is 42.", "42", 0.0),
        ("#### 42", "She had 6*7=<<6*7=42>>42 apples.\n#### 42", 1.0),
        ("#### -3", "-3.0", 1.0),
    ],
)
def test_gsm8k_compares_the_number_after_the_last_hashes(text, truth, score):
    assert builtin.gsm8k(sample(text, truth)).score == score


@pytest.mark.parametrize(
    ("text", "truth", "score"),
    [("4", "4", 1.0), (" 4\n", 4, 1.0), ("4", "5", 0.0), ("The answer is 4", "4", 0.0), ("", "4", 0.0)],
)
def test_exact_match_compares_the_stripped_text(text, truth, score):
    result = builtin.exact_match(sample(text, truth, source="exact"))
    assert (result.score, result.info["extracted"], result.info["ground_truth"]) == (
        score,
        text.strip(),
        str(truth),
    )
    with pytest.raises(RewardError, match="ground truth"):
        builtin.exact_match(sample(text, None, source="exact"))


def test_gsm8k_without_a_usable_ground_truth_is_an_error():
    with pytest.raises(RewardError, match="ground truth"):
        builtin.gsm8k(sample("#### 1", None))
    with pytest.raises(RewardError, match="not a number"):
        builtin.gsm8k(sample("#### 1", "forty-two"))


@pytest.mark.parametrize(
    ("text", "truth", "score"),
    [
        (r"So \boxed{\frac{1}{2}}.", r"\dfrac{1}{2}", 1.0),
        (r"\boxed{x^{2}+\left(y\right)}", r"x^{2} + (y)", 1.0),
        (r"first \boxed{3} then \boxed{ 4 }", "4", 1.0),
        (r"\boxed{0.50}", r"\boxed{0.5}", 1.0),
        (r"\boxed{\text{yes}}", "yes", 1.0),
        (r"\boxed{\frac{1}{3}}", r"\frac{1}{2}", 0.0),
        ("no box here: 4", "4", 0.0),
        (r"\boxed{unclosed", "4", 0.0),
    ],
)
def test_math_boxed_matches_the_last_boxed_answer_with_nested_braces(text, truth, score):
    assert builtin.math_boxed(sample(text, truth, "math")).score == score


def test_last_boxed_balances_nested_braces():
    assert builtin.last_boxed(r"\boxed{a{b{c}}d} tail") == "a{b{c}}d"
    assert builtin.last_boxed(r"\fbox{1}") == "1"
    assert builtin.last_boxed("none") is None


def test_judge_scores_parse_fenced_json_and_require_every_rollout():
    content = '```json\n{"scores": [{"trajectory_id": "2", "score": 1.5}, {"trajectory_id": "1", "score": 0.25, "explanation": "meh"}]}\n```'
    assert judge.parse_scores(content, ["1", "2"]) == [(0.25, "meh"), (1.0, "")]
    with pytest.raises(RewardError, match="rollout"):
        judge.parse_scores('{"scores": [{"trajectory_id": "1", "score": 1}]}', ["1", "2"])
    with pytest.raises(RewardError, match="scores JSON"):
        judge.parse_scores("I think the first one is better.", ["1"])


def test_the_demo_upstream_knows_the_judge_marker():
    assert demo.JUDGE_MARKER == judge.JUDGE_MARKER and judge.SYSTEM_PROMPT.startswith(judge.JUDGE_MARKER)


def test_the_judge_scores_a_group_relative_to_each_other_through_the_upstream(settings, demo_upstream):  # noqa: F811
    # given the configured upstream is the demo one, which answers judge prompts deterministically
    settings.CLAW_UPSTREAM_URL = demo_upstream
    rollouts = [
        sample("It is 42.", "42", "judge"),
        sample("Maybe 41?", "42", "judge"),
        sample("42!", "42", "judge"),
    ]
    # when
    results = judge.ruler(rollouts)
    # then
    assert [r.score for r in results] == [1.0, 0.0, 1.0]
    assert results[1].info["explanation"] == "does not match the reference"
    # and without a reference, the demo judge prefers the longer rollout
    free = judge.ruler([sample("short", None, "judge"), sample("much longer answer", None, "judge")])
    assert [r.score for r in free] == [round(5 / 18, 3), 1.0]


def test_a_judge_that_cannot_reach_the_upstream_raises_a_reward_error(settings):
    with refused_port() as port:
        settings.CLAW_UPSTREAM_URL = f"http://127.0.0.1:{port}/v1"
        with pytest.raises(RewardError, match="judge call failed: cannot connect"):
            judge.ruler([sample("x", None, "judge")])


# --- through the service --------------------------------------------------------------------
def test_sample_reward_compute_uses_the_data_source_function():
    result, resolved = sample_reward_compute(
        data_source="openai/gsm8k", response_text="#### 42", ground_truth="42"
    )
    assert (result.score, resolved.path) == (1.0, "pool.rewards.builtin.gsm8k")
    with pytest.raises(Unprocessable, match="no reward function") as e:
        sample_reward_compute(data_source="nope", response_text="x", field="dataset_fields.data_source")
    assert e.value.field == "dataset_fields.data_source"


def test_admin_rows_override_settings_and_a_disabled_row_switches_a_name_off():
    RewardFunction.objects.create(name="gsm8k", path="pool.rewards.builtin.math_boxed")
    result, resolved = sample_reward_compute(
        data_source="gsm8k", response_text=r"\boxed{42}", ground_truth="42"
    )
    assert (result.score, resolved.path) == (1.0, "pool.rewards.builtin.math_boxed")
    RewardFunction.objects.filter(name="gsm8k").update(enabled=False)
    with pytest.raises(Unprocessable, match="no reward function"):
        sample_reward_compute(data_source="gsm8k", response_text="#### 42", ground_truth="42")


class Recorder:
    """Stands in for Task.apply_async (the broker boundary): records the task's arguments."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, args=(), kwargs=None, **options):
        self.calls.append(tuple(args))


@pytest.fixture
def enqueued(monkeypatch):
    """The reward tasks enqueued on commit, recorded instead of sent."""
    sent = {"trajectory": Recorder(), "group": Recorder()}
    monkeypatch.setattr(tasks.trajectory_rewards_compute, "apply_async", sent["trajectory"])
    monkeypatch.setattr(tasks.groups_rewards_compute, "apply_async", sent["group"])
    monkeypatch.setattr(tasks.groups_merge, "apply_async", Recorder())
    return sent


def run(task, calls: list[tuple]) -> list:
    """Run recorded task calls as a worker would (JSON round-tripped arguments)."""
    return [task.apply(args=json.loads(json.dumps(list(c)))).get() for c in calls]


def rollout(
    traj: str, text: str | None, *, meta: dict, group: str | None = None, reward=None, n: int = 2
) -> None:
    """Store a trajectory of ``n`` steps; the last one (is_last) carries ``text`` and ``meta``."""
    steps = [
        step_in(
            traj, i, prompt=[1, 2, 3, *range(10, 10 + 4 * i)], response=[40 + i, 50 + i, 60 + i], group=group
        )
        for i in range(n)
    ]
    steps[-1].is_last = True
    steps[-1].response_text = text
    steps[-1].metadata = meta
    steps[-1].reward = reward
    steps_ingest(steps=steps, source_id=None)


GSM8K = {"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "42", "style": "rule"}}


def test_a_completed_trajectory_gets_its_rule_reward_audited_final_and_ready(
    enqueued, django_capture_on_commit_callbacks
):
    # given a trajectory whose last step names gsm8k and arrives without a reward
    with django_capture_on_commit_callbacks(execute=True):
        rollout("r-ok", "6 * 7 = 42\n#### 42", meta=GSM8K)
    traj = Trajectory.objects.get(uid="r-ok")
    # then its reward task was enqueued on commit
    assert enqueued["trajectory"].calls == [(traj.id,)]
    assert Step.objects.get(uid="r-ok:1").reward_status == Step.RewardStatus.PENDING
    # when a worker runs it
    [counts] = run(tasks.trajectory_rewards_compute, enqueued["trajectory"].calls)
    # then the last step and the trajectory have the reward, final, from a rule, audited
    assert counts == {"rewarded": 1, "failed": 0, "skipped": 0}
    last = Step.objects.get(uid="r-ok:1")
    assert (last.reward, last.reward_status, last.reward_source) == (1.0, "final", "rule")
    traj.refresh_from_db()
    assert traj.reward == 1.0
    events = RewardEvent.objects.filter(reward_source="rule").order_by("id")
    assert len(events) == 2 and {e.metadata["function"] for e in events} == {"pool.rewards.builtin.gsm8k"}
    assert events[0].metadata["info"]["extracted"] == "42"
    # and every step of the trajectory is ready (the trajectory reward makes the rewards final)
    assert all(s.readiness == READY for s in Step.objects.filter(trajectory=traj))
    # when the task runs again, nothing changes (idempotent)
    assert run(tasks.trajectory_rewards_compute, enqueued["trajectory"].calls) == [
        {"rewarded": 0, "failed": 0, "skipped": 0}
    ]
    assert RewardEvent.objects.count() == 2


def test_a_trajectory_with_its_own_reward_or_without_a_data_source_is_left_alone(
    enqueued, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        rollout("r-own", "#### 41", meta=GSM8K, reward=0.5)
        rollout("r-none", "#### 42", meta={})
    assert [Trajectory.objects.get(id=c[0]).uid for c in enqueued["trajectory"].calls] == ["r-none"]
    assert run(tasks.trajectory_rewards_compute, enqueued["trajectory"].calls) == [
        {"rewarded": 0, "failed": 0, "skipped": 1}
    ]
    assert Step.objects.get(uid="r-own:1").reward == 0.5
    assert not RewardEvent.objects.filter(reward_source="rule").exists()


def test_completion_without_a_reward_enqueues_the_task_and_the_text_comes_from_generate(
    enqueued, django_capture_on_commit_callbacks, make_key
):
    # given a step without text whose response ids the source generated through /generate
    from pool.models import ApiKey

    make_key("ingest")
    source_id = ApiKey.objects.get().source_id
    steps = [step_in("r-gen", 0, prompt=[1, 2, 3], response=[70, 71, 72], metadata=GSM8K)]
    steps_ingest(steps=steps, source_id=source_id)
    generation_text_remember(source_id=source_id, response_ids=[70, 71, 72], text="It is 42.\n#### 42")
    # when the trajectory is completed explicitly (no reward)
    with django_capture_on_commit_callbacks(execute=True):
        trajectory_complete(uid="r-gen")
    # then the task scores the remembered text
    assert len(enqueued["trajectory"].calls) == 1
    assert run(tasks.trajectory_rewards_compute, enqueued["trajectory"].calls)[0]["rewarded"] == 1
    assert Step.objects.get(uid="r-gen:0").reward == 1.0


def test_a_failing_function_is_recorded_and_never_blocks_other_rollouts(
    enqueued, django_capture_on_commit_callbacks
):
    # given a data source whose function raises, one whose text is unknown, and a good one
    RewardFunction.objects.create(name="boom", path="tests.pool.test_reward_functions.explode")
    with django_capture_on_commit_callbacks(execute=True):
        rollout("r-boom", "#### 42", meta={"data_source": "boom"})
        rollout("r-notext", None, meta=GSM8K)
        rollout("r-good", "#### 42", meta=GSM8K)
    # when the tasks run
    results = run(tasks.trajectory_rewards_compute, enqueued["trajectory"].calls)
    # then the good one is rewarded, the others are recorded as failures with their error
    assert [r["rewarded"] for r in results] == [0, 0, 1]
    assert Step.objects.get(uid="r-good:1").reward == 1.0
    failures = {f.trajectory.uid: f for f in RewardFailure.objects.select_related("trajectory", "step")}
    assert set(failures) == {"r-boom", "r-notext"}
    assert failures["r-boom"].error == "RuntimeError: cannot score '#### 42'"
    assert failures["r-boom"].step.uid == "r-boom:1" and failures["r-boom"].function.endswith(".explode")
    assert failures["r-notext"].error.startswith("response text unknown")
    # and the failed rollouts stay pending (not ready)
    assert not Step.objects.get(uid="r-boom:1").readiness & Readiness.REWARD_FINAL
    # when the function is fixed and the task retried, the failure is replaced by the reward
    RewardFunction.objects.filter(name="boom").update(path="pool.rewards.builtin.gsm8k")
    Trajectory.objects.filter(uid="r-boom").update(metadata={})
    Step.objects.filter(uid="r-boom:1").update(metadata={**GSM8K, "data_source": "boom"})
    run(tasks.trajectory_rewards_compute, [enqueued["trajectory"].calls[0]])
    assert Step.objects.get(uid="r-boom:1").reward == 1.0
    assert set(RewardFailure.objects.values_list("trajectory__uid", flat=True)) == {"r-notext"}
    # and a repeated failure counts its attempts
    run(tasks.trajectory_rewards_compute, [enqueued["trajectory"].calls[1]])
    assert RewardFailure.objects.get().attempts == 2


def test_a_group_is_judged_together_on_completion_audited_and_ready(
    settings,
    enqueued,
    django_capture_on_commit_callbacks,
    demo_upstream,  # noqa: F811
):
    # given a group of 3 rollouts of the "judge" dataset with a reference answer
    settings.CLAW_UPSTREAM_URL = demo_upstream
    group_upsert(uid="gj", expected_rollouts=3, dataset="judge", ground_truth="42")
    texts = {"gj-0": "It is 42.", "gj-1": "I guess 41.", "gj-2": "42, clearly."}
    with django_capture_on_commit_callbacks(execute=True):
        for uid, text in list(texts.items())[:2]:
            rollout(uid, text, meta={}, group="gj")
    assert enqueued["group"].calls == []  # not complete yet
    # the per-trajectory tasks leave group functions to the group's task
    assert (
        run(tasks.trajectory_rewards_compute, enqueued["trajectory"].calls)
        == [{"rewarded": 0, "failed": 0, "skipped": 1}] * 2
    )
    # when the last rollout completes the group
    with django_capture_on_commit_callbacks(execute=True):
        rollout("gj-2", texts["gj-2"], meta={}, group="gj")
    group = PromptGroup.objects.get(uid="gj")
    assert enqueued["group"].calls == [([group.id],)]
    [[counts]] = run(tasks.groups_rewards_compute, enqueued["group"].calls)
    # then every rollout is scored in one judge call, relative to the others, as "model" rewards
    assert counts == {"rewarded": 3, "failed": 0, "skipped": 0}
    rewards = {
        s.trajectory.uid: (s.reward, s.reward_source)
        for s in Step.objects.filter(is_last=True).select_related("trajectory")
    }
    assert rewards == {"gj-0": (1.0, "model"), "gj-1": (0.0, "model"), "gj-2": (1.0, "model")}
    assert RewardEvent.objects.filter(reward_source="model", final=True).count() == 6
    assert RewardEvent.objects.filter(step__uid="gj-1:1").get().metadata["info"]["judge"] == "ruler"
    # and the group is ready, every step trainable
    group.refresh_from_db()
    assert group.ready_at is not None
    assert set(Step.objects.filter(trajectory__group=group).values_list("readiness", flat=True)) == {READY}
    # when the group task runs again, nothing changes
    assert run(tasks.groups_rewards_compute, enqueued["group"].calls)[0][0]["rewarded"] == 0


def test_a_judge_fault_marks_the_group_rollouts_as_failed(
    settings, enqueued, django_capture_on_commit_callbacks
):
    with refused_port() as port:
        settings.CLAW_UPSTREAM_URL = f"http://127.0.0.1:{port}"
        group_upsert(uid="gf", expected_rollouts=2, dataset="judge")
        with django_capture_on_commit_callbacks(execute=True):
            rollout("gf-0", "a", meta={}, group="gf")
            rollout("gf-1", "b", meta={}, group="gf")
        [[counts]] = run(tasks.groups_rewards_compute, enqueued["group"].calls)
    assert counts == {"rewarded": 0, "failed": 2, "skipped": 0}
    assert {f.error for f in RewardFailure.objects.all()} == {
        "judge call failed: cannot connect to the upstream inference server"
    }
    assert PromptGroup.objects.get(uid="gf").ready_at is None


def test_a_vanished_trajectory_or_group_is_a_no_op():
    assert tasks.trajectory_rewards_compute.apply(args=[987654]).get() == {
        "rewarded": 0,
        "failed": 0,
        "skipped": 0,
    }
    assert tasks.group_rewards_compute.apply(args=[987654]).get() == {
        "rewarded": 0,
        "failed": 0,
        "skipped": 0,
    }


def test_the_admin_lists_failures_and_refuses_a_reward_function_that_does_not_import(
    client, django_user_model
):
    # given a recorded failure and an admin
    RewardFunction.objects.create(name="boom", path="tests.pool.test_reward_functions.explode")
    rollout("r-adm", "#### 42", meta={"data_source": "boom"})
    tasks.trajectory_rewards_compute.apply(args=[Trajectory.objects.get(uid="r-adm").id]).get()
    client.force_login(django_user_model.objects.create_superuser("root", "", "pw-long-enough-1"))
    # then the failure list shows the error
    page = client.get("/admin/pool/rewardfailure/")
    assert page.status_code == 200 and "cannot score" in page.content.decode()
    assert client.get("/admin/pool/rewardfunction/").status_code == 200
    # and a function path that does not import is refused by the form, naming it
    resp = client.post(
        "/admin/pool/rewardfunction/add/",
        {"name": "bad", "path": "pool.rewards.builtin.nope", "enabled": "on"},
    )
    assert resp.status_code == 200 and "cannot be imported" in resp.content.decode()
    assert not RewardFunction.objects.filter(name="bad").exists()
    resp = client.post(
        "/admin/pool/rewardfunction/add/",
        {"name": "ok", "path": "pool.rewards.builtin.math_boxed", "enabled": "on"},
    )
    assert resp.status_code == 302 and RewardFunction.objects.filter(name="ok").exists()
