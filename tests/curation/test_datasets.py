"""What a dataset admits follows readiness, quality, freshness, labels and grouping exactly
(curation/selectors/specs.py), one test per rule."""

from __future__ import annotations

import pytest

from curation.selectors.specs import dataset_admitted, dataset_preview
from curation.services.datasets import dataset_create, dataset_update
from curation.services.labels import steps_label
from curation.specs import spec_parse
from pool.errors import Conflict, InvalidInput
from pool.flags import Quality
from pool.ingest.pipeline import steps_ingest
from pool.models import PromptGroup, Step
from pool.services.groups import group_upsert
from pool.services.policy import policy_version_set
from pool.services.rewards import RewardIn, rewards_apply
from pool.services.trajectories import trajectory_complete
from tests.pool.factories import step_in

pytestmark = pytest.mark.django_db


def rollout(
    traj: str,
    *,
    group: str | None = None,
    steps: int = 2,
    reward: float | None = 1.0,
    version=None,
    seed=0,
    source_id: int | None = None,
    **extra,
):
    """Store a finished rollout: ``steps`` steps, each with ``reward``, the last is_last
    (through ``source_id``'s door, when given)."""
    batch = []
    prompt = [1, 2, 3, seed]
    for i in range(steps):
        last = i == steps - 1
        batch.append(
            step_in(
                traj,
                i,
                prompt=prompt,
                response=[10 + seed, 11 + i, 12],
                group=group,
                rollout_logprobs=[-0.1, -0.2, -0.3],
                policy_version=version,
                is_last=last,
                reward=reward,
                **extra,
            )
        )
        prompt = prompt + [10 + seed, 11 + i, 12, 99]
    steps_ingest(steps=batch, source_id=source_id)
    return batch


def admitted(spec: dict | None = None) -> dict[str, bool]:
    """{step uid: masked} of what ``spec`` admits."""
    got = dataset_admitted(spec_parse(spec or {}))
    uids = dict(Step.objects.filter(id__in=got).values_list("id", "uid"))
    return {uids[i]: m for i, m in got.items()}


def test_empty_filters_admit_every_ready_step_and_nothing_else():
    """README: "Empty filters admit every ready step that no operator rejected or
    quarantined." """
    steps_ingest(
        steps=[
            step_in("done", 0, prompt=[1], response=[2]),
            step_in("done", 1, prompt=[1, 2, 3], response=[4], reward=1.0, is_last=True),
        ]
    )
    rollout("unrewarded", reward=None)
    steps_ingest(steps=[step_in("running", 0, prompt=[1], response=[2], reward=1.0)])
    # "done" ended with a reward on its last step: the trajectory's outcome reward, so its
    # step 0 is ready too; "unrewarded" waits for a reward, "running" for its end
    assert admitted() == {"done:0": False, "done:1": False}
    steps_ingest(steps=[step_in("pending", 0, prompt=[1], response=[2], is_last=True)])
    assert "pending:0" not in admitted()
    rewards_apply(rewards=[RewardIn(trajectory_uid="unrewarded", reward=0.0)])
    assert set(admitted()) == {"done:0", "done:1", "unrewarded:0", "unrewarded:1"}
    # an operator's rejection or quarantine takes a ready step out (and, groups kept whole,
    # its rollout: a rollout is valid when all its steps pass)
    for label, uid in (("rejected", "done:0"), ("quarantined", "unrewarded:1")):
        steps_label(
            step_ids=Step.objects.filter(uid=uid).values_list("id", flat=True), label=label, actor="op"
        )
    assert set(admitted({"grouping": {"keep_groups_whole": False}})) == {"done:1", "unrewarded:0"}
    assert admitted() == {}


def test_a_trajectory_reward_makes_its_steps_reward_final():
    rollout("t", reward=None)
    assert admitted() == {}
    trajectory_complete(uid="t", reward=1.0)  # already completed: sets the reward
    assert set(admitted()) == {"t:0", "t:1"}


def test_a_running_trajectory_is_not_ready_until_it_completes():
    steps_ingest(steps=[step_in("r", 0, prompt=[1], response=[2], reward=1.0)])
    assert admitted() == {}
    trajectory_complete(uid="r")
    assert admitted() == {"r:0": False}


def test_retokenized_ids_only_where_the_dataset_allows_them():
    rollout("retok", token_source="retokenized")
    assert admitted() == {}
    assert set(admitted({"filters": {"allow_retokenized": True}})) == {"retok:0", "retok:1"}


def test_groups_are_served_whole_once_complete():
    group_upsert(uid="g", expected_rollouts=2)
    rollout("a", group="g", seed=1)
    assert admitted() == {}  # 1 of 2 rollouts
    assert admitted({"grouping": {"min_rollouts": 1}}) == {"a:0": False, "a:1": False}  # n per dataset
    rollout("b", group="g", seed=2)
    assert PromptGroup.objects.get(uid="g").ready_at is not None
    assert set(admitted()) == {"a:0", "a:1", "b:0", "b:1"}


def test_a_late_reward_makes_a_group_ready():
    group_upsert(uid="g", expected_rollouts=2)
    rollout("a", group="g", seed=1)
    rollout("b", group="g", seed=2, reward=None)
    group = PromptGroup.objects.get(uid="g")
    assert group.status == "complete" and group.ready_at is None
    # b's steps have no reward: the group has 1 valid rollout of 2 -> dropped
    assert admitted() == {}
    # masked instead: the group is served whole, b masked
    assert admitted({"grouping": {"short_groups": "mask"}}) == {
        "a:0": False,
        "a:1": False,
        "b:0": True,
        "b:1": True,
    }
    trajectory_complete(uid="b", reward=0.0)
    assert PromptGroup.objects.get(uid="g").ready_at is not None
    assert admitted() == dict.fromkeys(["a:0", "a:1", "b:0", "b:1"], False)


def test_a_group_with_a_rejected_rollout_is_dropped_or_masked():
    """README: "Grouping: with keep_groups_whole (the default) the group is the unit; a rollout
    is valid when all its steps pass; a complete group (or one with the dataset's
    min_rollouts valid rollouts) with at least n valid rollouts is admitted whole, its
    invalid rollouts served masked; a short group is dropped, or admitted with its bad
    rollouts masked (short_groups: mask)." """
    group_upsert(uid="g", expected_rollouts=2)
    rollout("a", group="g", seed=1)
    rollout("b", group="g", seed=2, reward=0.0)
    steps_label(
        step_ids=Step.objects.filter(uid="b:1").values_list("id", flat=True), label="rejected", actor="op"
    )
    assert admitted() == {}
    assert admitted({"grouping": {"short_groups": "mask"}})["b:0"] is True
    assert admitted({"grouping": {"min_rollouts": 1}}) == {
        "a:0": False,
        "a:1": False,
        "b:0": True,
        "b:1": True,
    }
    # unit "steps": the rejected step alone is left out
    assert set(admitted({"grouping": {"keep_groups_whole": False}})) == {"a:0", "a:1", "b:0"}


def test_freshness_is_evaluated_at_query_time_against_the_current_version():
    policy_version_set(version=1)
    rollout("old", version=1, seed=1)
    policy_version_set(version=3)
    rollout("new", version=3, seed=2)
    rollout("unversioned", seed=3)
    spec = {"filters": {"max_staleness": 1}}
    assert set(admitted(spec)) == {"new:0", "new:1"}
    before = list(Step.objects.order_by("id").values_list("updated_at", flat=True))
    policy_version_set(version=4)  # a bump rewrites no step
    assert list(Step.objects.order_by("id").values_list("updated_at", flat=True)) == before
    assert set(admitted(spec)) == {"new:0", "new:1"}
    policy_version_set(version=5)
    assert admitted(spec) == {}
    assert set(admitted({"filters": {"max_staleness": 2}})) == {"new:0", "new:1"}


def test_quality_flags_filter():
    rollout("ok", seed=1)
    rollout("cut", seed=2, finish_reason="length")
    assert set(admitted({"filters": {"exclude_flags": ["truncated"]}})) == {"ok:0", "ok:1"}
    assert set(admitted({"filters": {"require_flags": ["truncated"]}})) == {"cut:0", "cut:1"}


def test_labels_tags_and_rewards_filter():
    rollout("a", seed=1, reward=1.0)
    rollout("b", seed=2, reward=0.0)
    ids = list(Step.objects.filter(uid__startswith="a:").values_list("id", flat=True))
    steps_label(step_ids=ids, label="accepted", tags_add=["gold"], actor="op")
    assert set(admitted({"filters": {"labels": ["accepted"]}})) == {"a:0", "a:1"}
    assert set(admitted({"filters": {"tags": ["gold"]}})) == {"a:0", "a:1"}
    assert set(admitted({"filters": {"exclude_tags": ["gold"]}})) == {"b:0", "b:1"}
    # the reward range: the step's reward, else its trajectory's
    assert set(admitted({"filters": {"reward_min": 0.5}})) == {"a:0", "a:1"}
    assert set(admitted({"filters": {"reward_max": 0.5}})) == {"b:0", "b:1"}
    rollout("c", seed=3, reward=None)
    trajectory_complete(uid="c", reward=0.25)
    assert set(admitted({"filters": {"reward_min": 0.2, "reward_max": 0.3}})) == {"c:0", "c:1"}
    steps_label(step_ids=ids, label="quarantined", actor="op")
    assert set(admitted()) == {"b:0", "b:1", "c:0", "c:1"}


def test_preview_counts_what_is_admitted():
    group_upsert(uid="g", expected_rollouts=2)
    rollout("a", group="g", seed=1)
    rollout("b", group="g", seed=2, reward=None)
    p = dataset_preview(spec_parse({"grouping": {"short_groups": "mask"}}))
    assert (p["steps"], p["masked_steps"], p["trajectories"], p["groups"]) == (4, 2, 2, 1)
    assert p["response_tokens"] == 12
    p = dataset_preview(spec_parse({}))
    assert (p["steps"], p["groups"], p["dropped_groups"]) == (0, 0, 1)


def test_quality_flags_are_set_at_ingest_and_when_a_group_is_ready():
    """README: "The Messages passthrough mode cannot have them (its upstream returns neither
    ids nor logprobs): like every step stored without logprobs, its steps have
    rollout_logprobs null and the quality flag missing_logprobs." (a white-box step sent
    without logprobs; passthrough: tests/gateway/test_doors_anthropic.py)"""
    group_upsert(uid="g", expected_rollouts=2)
    rollout("a", group="g", seed=1, reward=1.0)
    steps_ingest(
        steps=[
            step_in("b", 0, prompt=[1, 2, 3, 1], response=[11, 11, 12], group="g", reward=1.0),
            step_in(
                "b", 1, prompt=[1, 2, 3, 1, 11, 11, 12, 99], response=[], group="g", is_last=True, reward=1.0
            ),
        ]
    )
    flags = dict(Step.objects.values_list("uid", "quality_flags"))
    assert flags["b:1"] & Quality.EMPTY and flags["b:1"] & Quality.MISSING_LOGPROBS
    assert not flags["a:0"] & Quality.MISSING_LOGPROBS
    # same response as a:0 ([11, 11, 12]), and every rollout rewarded 1.0
    assert flags["b:0"] & Quality.DUPLICATE and flags["a:0"] & Quality.DUPLICATE
    assert all(f & Quality.ZERO_VARIANCE for f in flags.values())


def test_datasets_are_versioned():
    ds = dataset_create(name="math", spec={"filters": {"max_staleness": 2}}, actor="op")
    assert ds.current.version == 1
    assert dataset_update(name="math", spec={"filters": {"max_staleness": 2}}).current.version == 1
    ds = dataset_update(name="math", spec={"filters": {"max_staleness": 1}}, actor="op")
    assert ds.current.version == 2 and ds.versions.count() == 2
    assert ds.versions.get(version=1).spec["filters"]["max_staleness"] == 2
    with pytest.raises(Conflict):
        dataset_create(name="math")
    with pytest.raises(InvalidInput) as err:
        dataset_create(name="x", spec={"filters": {"max_staleness": "soon"}})
    assert err.value.field == "filters.max_staleness"
