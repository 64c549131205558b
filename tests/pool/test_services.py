"""Pool services: rewards, trajectory completion and group completion (with the merge
enqueue on commit), policy versions, events/feedback and API keys."""

from __future__ import annotations

import hashlib
import json
import threading

import pytest
from django.apps import apps
from django.core import serializers
from django.db import connection, connections, transaction
from django.utils import timezone

from pool import tasks
from pool.errors import Conflict, InvalidInput, NotFound
from pool.ingest.pipeline import steps_ingest
from pool.models import (
    ApiKey,
    Event,
    Feedback,
    PolicyVersion,
    PromptGroup,
    RewardEvent,
    Scope,
    Step,
    Trajectory,
)
from pool.services.api_keys import api_key_create, api_key_verify
from pool.services.groups import group_upsert
from pool.services.policy import policy_version_set
from pool.services.rewards import RewardIn, rewards_apply
from pool.services.service_events import EventIn, event_record, feedback_create, gateway_event_record
from pool.services.trajectories import trajectory_complete, trajectory_create, trajectory_register
from tests.concurrency import lock_waiters, started, wait_for
from tests.conftest import client_for
from tests.pool.factories import pool_counts, step_in, trajectory_with_steps

pytestmark = pytest.mark.django_db


@pytest.fixture
def enqueued(monkeypatch) -> list[tuple]:
    """Records the prefix-tree merges' publications (the broker boundary: tasks.groups_merge,
    what a completion sends, and tasks.group_merge) instead of sending."""
    calls: list[tuple] = []
    for task in (tasks.groups_merge, tasks.group_merge):
        monkeypatch.setattr(
            task, "apply_async", lambda args=(), kwargs=None, **kw: calls.append((tuple(args), kwargs or {}))
        )
    return calls


# --- rewards_apply ------------------------------------------------------------------------------
def test_late_reward_makes_a_pending_step_final_and_is_audited():
    # given a pending step
    step = trajectory_with_steps("rt", 1)[0]
    assert step.reward_status == Step.RewardStatus.PENDING
    # when a late reward arrives
    events = rewards_apply(
        rewards=[RewardIn(reward=0.75, step_uid=step.uid, source="human", metadata={"a": 1})]
    )
    # then the step is final with the reward and its source, and one RewardEvent records old/new
    step.refresh_from_db()
    assert (step.reward, step.reward_status, step.reward_source) == (0.75, "final", "human")
    ev = RewardEvent.objects.get()
    assert events == [ev]
    assert (
        ev.step_id,
        ev.trajectory_id,
        ev.old_reward,
        ev.new_reward,
        ev.reward_source,
        ev.final,
        ev.metadata,
    ) == (step.id, None, None, 0.75, "human", True, {"a": 1})


def test_reapplying_the_same_reward_writes_nothing():
    # given a step with a final reward
    step = trajectory_with_steps("ri", 1)[0]
    rewards_apply(rewards=[RewardIn(reward=1.0, step_uid=step.uid)])
    stamp = Step.objects.get(id=step.id).updated_at
    # when the same reward is applied again
    again = rewards_apply(rewards=[RewardIn(reward=1.0, step_uid=step.uid)])
    # then nothing is written: no event, no update
    assert again == []
    assert RewardEvent.objects.count() == 1
    assert Step.objects.get(id=step.id).updated_at == stamp


def test_changed_reward_is_audited_with_the_old_value():
    # given a step rewarded 1.0
    step = trajectory_with_steps("rc", 1)[0]
    rewards_apply(rewards=[RewardIn(reward=1.0, step_uid=step.uid)])
    # when a different reward and then a different source arrive
    rewards_apply(rewards=[RewardIn(reward=-1.0, step_uid=step.uid, source="model")])
    rewards_apply(rewards=[RewardIn(reward=-1.0, step_uid=step.uid, source="human")])
    # then every change is one event in order, chained old -> new
    chain = list(RewardEvent.objects.order_by("id").values_list("old_reward", "new_reward", "reward_source"))
    assert chain == [(None, 1.0, "env"), (1.0, -1.0, "model"), (-1.0, -1.0, "human")]


def test_trajectory_reward_is_set_and_audited():
    # given a trajectory
    trajectory_with_steps("rtraj", 2)
    # when a trajectory reward arrives twice
    rewards_apply(rewards=[RewardIn(reward=3.0, trajectory_uid="rtraj", source="rule")])
    rewards_apply(rewards=[RewardIn(reward=3.0, trajectory_uid="rtraj", source="rule")])
    # then the trajectory holds it, one event records it and its steps are untouched
    assert Trajectory.objects.get(uid="rtraj").reward == 3.0
    ev = RewardEvent.objects.get()
    assert (ev.trajectory.uid, ev.step_id, ev.old_reward, ev.new_reward) == ("rtraj", None, None, 3.0)
    assert set(Step.objects.values_list("reward_status", flat=True)) == {"pending"}


def test_rewards_are_all_or_nothing():
    # given one stored step
    step = trajectory_with_steps("ra", 1)[0]
    # when a batch rewards it and then names a missing step
    with pytest.raises(NotFound) as exc:
        rewards_apply(
            rewards=[
                RewardIn(reward=1.0, step_uid=step.uid, field_prefix="rewards[0]."),
                RewardIn(reward=1.0, step_uid="missing", field_prefix="rewards[1]."),
            ]
        )
    # then the error names the second item and the first was rolled back
    assert exc.value.field == "rewards[1].step_uid"
    assert Step.objects.get(id=step.id).reward is None and RewardEvent.objects.count() == 0


@pytest.mark.parametrize(
    ("reward", "field"),
    [
        (RewardIn(reward=float("nan"), step_uid="x"), "reward"),
        (RewardIn(reward=float("inf"), step_uid="x"), "reward"),
        (RewardIn(reward=1.0), "step_uid"),
        (RewardIn(reward=1.0, step_uid="x", trajectory_uid="y"), "step_uid"),
        (RewardIn(reward=1.0, step_uid="x", source="oracle"), "source"),
    ],
    ids=["nan", "inf", "no-target", "two-targets", "bad-source"],
)
def test_invalid_rewards_are_rejected_before_any_write(reward, field):
    with pytest.raises(InvalidInput) as exc:
        rewards_apply(rewards=[reward])
    assert exc.value.field == field


# --- trajectory_complete and group completion ----------------------------------------------------
def test_complete_moves_is_last_to_the_last_step():
    # given a running trajectory whose is_last flag sits on a middle step
    steps = trajectory_with_steps("mv", 3)
    Step.objects.filter(id=steps[1].id).update(is_last=True)
    # when it is completed
    traj = trajectory_complete(uid="mv")
    # then exactly the last step is is_last
    assert traj.status == Trajectory.Status.COMPLETED and traj.completed_at is not None
    assert list(Step.objects.filter(trajectory=traj, is_last=True).values_list("step_index", flat=True)) == [
        2
    ]


def test_complete_with_reward_is_audited_and_idempotent():
    # given a running trajectory
    trajectory_with_steps("ca", 2)
    # when it is completed with a reward, twice
    trajectory_complete(uid="ca", reward=1.0, reward_source="rule")
    trajectory_complete(uid="ca", reward=1.0, reward_source="rule")
    # then one RewardEvent records the reward
    ev = RewardEvent.objects.get()
    assert (ev.trajectory.uid, ev.old_reward, ev.new_reward, ev.reward_source) == ("ca", None, 1.0, "rule")
    assert Trajectory.objects.get(uid="ca").reward == 1.0


def test_complete_errors():
    # given a trajectory ended as failed
    trajectory_with_steps("ce", 1)
    trajectory_complete(uid="ce", status=Trajectory.Status.FAILED)
    # then completing it as completed conflicts; unknown uids, NaN rewards and bad statuses are refused
    with pytest.raises(Conflict):
        trajectory_complete(uid="ce", status=Trajectory.Status.COMPLETED)
    with pytest.raises(NotFound) as nf:
        trajectory_complete(uid="nope")
    assert nf.value.field == "uid"
    with pytest.raises(InvalidInput):
        trajectory_complete(uid="ce", reward=float("nan"))
    with pytest.raises(InvalidInput):
        trajectory_complete(uid="ce", status="running")


def test_group_completes_when_expected_rollouts_ended_and_enqueues_the_merge(
    django_capture_on_commit_callbacks, enqueued
):
    # given a group expecting two rollouts, both running
    group = group_upsert(uid="gm", expected_rollouts=2)
    trajectory_with_steps("gm-0", 2, group="gm", seed=1)
    trajectory_with_steps("gm-1", 2, group="gm", seed=2)
    # when the first rollout ends
    with django_capture_on_commit_callbacks(execute=True):
        trajectory_complete(uid="gm-0")
    # then the group is still open and nothing was enqueued
    assert PromptGroup.objects.get(id=group.id).status == PromptGroup.Status.OPEN
    assert enqueued == []
    # when the second ends (as failed: any end counts)
    with django_capture_on_commit_callbacks(execute=True):
        trajectory_complete(uid="gm-1", status=Trajectory.Status.FAILED)
    # then the group is complete and groups_merge([group id]) was enqueued once, on commit, with JSON args
    g = PromptGroup.objects.get(id=group.id)
    assert g.status == PromptGroup.Status.COMPLETE and g.completed_at is not None
    assert enqueued == [(([group.id],), {})]
    json.dumps(enqueued[0][0])
    # and completing again enqueues nothing more
    with django_capture_on_commit_callbacks(execute=True):
        trajectory_complete(uid="gm-1", status=Trajectory.Status.FAILED)
    assert len(enqueued) == 1


def test_group_completed_by_is_last_steps_at_ingest_enqueues_the_merge(
    django_capture_on_commit_callbacks, enqueued
):
    # given a group expecting two rollouts
    group = group_upsert(uid="gi", expected_rollouts=2)
    # when one batch carries both rollouts' final steps
    with django_capture_on_commit_callbacks(execute=True):
        steps_ingest(
            steps=[
                step_in("gi-0", 0, prompt=[1, 2], response=[3], group="gi", is_last=True),
                step_in("gi-1", 0, prompt=[1, 2], response=[4], group="gi", is_last=True),
            ]
        )
    # then the group is complete and its merge enqueued once
    assert PromptGroup.objects.get(id=group.id).status == PromptGroup.Status.COMPLETE
    assert enqueued == [(([group.id],), {})]


def test_rolled_back_completion_enqueues_nothing(django_capture_on_commit_callbacks, enqueued):
    # given a group with one expected rollout
    group_upsert(uid="gr", expected_rollouts=1)
    trajectory_with_steps("gr-0", 1, group="gr")
    # when the completing transaction is rolled back
    with django_capture_on_commit_callbacks(execute=True):
        with pytest.raises(RuntimeError), transaction.atomic():
            trajectory_complete(uid="gr-0")
            raise RuntimeError("abort")
    # then no merge was enqueued and the group is still open
    assert enqueued == []
    assert PromptGroup.objects.get(uid="gr").status == PromptGroup.Status.OPEN


def test_group_upsert_with_enough_ended_rollouts_completes_it(django_capture_on_commit_callbacks, enqueued):
    # given two ended rollouts in a group without an expected count
    for i in range(2):
        trajectory_with_steps(f"gu-{i}", 1, group="gu", seed=i)
        trajectory_complete(uid=f"gu-{i}")
    assert PromptGroup.objects.get(uid="gu").status == PromptGroup.Status.OPEN
    # when the expected count is set to 2
    with django_capture_on_commit_callbacks(execute=True):
        group = group_upsert(uid="gu", expected_rollouts=2)
    # then it completes at once
    assert group.status == PromptGroup.Status.COMPLETE
    assert enqueued == [(([group.id],), {})]


def test_trajectory_create_is_idempotent():
    # given a trajectory created in a group
    t1, created1 = trajectory_create(uid="tc", prompt_group_uid="g", metadata={"a": 1})
    # when created again, and once more in another group
    t2, created2 = trajectory_create(uid="tc", prompt_group_uid="g")
    # then the same row comes back, and another group conflicts
    assert (created1, created2, t1.id) == (True, False, t2.id)
    with pytest.raises(Conflict):
        trajectory_create(uid="tc", prompt_group_uid="other")


# --- policy_version_set --------------------------------------------------------------------------
def test_exactly_one_current_policy_version():
    # given versions set current in turn, and one registered without becoming current
    for v in (1, 2, 3):
        policy_version_set(version=v)
    policy_version_set(version=4, current=False)
    # then only the last current one is current
    assert list(PolicyVersion.objects.filter(is_current=True).values_list("version", flat=True)) == [3]
    # when an older one is made current again: refused without force (nothing changes),
    # then forced (twice: idempotent)
    with pytest.raises(Conflict) as err:
        policy_version_set(version=1)
    assert err.value.field == "version"
    assert list(PolicyVersion.objects.filter(is_current=True).values_list("version", flat=True)) == [3]
    policy_version_set(version=1, force=True)
    pv = policy_version_set(version=1, metadata={"ckpt": "c1"})
    # then it alone is current and its metadata updated
    assert list(PolicyVersion.objects.filter(is_current=True).values_list("version", flat=True)) == [1]
    assert pv.is_current and PolicyVersion.objects.get(version=1).metadata == {"ckpt": "c1"}
    assert PolicyVersion.objects.count() == 4


def test_negative_policy_version_is_refused():
    with pytest.raises(InvalidInput):
        policy_version_set(version=-1)
    assert PolicyVersion.objects.count() == 0


# --- events and feedback ---------------------------------------------------------------------------
def test_events_need_existing_targets_and_are_atomic():
    # given a stored step
    step = trajectory_with_steps("et", 1)[0]
    before = pool_counts()
    # when a batch names a missing trajectory in its second event
    with pytest.raises(NotFound) as exc:
        event_record(
            events=[
                EventIn(type="a", step_uid=step.uid, field_prefix="events[0]."),
                EventIn(type="b", trajectory_uid="nope", field_prefix="events[1]."),
            ]
        )
    # then 404 names the field and nothing was stored
    assert exc.value.field == "events[1].trajectory_uid"
    assert pool_counts() == before
    # and a valid batch links its targets
    rows = event_record(events=[EventIn(type="a", step_uid=step.uid, trajectory_uid="et", payload={"x": 1})])
    assert (rows[0].step_id, rows[0].trajectory.uid, rows[0].payload) == (step.id, "et", {"x": 1})
    with pytest.raises(NotFound) as exc2:
        event_record(events=[EventIn(type="a", step_uid="missing")])
    assert exc2.value.field == "step_uid"


def test_feedback_needs_exactly_one_existing_target():
    # given a stored step
    step = trajectory_with_steps("ft", 1)[0]
    # then a missing step or trajectory is 404 naming the field, and none or both targets are invalid
    with pytest.raises(NotFound) as a:
        feedback_create(step_uid="missing")
    with pytest.raises(NotFound) as b:
        feedback_create(trajectory_uid="missing")
    assert (a.value.field, b.value.field) == ("step_uid", "trajectory_uid")
    with pytest.raises(InvalidInput):
        feedback_create()
    with pytest.raises(InvalidInput):
        feedback_create(step_uid=step.uid, trajectory_uid="ft")
    assert Feedback.objects.count() == 0
    # when valid feedback is given
    fb = feedback_create(
        step_uid=step.uid, rating=1.0, label="good", correction="c", comment="m", author="ann"
    )
    # then it is stored on the step
    assert Feedback.objects.get(id=fb.id).step_id == step.id


# --- api keys -------------------------------------------------------------------------------------
def test_api_key_is_hashed_at_rest():
    # given a new key
    row, clear = api_key_create(name="svc", scopes=[Scope.INGEST, Scope.READ])
    secret = clear.split("_", 2)[2]
    # then the row holds only its SHA-256 and the clear prefix
    assert row.key_hash == hashlib.sha256(clear.encode()).hexdigest()
    assert clear.startswith(f"claw_{row.prefix}_") and len(secret) >= 32
    # and neither the key nor its secret appears anywhere in the database
    dump = "".join(serializers.serialize("json", m.objects.all()) for m in apps.get_models())
    assert clear not in dump and secret not in dump
    with connection.cursor() as cur:  # the raw rows too, not only what the ORM shows
        cur.execute(f"SELECT * FROM {connection.ops.quote_name(ApiKey._meta.db_table)}")
        assert not any(secret in str(v) for row_ in cur.fetchall() for v in row_)


def test_api_key_verify_and_revocation():
    # given a key
    row, clear = api_key_create(name="v", scopes=[Scope.CONSUME])
    # then it verifies with its scopes, a wrong or malformed key does not
    key = api_key_verify(clear)
    assert key is not None and key.scopes == frozenset({"consume"}) and key.source_name == "v"
    assert key.has_scope("consume") and not key.has_scope("ingest")
    for bad in (clear + "x", clear[:-1], "claw_" + row.prefix, "", "nonsense", f"claw_{row.prefix}_"):
        assert api_key_verify(bad) is None, bad
    # when it is revoked
    ApiKey.objects.filter(id=row.id).update(revoked_at=timezone.now())
    # then it no longer verifies and the API answers 401
    assert api_key_verify(clear) is None
    assert client_for(clear).get("/api/v1/steps").status_code == 401


def test_admin_scope_implies_every_scope():
    _, clear = api_key_create(name="adm", scopes=[Scope.ADMIN])
    key = api_key_verify(clear)
    assert key is not None and all(key.has_scope(s) for s in Scope.values)


@pytest.mark.parametrize("scopes", [[], ["write"], ["ingest", "root"]])
def test_api_key_with_bad_scopes_is_refused(scopes):
    with pytest.raises(InvalidInput) as exc:
        api_key_create(name="bad", scopes=scopes)
    assert exc.value.field == "scopes"
    assert ApiKey.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_concurrent_policy_switches_leave_exactly_one_current():
    # given PostgreSQL (SQLite serialises writers: no race) and no current version yet
    import threading

    from django.db import connection

    from pool.models import PolicyVersion
    from pool.services.policy import policy_version_set

    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL")
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def switch(v: int) -> None:
        barrier.wait()
        policy_version_set(version=v, force=True)  # in any order: some move back

    # when four versions are made current at the same moment
    threads = [started(lambda v=v: switch(v), errors) for v in range(10, 14)]
    for t in threads:
        t.join(timeout=60)
    # then none failed and exactly one is current
    assert errors == []
    assert PolicyVersion.objects.filter(is_current=True).count() == 1


def test_a_batch_of_rewards_costs_a_constant_number_of_queries(django_assert_max_num_queries):
    # given 50 pending steps and 5 trajectories
    steps = [st for t in range(5) for st in trajectory_with_steps(f"bulk-r{t}", 10)]
    batch = [RewardIn(step_uid=st.uid, reward=0.5, source="rule") for st in steps]
    batch += [RewardIn(trajectory_uid=f"bulk-r{t}", reward=1.0) for t in range(5)]
    # when they are applied at once
    # 2 locked reads, 2 bulk updates, 1 audit insert, savepoints, and readiness: the
    # trajectories' state, one UPDATE per distinct state (here one)
    with django_assert_max_num_queries(10):
        events = rewards_apply(rewards=batch)
    # then every change is applied and audited
    assert len(events) == 55
    assert Step.objects.filter(uid__startswith="bulk-r", reward=0.5, reward_status="final").count() == 50
    assert Trajectory.objects.filter(uid__startswith="bulk-r", reward=1.0).count() == 5


# --- gateway events and Claw-R1 registration -------------------------------------------
def test_events_link_existing_trajectories_only():
    steps_ingest(steps=[step_in("ev", 0, prompt=[1, 2, 3], response=[4])])
    linked = gateway_event_record(type="upstream_error", payload={"status": 502}, trajectory_uid="ev")
    loose = gateway_event_record(type="upstream_error", payload={"status": 502}, trajectory_uid="nowhere")
    assert linked.trajectory.uid == "ev" and loose.trajectory_id is None
    assert Event.objects.get(id=loose.id).payload == {"trajectory_uid": "nowhere", "status": 502}
    assert not Trajectory.objects.filter(uid="nowhere").exists()


def test_register_merges_metadata_and_sets_the_policy_version():
    trajectory_register(uid="reg", prompt_group_uid="rg", metadata={"a": 1})
    t = trajectory_register(uid="reg", channel="val", metadata={"policy_version": 9})
    assert (t.metadata, t.channel, t.policy_version_id, t.group.uid) == (
        {"a": 1, "policy_version": 9},
        "val",
        9,
        "rg",
    )
    with pytest.raises(Conflict):
        trajectory_register(uid="reg", prompt_group_uid="another")
    with pytest.raises(InvalidInput):
        trajectory_register(uid="reg", metadata={"policy_version": "nine"})


@pytest.mark.django_db(transaction=True)
def test_two_writers_binding_one_trajectory_to_two_groups_get_one_conflict():
    # A trajectory without a group is bound by the first write that names one. A second
    # writer that read it group-less while the first was still open must not bind it again.
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL")
    trajectory_create(uid="race")
    first_holds = threading.Event()
    outcome: dict[str, BaseException | None] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                steps_ingest(steps=[step_in("race", 0, prompt=[1, 2, 3], response=[4], group="ga")])
                first_holds.set()
                # keep the binding uncommitted until the second writer waits on its row lock
                wait_for(lambda: lock_waiters() > 0, "the second writer to wait on the row lock")
            outcome["first"] = None
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["first"] = exc
            first_holds.set()
        finally:
            connections.close_all()

    def second() -> None:
        try:
            first_holds.wait(timeout=60)
            steps_ingest(steps=[step_in("race", 1, prompt=[1, 2, 3], response=[5], group="gb")])
            outcome["second"] = None
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["second"] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert outcome["first"] is None
    assert isinstance(outcome["second"], Conflict) and outcome["second"].field == "prompt_group_uid"
    assert Trajectory.objects.get(uid="race").group.uid == "ga"
    assert list(Step.objects.filter(trajectory__uid="race").values_list("step_index", flat=True)) == [0]
